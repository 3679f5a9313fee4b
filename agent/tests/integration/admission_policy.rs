//! The agent's confinement, proven by a real kube-apiserver (testbed::cluster::control_plane): the shipped
//! RBAC and ValidatingAdmissionPolicies installed, the agent's pod made from its DaemonSet's
//! template and bound to node A, and the bound token the kubelet would project into it (the
//! server adds the node-name claim). With that token every write the agent makes on node A lands,
//! and every write it must never make is refused by the server with the policy's own message:
//! another node, a kubelet condition, capacity, a foreign taint or label, annotations, a cordon;
//! on pods, anything but its `mlnode.dev/` conditions of its own node's pods.

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::cluster::control_plane::{self, condition, AgentOnNode, ControlPlane};
use testbed::needs;

/// What the agent's writes go through: the overlay with the components that give it node patches
/// (the startup taint and model labels).
fn agent_on_node(control_plane: &ControlPlane, components: &[&str]) -> AgentOnNode {
    let objects = testbed::renderers::kustomize::render_with("overlays/gpu", components)
        .unwrap_or_else(|reason| panic!("kustomize (kubectl) is needed: {reason}"));
    AgentOnNode::start(control_plane, &objects, &control_plane.unique("node"))
}

const WITH_NODE_PATCHES: &[&str] = &["components/startup-taint", "components/model-labels"];

/// A PATCH of `target` (resource, name, namespace) as `token`, of `kind` (strategic, merge, json)
/// and to its status where `status`; Ok, or Err with the server's refusal.
fn patch(
    control_plane: &ControlPlane,
    token: &str,
    target: (&str, &str, Option<&str>),
    status: bool,
    kind: &str,
    body: &Value,
) -> Result<(), String> {
    let (resource, name, namespace) = target;
    let mut path = match namespace {
        Some(namespace) => format!("/api/v1/namespaces/{namespace}/{resource}s/{name}"),
        None => format!("/api/v1/{resource}s/{name}"),
    };
    if status {
        path.push_str("/status");
    }
    let content_type = match kind {
        "strategic" => "application/strategic-merge-patch+json",
        "merge" => "application/merge-patch+json",
        "json" => "application/json-patch+json",
        other => panic!("no patch type {other}"),
    };
    match control_plane.request_as(token, "PATCH", &path, content_type, body) {
        (200, _) => Ok(()),
        (code, answer) => Err(format!(
            "{code} {}",
            answer["message"].as_str().unwrap_or(&answer.to_string())
        )),
    }
}

fn node_status(
    control_plane: &ControlPlane,
    agent: &AgentOnNode,
    node: &str,
    body: Value,
) -> Result<(), String> {
    patch(
        control_plane,
        &agent.token,
        ("node", node, None),
        true,
        "strategic",
        &body,
    )
}

fn node_spec(
    control_plane: &ControlPlane,
    agent: &AgentOnNode,
    kind: &str,
    body: Value,
) -> Result<(), String> {
    patch(
        control_plane,
        &agent.token,
        ("node", &agent.node, None),
        false,
        kind,
        &body,
    )
}

fn conditions(types: &[(&str, &str)]) -> Value {
    let list: Vec<Value> = types
        .iter()
        .map(|(kind, status)| json!({"type": kind, "status": status, "reason": "Test", "message": "written by the agent's token"}))
        .collect();
    json!({"status": {"conditions": list}})
}

fn kubelets_ready_condition_refused(control_plane: &ControlPlane, agent: &AgentOnNode) {
    refused(
        node_status(
            control_plane,
            agent,
            &agent.node,
            conditions(&[("Ready", "False")]),
        ),
        "own condition types",
        "the kubelet's Ready condition",
    );
}

fn refused(result: Result<(), String>, message: &str, what: &str) {
    match result {
        Ok(()) => panic!("{what}: admitted, expected the policy's refusal {message:?}"),
        Err(refusal) => assert!(
            refusal.contains(message) && refusal.contains("ValidatingAdmissionPolicy"),
            "{what}: refused, but not by the policy's message {message:?}: {refusal}"
        ),
    }
}

