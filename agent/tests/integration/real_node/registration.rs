//! The kubelet registers its node with the node's own certificate, is judged by the Node
//! authorizer and asks the server who may read its endpoint; nothing of the cluster is left on the
//! machine.

use super::*;

#[test]
fn the_kubelet_registers_its_node_as_system_nodes_and_leaves_the_machine_as_it_was() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    let node = cluster.node().expect("the kubelet registered its node");
    let addresses = node["status"]["addresses"].as_array().unwrap();
    assert!(
        addresses
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == NODE_IP),
        "the node's address is its bridge's: {addresses:?}"
    );
    // The server's audit log says who the kubelet was: the node's identity, in system:nodes.
    let node_status_writers: Vec<(String, Vec<String>)> =
        testbed::cluster::audit::AuditReader::default()
            .read(cluster.audit_logs())
            .into_iter()
            .filter(|r| r.resource == "nodes/status" && r.is_write())
            .map(|r| (r.user, r.groups))
            .collect();
    assert!(
        node_status_writers.iter().any(|(user, groups)| *user
                == format!("system:node:{NODE}")
                && groups.iter().any(|g| g == "system:nodes")),
        "the kubelet writes its node's status as system:node:{NODE} in system:nodes: {node_status_writers:?}"
    );
    // The Node authorizer lets a node read only what its pods need: no Secret of its choosing.
    let kubeconfig = cluster.runtime.dir().join("kubelet/kubelet.kubeconfig");
    let as_node = cluster.runtime.inside(&[
        "kubectl",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "get",
        "secrets",
        "-n",
        "kube-system",
    ]);
    assert!(
        !as_node.status.success() && String::from_utf8_lossy(&as_node.stderr).contains("Forbidden"),
        "the node may not list Secrets: {}",
        String::from_utf8_lossy(&as_node.stderr)
    );

    // The kubelet's own endpoint: no anonymous reader, and a token only as far as the server's
    // SubjectAccessReview grants it (nodes/proxy for /pods).
    let namespace = cluster.namespace("kubelet-endpoint");
    let granted = "pod-lister";
    for account in ["nobody", granted] {
        cluster
            .admin
            .admin(&["create", "serviceaccount", "-n", &namespace, account], "");
    }
    let role = format!("{namespace}-nodes-proxy");
    cluster.admin.admin(
        &[
            "create",
            "clusterrole",
            &role,
            "--verb=get",
            "--resource=nodes/proxy",
        ],
        "",
    );
    cluster.admin.admin(
        &[
            "create",
            "clusterrolebinding",
            &role,
            "--clusterrole",
            &role,
            &format!("--serviceaccount={namespace}:{granted}"),
        ],
        "",
    );
    let endpoint = format!("https://{NODE_IP}:10250/pods");
    let status_for = |token: Option<String>| {
        let mut curl = vec![
            "curl".to_string(),
            "-sk".into(),
            "-o".into(),
            "/dev/null".into(),
            "-w".into(),
            "%{http_code}".into(),
        ];
        if let Some(token) = token {
            curl.extend(["-H".into(), format!("Authorization: Bearer {token}")]);
        }
        curl.push(endpoint.clone());
        let curl: Vec<&str> = curl.iter().map(String::as_str).collect();
        String::from_utf8_lossy(&cluster.runtime.inside(&curl).stdout).to_string()
    };
    assert_eq!(
        status_for(None),
        "401",
        "no anonymous reader of the kubelet"
    );
    assert_eq!(
        status_for(Some(cluster.admin.token(&namespace, "nobody", &[]))),
        "403",
        "a token the server grants nothing on the node"
    );
    assert_eq!(
        status_for(Some(cluster.admin.token(&namespace, granted, &[]))),
        "200",
        "a token the server grants nodes/proxy"
    );

    // Nothing of the cluster listens beyond the machine's loopback.
    let listeners = cluster.machine_listeners();
    assert!(
        !listeners.is_empty() && listeners.iter().all(|(_, loopback)| *loopback),
        "the cluster's listening sockets on the machine, all on loopback: {listeners:?}"
    );
    // The kubelet's kernel settings, the runtime's state, the node's links and the pods' cgroups
    // all stayed in the node's namespaces and under its cgroup root.
    assert_eq!(
        &MachineState::read(),
        cluster.machine_before(),
        "the machine as it was before the node started"
    );
    let kubepods = format!(
        "/sys/fs/cgroup/memory{}/kubepods",
        cluster.runtime.cgroup_root()
    );
    assert!(
        std::path::Path::new(&kubepods).is_dir(),
        "the kubelet's pods' cgroups under the node's own root, {kubepods}"
    );
}
