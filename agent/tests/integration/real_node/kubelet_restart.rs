//! The kubelet stopped and started again under the running agent.

use super::*;

/// The kubelet killed: the node lifecycle controller marks the node's own conditions Unknown and
/// taints it unreachable, and leaves the agent's conditions as they are; started again, the
/// kubelet finds the agent and the pods running, the node Ready, and the agent reports no startup
/// a second time.
#[test]
fn a_stopped_kubelet_leaves_the_agents_conditions_and_a_restart_reports_nothing_twice() {
    let on = testbed::needs!(on_overlay());
    let (cluster, namespace) = (on.cluster, on.namespace());
    let agent = &await_agent_pod(cluster, None);
    let agent_pod = agent["metadata"]["name"].as_str().unwrap();
    // The pods the kubelet runs before it stops: the held server, and whatever the scenarios
    // before this one left running.
    let running: Vec<String> = cluster.admin.get(&["pods", "-n", namespace])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pod| testbed::cluster::control_plane::condition(pod, "Ready")["status"] == "True")
        .map(|pod| pod["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(running.iter().any(|pod| pod == "server"), "{running:?}");
    let startups_before = agent_startup_lines(cluster, agent_pod).len();
    let agents_conditions =
        || AGENTS_CONDITIONS.map(|kind| cluster.node_condition(kind).unwrap_or_default());
    let before = agents_conditions();
    cluster.stop_kubelet();
    // The controller writes the condition first and the taint from its tainting queue a moment
    // later, so the verdict is both, waited for together.
    testbed::wait_until(
        "the node lifecycle controller's verdict on the silent kubelet",
        Duration::from_secs(60),
        || {
            let node = cluster.node().unwrap();
            let ready = testbed::cluster::control_plane::condition(&node, "Ready");
            let tainted = node["spec"]["taints"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["key"] == "node.kubernetes.io/unreachable")
            });
            (ready["status"] == "Unknown" && tainted)
                .then_some(())
                .ok_or_else(|| format!("Ready {ready}, taints {:#}", node["spec"]["taints"]))
        },
    );
    assert_eq!(
        agents_conditions(),
        before,
        "the agent's conditions left alone"
    );
    cluster.start_kubelet();
    cluster.await_node_ready();
    for pod in &running {
        await_pod_ready(cluster, namespace, pod);
    }
    let agent_now = await_agent_pod(cluster, None);
    assert_eq!(
        agent_now["metadata"]["uid"], agent["metadata"]["uid"],
        "the agent's pod ran on through the kubelet's restart"
    );
    assert_eq!(agents_conditions(), before);
    assert_eq!(
        agent_startup_lines(cluster, agent_pod).len(),
        startups_before,
        "no startup reported twice"
    );
}