#[test]
fn the_agent_writes_its_conditions_taint_and_labels_on_its_own_node() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, WITH_NODE_PATCHES);
    control_plane.taint_gpu_node(&agent.node);

    node_status(
        control_plane,
        &agent,
        &agent.node,
        conditions(&[("ModelCacheVerified", "False")]),
    )
    .unwrap();
    node_status(
        control_plane,
        &agent,
        &agent.node,
        conditions(&[
            ("ModelCacheVerified", "True"),
            ("AcceleratorHealthy", "True"),
            ("FabricHealthy", "True"),
        ]),
    )
    .unwrap();
    let node = control_plane.get(&["node", &agent.node]);
    assert_eq!(condition(&node, "ModelCacheVerified")["status"], "True");
    assert_eq!(condition(&node, "AcceleratorHealthy")["status"], "True");
    assert_eq!(
        condition(&node, "Ready")["reason"],
        "KubeletReady",
        "the kubelet's condition as it was"
    );

    // The startup taint removed as the agent removes it: a JSON patch that tests the list first.
    let taints = node["spec"]["taints"].as_array().unwrap();
    let ours = taints
        .iter()
        .position(|t| t["key"] == "mlnode.dev/not-ready")
        .unwrap();
    node_spec(
        control_plane,
        &agent,
        "json",
        json!([
        {"op": "test", "path": format!("/spec/taints/{ours}/key"), "value": "mlnode.dev/not-ready"},
        {"op": "remove", "path": format!("/spec/taints/{ours}")}]),
    )
    .unwrap();
    let label = "models.mlnode.dev/llama-3.1-8b";
    node_spec(
        control_plane,
        &agent,
        "merge",
        json!({"metadata": {"labels": {label: "0e9e39f249a16976918f6564b8830bc894c89659"}}}),
    )
    .unwrap();
    let node = control_plane.get(&["node", &agent.node]);
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    );
    assert_eq!(
        node["metadata"]["labels"][label],
        "0e9e39f249a16976918f6564b8830bc894c89659"
    );
    node_spec(
        control_plane,
        &agent,
        "merge",
        json!({"metadata": {"labels": {label: null}}}),
    )
    .unwrap();
    assert!(
        control_plane.get(&["node", &agent.node])["metadata"]["labels"]
            .get(label)
            .is_none()
    );
}

