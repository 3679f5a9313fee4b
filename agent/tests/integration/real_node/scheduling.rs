//! A pod placed by the real scheduler, pulled from the node's registry, started under runc with
//! the runtime's default seccomp filter and probed Ready by the kubelet.

use super::*;

#[test]
fn a_pod_is_placed_by_the_scheduler_pulled_started_and_probed_ready_by_the_kubelet() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    let _node_as_it_is = cluster.sharing();
    let programs = cluster.runtime.programs().to_path_buf();
    let digest = cluster.runtime.push_image(
        "workload:placed",
        &[&programs.join("workload")],
        "/workload",
    );
    let image = format!("{REGISTRY}/workload:placed");
    let model = testbed::models::PlainModel::new();
    // The server runs as a user of its own, as inference images do; the model is readable by all.
    open_to_all(model.root());
    let namespace = cluster.namespace("placed");
    let pod = workload_pod("server", &image, model.root(), 1);
    cluster
        .admin
        .admin(&["create", "-n", &namespace, "-f", "-"], &pod.to_string());
    let ready = await_pod_ready(cluster, &namespace, "server");
    assert_eq!(ready["spec"]["nodeName"], NODE);
    let pod_ip = ready["status"]["podIP"].as_str().unwrap_or_default();
    assert!(
        pod_ip.starts_with("10.88.0."),
        "the pod's address from the CNI bridge's range: {pod_ip:?}"
    );
    assert_eq!(
        ready["status"]["containerStatuses"][0]["imageID"],
        format!("{image}@{digest}").replacen(":placed", "", 1),
        "the kubelet reports the image by the registry's digest"
    );

    let events = events_of(cluster, &namespace, "server");
    let event = |reason: &str| first_with(&events, "reason", reason);
    assert_eq!(
        event("Scheduled")["reportingComponent"],
        "default-scheduler",
        "the real scheduler placed it"
    );
    let pulled = event("Pulled")["message"].as_str().unwrap().to_string();
    assert!(
        pulled.starts_with(&format!("Successfully pulled image \"{image}\" in ")),
        "{pulled}"
    );
    event("Started");

    let lines = container_output(cluster, &namespace, "server", "server");
    let line = |name: &str| first_with(&lines, "event", name);
    assert_eq!(
        line("started")["seccomp"],
        "2",
        "RuntimeDefault: containerd's default filter"
    );
    assert_eq!(
        line("model_loaded")["bytes"],
        model.files.values().map(|f| f.len() as u64).sum::<u64>()
    );
    line("ready");
    cluster
        .admin
        .admin(&["delete", "namespace", &namespace, "--wait=false"], "");
}
