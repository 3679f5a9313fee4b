//! A server that crashes once, measured from its restart.

use super::*;

/// A server that exits once its model is read, the first time: the kubelet restarts it, and the
/// agent measures the one startup that turned Ready, from the first container's exit, with no
/// scheduling phase.
#[test]
fn a_server_that_crashes_once_is_measured_from_its_restart() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let image = on.overlay().image.as_str();
    let mut pod = workload_pod("crashes-once", image, &model_on_node(), 0);
    let container = &mut pod["spec"]["containers"][0];
    container["args"]
        .as_array_mut()
        .unwrap()
        .extend([json!("--crash-once"), json!("/scratch/crashed")]);
    container["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "scratch", "mountPath": "/scratch"}));
    pod["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "scratch", "emptyDir": {}}));
    let ready = create_and_await_ready(cluster, namespace, &pod);
    let status = &ready["status"]["containerStatuses"][0];
    assert_eq!(status["restartCount"], 1, "{status}");
    let startups = await_agent_startups(cluster, agent_pod, namespace, "crashes-once", 1);
    assert_eq!(startups.len(), 1, "one startup turned Ready: {startups:?}");
    let startup = &startups[0];
    assert_eq!(startup["restarts"], 1, "{startup}");
    assert!(startup["phases"]["scheduling"].is_null(), "{startup}");
    assert!(startup["phases"]["model_load"].is_number(), "{startup}");
    let exited = seconds(
        status["lastState"]["terminated"]["finishedAt"]
            .as_str()
            .unwrap(),
    );
    let ready_at = seconds(
        testbed::cluster::control_plane::condition(&ready, "Ready")["lastTransitionTime"]
            .as_str()
            .unwrap(),
    );
    assert!(
        (startup["total_seconds"].as_f64().unwrap() - (ready_at - exited)).abs() <= 1.0,
        "measured from the first container's exit: {startup}"
    );
}