#[test]
fn every_write_it_must_never_make_is_refused_with_the_policys_message() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, WITH_NODE_PATCHES);
    control_plane.taint_gpu_node(&agent.node);
    let other = control_plane.unique("node");
    control_plane.create(&control_plane::node(&other, json!({})));
    let before = control_plane.get(&["node", &agent.node]);

    refused(
        node_status(
            control_plane,
            &agent,
            &other,
            conditions(&[("ModelCacheVerified", "True")]),
        ),
        "only the node it runs on",
        "another node's status",
    );
    kubelets_ready_condition_refused(control_plane, &agent);
    refused(
        node_status(
            control_plane,
            &agent,
            &agent.node,
            json!({"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}}),
        ),
        "own condition types",
        "the kubelet's Ready condition removed",
    );
    refused(
        node_status(
            control_plane,
            &agent,
            &agent.node,
            conditions(&[("AcceleratedHardwareReady", "False")]),
        ),
        "own condition types",
        "the repair engines' condition without components/repair-condition",
    );
    refused(
        node_status(
            control_plane,
            &agent,
            &agent.node,
            conditions(&[("NetworkingReady", "False")]),
        ),
        "own condition types",
        "the repair engines' networking condition without components/repair-condition",
    );
    refused(
        node_status(
            control_plane,
            &agent,
            &agent.node,
            json!({"status": {"capacity": {"nvidia.com/gpu": "16"}}}),
        ),
        "capacity",
        "capacity",
    );
    let foreign = before["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t["key"] == "nvidia.com/gpu")
        .unwrap();
    refused(
        node_spec(
            control_plane,
            &agent,
            "json",
            json!([{"op": "remove", "path": format!("/spec/taints/{foreign}")}]),
        ),
        "only its own startup taint",
        "a foreign taint removed",
    );
    refused(
        node_spec(
            control_plane,
            &agent,
            "json",
            json!([{"op": "add", "path": "/spec/taints/-", "value": {"key": "example.com/evict", "effect": "NoExecute"}}]),
        ),
        "only its own startup taint",
        "a foreign taint added",
    );
    refused(
        node_spec(
            control_plane,
            &agent,
            "merge",
            json!({"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}}),
        ),
        "own node labels",
        "a foreign label changed",
    );
    refused(
        node_spec(
            control_plane,
            &agent,
            "merge",
            json!({"metadata": {"labels": {"kubernetes.io/hostname": null}}}),
        ),
        "own node labels",
        "a foreign label removed",
    );
    refused(
        node_spec(
            control_plane,
            &agent,
            "merge",
            json!({"metadata": {"annotations": {"example.com/x": "1"}}}),
        ),
        "annotations",
        "an annotation",
    );
    refused(
        node_spec(
            control_plane,
            &agent,
            "merge",
            json!({"spec": {"unschedulable": true}}),
        ),
        "cordon",
        "a cordon",
    );
    let after = control_plane.get(&["node", &agent.node]);
    assert_eq!(
        after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
        "nothing refused was written"
    );
}

#[test]
fn a_token_without_the_node_claim_may_change_no_node() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, &[]);
    let unbound = agent.unbound_token(control_plane);
    refused(
        patch(
            control_plane,
            &unbound,
            ("node", &agent.node, None),
            true,
            "strategic",
            &conditions(&[("ModelCacheVerified", "True")]),
        ),
        "only the node it runs on",
        "a write without the node claim",
    );
}

#[test]
fn anyone_elses_writes_are_not_the_policys_business() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, &[]);
    control_plane.admin(
        &[
            "patch",
            "node",
            &agent.node,
            "--subresource=status",
            "--type=strategic",
            "-p",
            &conditions(&[("Ready", "False")]).to_string(),
        ],
        "",
    );
    assert_eq!(
        condition(&control_plane.get(&["node", &agent.node]), "Ready")["status"],
        "False"
    );
}

/// components/repair-condition lets the agent write the repair engines' `AcceleratedHardwareReady`
/// and `NetworkingReady` too, and sets the setting that makes it; the kubelet's conditions stay
/// denied.
#[test]
fn the_repair_condition_component_allows_exactly_that_type_more() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, &["components/repair-condition"]);
    node_status(
        control_plane,
        &agent,
        &agent.node,
        conditions(&[
            ("AcceleratedHardwareReady", "False"),
            ("NetworkingReady", "False"),
        ]),
    )
    .unwrap();
    kubelets_ready_condition_refused(control_plane, &agent);
    let daemonset = testbed::renderers::kustomize::daemonset(&agent.install.objects);
    let env = daemonset["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(env.contains(
        &json!({"name": "MLNODE_READINESS__REPAIR_CONDITION", "value": "AcceleratedHardwareReady"})
    ));
}

/// A gated vLLM pod on `node` in `namespace`, its status as the kubelet wrote it.
fn gated_pod(control_plane: &ControlPlane, namespace: &str, node: &str) -> Value {
    let name = control_plane.unique("vllm");
    control_plane.create_pod(
        namespace,
        &testbed::cluster::pods::gated_vllm_pod("", &name, node, "/var/lib/models", json!({})),
    )
}

fn pod_status(
    control_plane: &ControlPlane,
    token: &str,
    pod: &Value,
    body: Value,
) -> Result<(), String> {
    let metadata = &pod["metadata"];
    patch(
        control_plane,
        token,
        (
            "pod",
            metadata["name"].as_str().unwrap(),
            metadata["namespace"].as_str(),
        ),
        true,
        "strategic",
        &body,
    )
}

