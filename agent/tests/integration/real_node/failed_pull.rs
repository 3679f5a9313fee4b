//! A pull that fails, backs off and then succeeds.

use super::*;

/// An image pushed only after its pod asked for it: the kubelet's pull fails (`ErrImagePull`),
/// backs off and then succeeds; the agent counts the successful pull's time alone in
/// `image_pull`, the back-off in the total.
#[test]
fn a_pull_that_fails_then_succeeds_counts_the_pull_alone() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let image = format!("{REGISTRY}/workload:late");
    let pod = workload_pod("late-image", &image, &model_on_node(), 0);
    cluster
        .admin
        .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
    testbed::wait_until("the kubelet's failed pull", Duration::from_secs(60), || {
        let events = events_of(cluster, namespace, "late-image");
        events
            .iter()
            .any(|e| {
                e["reason"] == "Failed" && e["message"].as_str().unwrap().contains("ErrImagePull")
            })
            .then_some(())
            .ok_or_else(|| format!("{events:#?}"))
    });
    let programs = cluster.runtime.programs().to_path_buf();
    cluster
        .runtime
        .push_image("workload:late", &[&programs.join("workload")], "/workload");
    await_pod_ready(cluster, namespace, "late-image");
    let startup = await_agent_startups(cluster, agent_pod, namespace, "late-image", 1).remove(0);
    let events = events_of(cluster, namespace, "late-image");
    let pulled: Vec<&Value> = events.iter().filter(|e| e["reason"] == "Pulled").collect();
    assert_eq!(pulled.len(), 1, "{events:#?}");
    let message = pulled[0]["message"].as_str().unwrap();
    let kubelet_pull = pull_seconds(message);
    assert_eq!(startup["pulls"].as_array().unwrap().len(), 1, "{startup}");
    assert!(
        (startup["phases"]["image_pull"].as_f64().unwrap() - kubelet_pull).abs() < 1e-6,
        "{startup} against {message}"
    );
    assert!(
        startup["total_seconds"].as_f64().unwrap() > kubelet_pull + 1.0,
        "the back-off is in the total: {startup}"
    );
}
