//! Init containers and a sidecar pulled beside the server.

use super::*;

/// A pod with an init container that reads the model first and a sidecar (an init container that
/// runs on, `restartPolicy: Always`): each container's `Pulled` event counts in the pulls, the
/// phases follow the main container.
#[test]
fn an_init_container_and_a_sidecar_pull_beside_the_server() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let image = on.overlay().image.as_str();
    let mut pod = workload_pod("with-init", image, &model_on_node(), 0);
    let main = pod["spec"]["containers"][0].clone();
    let mut fetch = main.clone();
    fetch["name"] = json!("fetch");
    fetch["args"] = json!(["--model", "/model", "--exit-after-load"]);
    fetch.as_object_mut().unwrap().remove("readinessProbe");
    fetch.as_object_mut().unwrap().remove("ports");
    let mut sidecar = fetch.clone();
    sidecar["name"] = json!("proxy");
    sidecar["args"] = json!(["--listen", "0.0.0.0:9000"]);
    sidecar["restartPolicy"] = json!("Always");
    sidecar.as_object_mut().unwrap().remove("volumeMounts");
    pod["spec"]["initContainers"] = json!([fetch, sidecar]);
    create_and_await_ready(cluster, namespace, &pod);
    let startup = await_agent_startups(cluster, agent_pod, namespace, "with-init", 1).remove(0);
    let pulls = startup["pulls"].as_array().unwrap();
    assert_eq!(
        pulls.len(),
        3,
        "the init container's, the sidecar's, the server's: {startup}"
    );
    assert!(pulls.iter().all(|p| p["cache_hit"] == true), "{startup}");
    for phase in ["container_start", "model_load", "readiness"] {
        assert!(startup["phases"][phase].is_number(), "{phase}: {startup}");
    }
}