/// The agent on its node, a namespace, and a gated pod there on the agent's node and one on
/// another node.
fn pods_here_and_there(control_plane: &ControlPlane) -> (AgentOnNode, String, Value, Value) {
    let agent = agent_on_node(control_plane, &[]);
    let other = control_plane.unique("node");
    control_plane.create(&control_plane::node(&other, json!({})));
    let inference = control_plane.namespace("inference", json!({}));
    let here = gated_pod(control_plane, &inference, &agent.node);
    let there = gated_pod(control_plane, &inference, &other);
    (agent, inference, here, there)
}

fn verified() -> Value {
    json!({"status": {"conditions": [{"type": "mlnode.dev/ModelVerified", "status": "True", "reason": "ModelVerified", "message": "model llama verified"}]}})
}

#[test]
fn the_agent_may_write_its_own_condition_on_its_own_nodes_pods_only() {
    let control_plane = needs!(control_plane::shared());
    let (agent, _, here, there) = pods_here_and_there(control_plane);

    pod_status(control_plane, &agent.token, &here, verified()).unwrap();
    refused(
        pod_status(control_plane, &agent.token, &there, verified()),
        "pods bound to the node it runs on",
        "another node's pod",
    );
    let unbound = agent.unbound_token(control_plane);
    refused(
        pod_status(control_plane, &unbound, &here, verified()),
        "pods bound to the node it runs on",
        "no node claim",
    );
}

#[test]
fn a_pods_other_conditions_and_status_are_not_the_agents_to_change() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, &[]);
    let inference = control_plane.namespace("inference", json!({}));
    let pod = gated_pod(control_plane, &inference, &agent.node);
    let token = &agent.token;
    refused(
        pod_status(
            control_plane,
            token,
            &pod,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        ),
        "own pod condition types",
        "the pod's Ready condition",
    );
    refused(
        pod_status(
            control_plane,
            token,
            &pod,
            json!({"status": {"conditions": [{"type": "example.com/Other", "status": "True"}]}}),
        ),
        "own pod condition types",
        "a foreign condition type",
    );
    refused(
        pod_status(
            control_plane,
            token,
            &pod,
            json!({"status": {"phase": "Failed"}}),
        ),
        "phase",
        "the pod's phase",
    );
    refused(
        pod_status(
            control_plane,
            token,
            &pod,
            json!({"status": {"containerStatuses": [{"name": "vllm", "restartCount": 3}]}}),
        ),
        "container statuses",
        "a container's restart count",
    );
    refused(
        pod_status(
            control_plane,
            token,
            &pod,
            json!({"metadata": {"labels": {"app": "other"}}}),
        ),
        "labels",
        "the pod's labels",
    );
}

/// The device gate's own patch, as the agent builds it for a pod holding a faulty GPU: admitted on
/// a pod of the agent's node, refused on another node's pod, by the shipped policy.
#[test]
fn the_device_gate_is_written_on_the_agents_nodes_pods_only() {
    let control_plane = needs!(control_plane::shared());
    let (agent, inference, here, there) = pods_here_and_there(control_plane);
    let holder = |pod: &Value| mlnode_core::health::PodRef {
        namespace: inference.clone(),
        name: pod["metadata"]["name"].as_str().unwrap().to_string(),
    };
    let gpu = "GPU-00000001-1111-2222-3333-444444444441";
    let report = |pod: &Value| mlnode_core::health::Report {
        devices: 1,
        problems: vec![mlnode_core::health::Problem::new(
            "GPULost",
            format!("GPU 1 ({gpu}, 00000000:17:00.0) fell off the bus"),
        )
        .on(gpu)],
        holdings: [(
            holder(pod),
            vec![mlnode_core::health::Held {
                device: gpu.into(),
                name: format!("GPU 1 ({gpu}, 00000000:17:00.0)"),
                listed: true,
            }],
        )]
        .into(),
        ..mlnode_core::health::Report::new(mlnode_core::health::DeviceKind::Gpu)
    };
    let body = |pod: &Value| {
        let gate = mlnode_agent::workloads::device_gate::decide(&holder(pod), Some(&[report(pod)]))
            .unwrap();
        assert_eq!(gate.reason, "GPULost");
        mlnode_agent::workloads::gate::condition_patch(&gate, None, "2026-12-01T10:00:00Z")
    };
    pod_status(control_plane, &agent.token, &here, body(&here)).unwrap();
    let stored = control_plane.get(&[
        "pod",
        here["metadata"]["name"].as_str().unwrap(),
        "-n",
        &inference,
    ]);
    assert_eq!(
        condition(&stored, "mlnode.dev/AcceleratorHealthy")["status"],
        "False"
    );
    refused(
        pod_status(control_plane, &agent.token, &there, body(&there)),
        "pods bound to the node it runs on",
        "another node's pod",
    );
}

