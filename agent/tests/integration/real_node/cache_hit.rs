//! A second pod on an image the node holds.

use super::*;

/// A second pod on an image the node holds: the kubelet's "already present" event, counted by
/// the agent as a cache hit of no pull time.
#[test]
fn a_second_pod_on_the_image_is_a_cache_hit() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let image = on.overlay().image.as_str();
    let pod = workload_pod(
        "server-2",
        image,
        std::path::Path::new("/var/lib/models/llama-3.1-8b"),
        0,
    );
    cluster
        .admin
        .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
    await_pod_ready(cluster, namespace, "server-2");
    let startup = await_agent_startups(cluster, agent_pod, namespace, "server-2", 1).remove(0);
    assert_eq!(startup["phases"]["image_pull"], 0.0, "{startup}");
    assert_eq!(startup["pulls"][0]["cache_hit"], true, "{startup}");
    assert!(
        events_of(cluster, namespace, "server-2")
            .iter()
            .any(|e| e["reason"] == "Pulled"
                && e["message"]
                    .as_str()
                    .unwrap()
                    .contains("already present on machine")),
        "the kubelet found the image on the node"
    );
}
