//! The model's readiness gate, folded into Ready by the kubelet.

use super::*;

/// A pod with the model's readiness gate: the kubelet's `Ready` turns True only once the agent's
/// gate condition is, and False when the model no longer verifies; the kubelet's own
/// `ContainersReady` stays True throughout, and the agent's condition is left as it wrote it.
#[test]
fn the_kubelet_folds_the_agents_gate_into_ready() {
    let mut on = testbed::needs!(on_overlay());
    let (cluster, namespace) = (on.cluster, on.namespace());
    let overlay = on.overlay();
    let mut pod = workload_pod("gated", &overlay.image, &model_on_node(), 0);
    pod["metadata"]["annotations"] = json!({"mlnode.dev/model": "llama-3.1-8b"});
    pod["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    cluster
        .admin
        .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
    let ready = await_pod_ready(cluster, namespace, "gated");
    let gate = testbed::cluster::control_plane::condition(&ready, GATE);
    assert_eq!(gate["status"], "True", "{gate}");
    let transition = |condition: &Value| seconds(condition["lastTransitionTime"].as_str().unwrap());
    assert!(
        transition(&testbed::cluster::control_plane::condition(&ready, "Ready"))
            >= transition(&gate),
        "Ready turned True no earlier than the agent's gate: {:#}",
        ready["status"]["conditions"]
    );

    // A weight file rewritten: the agent re-verifies it and turns the gate False; the kubelet
    // folds that into Ready, the container still running and ready.
    let shard = overlay.on_node.join("model-00001-of-00002.safetensors");
    let original = std::fs::read(&shard).unwrap();
    let mut corrupt = original.clone();
    corrupt[0] ^= 0xff;
    std::fs::write(&shard, &corrupt).unwrap();
    let unready = testbed::wait_until(
        "the kubelet's Ready False on the agent's gate",
        Duration::from_secs(60),
        || {
            let pod = cluster.admin.get(&["pod", "-n", namespace, "gated"]);
            let ready = testbed::cluster::control_plane::condition(&pod, "Ready");
            (ready["status"] == "False")
                .then(|| pod.clone())
                .ok_or_else(|| format!("{:#}", pod["status"]["conditions"]))
        },
    );
    assert_eq!(
        testbed::cluster::control_plane::condition(&unready, GATE)["status"],
        "False"
    );
    assert_eq!(
        testbed::cluster::control_plane::condition(&unready, "ContainersReady")["status"],
        "True",
        "the agent leaves the kubelet's conditions alone"
    );
    std::fs::write(&shard, &original).unwrap();
    let ready = await_pod_ready(cluster, namespace, "gated");
    assert_eq!(
        testbed::cluster::control_plane::condition(&ready, GATE)["status"],
        "True"
    );
    // The weights were written again: a restarted agent would now hash the file the agent last
    // verified within the racy window, which the rollout scenario must not meet. The next
    // scenario installs the overlay afresh.
    on.node.remove();
}

/// The pod readiness gate the agent keeps for a pod's model.
const GATE: &str = "mlnode.dev/ModelVerified";