/// deploy/examples/vllm-with-model-gate.yaml's pod, bound to the agent's node: the agent's own
/// patch body for it is admitted, and the pod shows the condition.
#[test]
fn the_agents_write_on_the_example_pod_is_admitted() {
    let control_plane = needs!(control_plane::shared());
    let agent = agent_on_node(control_plane, &[]);
    let inference = control_plane.namespace("inference", json!({}));
    let name = control_plane.unique("vllm-llama-3-1-8b");
    let pod = control_plane.create_pod(
        &inference,
        &testbed::cluster::pods::gated_example_pod("", &name, &agent.node),
    );
    let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod.clone()).unwrap();
    let verdicts = std::collections::BTreeMap::from([(
        "llama-3.1-8b".to_string(),
        mlnode_agent::cache::state::Readiness::Verified {
            revision: Some("0e9e39f249a16976918f6564b8830bc894c89659".into()),
        },
    )]);
    let gate = mlnode_agent::workloads::gate::decide(&typed, &verdicts).unwrap();
    assert!(gate.ok(), "{gate:?}");
    let body = mlnode_agent::workloads::gate::condition_patch(&gate, None, "2026-12-01T10:00:00Z");
    pod_status(control_plane, &agent.token, &pod, body).unwrap();
    let stored = control_plane.get(&["pod", &name, "-n", &inference]);
    let condition = stored["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "mlnode.dev/ModelVerified")
        .expect("the gate's condition on the pod");
    assert_eq!(condition["status"], "True");
}

/// A startup taint of the user's own (Helm's `startupTaint.taint`): the policy the chart installs
/// lets the agent's own bound token remove exactly that taint, and still refuses the default key
/// and any other.
#[test]
fn a_custom_startup_taint_is_removed_by_the_agents_token() {
    let control_plane = needs!(control_plane::shared());
    let custom = "example.com/gpu-warming";
    let objects = needs!(testbed::renderers::helm::render(&format!(
        "startupTaint: {{enabled: true, taint: \"{custom}=true:NoSchedule\"}}\nneuron: {{enabled: false}}"
    )))
    .unwrap_or_else(|refused| panic!("helm template refused the custom taint: {refused}"));
    let agent = AgentOnNode::start(control_plane, &objects, &control_plane.unique("node"));
    control_plane.set_taints(
        &agent.node,
        json!([
            {"key": custom, "value": "true", "effect": "NoSchedule"},
            {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
    );
    let taints = || control_plane.get(&["node", &agent.node])["spec"]["taints"].clone();
    let position = |key: &str| {
        taints()
            .as_array()
            .unwrap()
            .iter()
            .position(|t| t["key"] == key)
            .unwrap()
    };
    for other in ["mlnode.dev/not-ready", "nvidia.com/gpu"] {
        refused(
            node_spec(
                control_plane,
                &agent,
                "json",
                json!([{"op": "remove", "path": format!("/spec/taints/{}", position(other))}]),
            ),
            "only its own startup taint",
            &format!("{other} removed under a custom startup taint"),
        );
    }
    node_spec(
        control_plane,
        &agent,
        "json",
        json!([{"op": "remove", "path": format!("/spec/taints/{}", position(custom))}]),
    )
    .unwrap();
    assert!(
        !taints().to_string().contains(custom),
        "the custom taint removed: {}",
        taints()
    );
}
