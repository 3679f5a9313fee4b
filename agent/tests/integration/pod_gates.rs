//! Per-workload model trust in the agent binary against the real kube-apiserver
//! (testbed::cluster::control_plane), through the recording proxy (testbed::cluster::fault_proxy), with the shipped RBAC
//! and admission policies and its pod's token: each pod that lists the `mlnode.dev/ModelVerified`
//! readiness gate gets its own model's verdict (the exact `pods/status` patch, only the agent's
//! condition), a corrupted file takes it False and a repair back, the node's `models.mlnode.dev/`
//! label follows, a pod whose status another policy refuses or that vanishes leaves the others
//! alone, and a pod mounting the cache writable gets a Warning event and a series.

use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::pods::gated_vllm_pod;
use testbed::models::PlainModel;

const GATE: &str = "mlnode.dev/ModelVerified";

fn gated(name: &str, node: &str, annotations: Value, host_path: &str) -> Value {
    gated_vllm_pod("", name, node, host_path, annotations)
}

fn wait_until(what: &str, check: impl Fn() -> bool) {
    testbed::wait_until(what, Duration::from_secs(20), || {
        check().then_some(()).ok_or_else(String::new)
    })
}

/// The GPU node with the model-labels component, whose RBAC the labels need.
fn cluster_node() -> Result<ApiOnlyNode, String> {
    ApiOnlyNode::gpu(&["components/model-labels"])
}

fn status_patches(node: &ApiOnlyNode, pod: &str) -> Vec<testbed::cluster::fault_proxy::Recorded> {
    let path = node.pod_status_path(pod);
    node.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.resource_path() == path)
        .collect()
}

/// A ValidatingAdmissionPolicy of another controller that refuses every write to `pod`'s status,
/// in force before this returns (a dry run of such a write is refused).
fn refuse_status_writes(node: &ApiOnlyNode, pod: &str) {
    let name = format!("pod-guard.{}", node.inference);
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": node.inference}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/status"]}]},
            "validations": [{"expression": format!("object.metadata.name != '{pod}'"),
                "message": format!("pods \"{pod}\" is protected by pod-guard.example.com")}]}});
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}});
    node.control_plane.apply(&[policy, binding]).unwrap();
    let probe =
        json!({"status": {"conditions": [{"type": "example.com/Probe", "status": "True"}]}});
    testbed::wait_until("the pod guard in force", Duration::from_secs(30), || {
        let output = node.control_plane.kubectl(
            &[
                "patch",
                "pod",
                pod,
                "-n",
                &node.inference,
                "--subresource=status",
                "--type=strategic",
                "--dry-run=server",
                "-p",
                &probe.to_string(),
            ],
            "",
        );
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        stderr
            .contains("pod-guard.example.com")
            .then_some(())
            .ok_or(stderr)
    });
}

fn start(node: &ApiOnlyNode, model: &PlainModel, manifest: &std::path::Path) -> Agent {
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1h\n  model_labels: true\n{}    host_path: /var/lib/models/llama\n",
        testbed::agent::model_config("llama", model.root(), manifest)
    );
    node.start_agent(&config)
}

#[test]
fn each_pod_follows_its_own_models_verification() {
    let node = testbed::needs!(cluster_node());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let llama = json!({"mlnode.dev/model": "llama"});
    node.put_pod(&gated(
        "vllm-0",
        node.name(),
        llama.clone(),
        "/var/lib/models",
    ));
    node.put_pod(&gated(
        "vllm-1",
        node.name(),
        json!({"mlnode.dev/model": "qwen"}),
        "/var/lib/models",
    ));
    node.put_pod(&gated(
        "vllm-2",
        node.name(),
        json!({"mlnode.dev/model": "llama", "mlnode.dev/model-revision": "v2"}),
        "/var/lib/models",
    ));
    let mut ungated = gated("vllm-3", node.name(), llama.clone(), "/var/lib/models");
    ungated["spec"]["readinessGates"] = json!([]);
    node.put_pod(&ungated);
    node.put_pod(&gated(
        "vllm-4",
        "ip-10-0-9-99.us-east-2.compute.internal",
        llama.clone(),
        "/var/lib/models",
    ));
    let agent = start(&node, &model, &manifest);

    let condition = |pod: &str| node.pod_condition(pod, GATE);
    wait_until("vllm-0's gate True", || {
        condition("vllm-0")["status"] == "True"
    });
    // Each pod's condition is written in its own patch: wait for the verdict, not the first write.
    wait_until("vllm-2's gate on the verified revision", || {
        condition("vllm-2")["reason"] == "RevisionMismatch"
    });
    let reason = |pod: &str| {
        condition(pod)["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(reason("vllm-0"), "ModelVerified");
    assert_eq!(
        condition("vllm-0")["message"],
        "model llama verified (revision v1)"
    );
    assert_eq!(reason("vllm-1"), "ModelNotOnNode");
    assert_eq!(
        (
            condition("vllm-2")["status"].as_str(),
            reason("vllm-2").as_str()
        ),
        (Some("False"), "RevisionMismatch")
    );
    assert!(
        condition("vllm-3").is_null(),
        "a pod without the gate is not written"
    );
    assert!(
        status_patches(&node, "vllm-3").is_empty() && status_patches(&node, "vllm-4").is_empty()
    );
    // The kubelet's conditions are untouched: the patch carries the agent's condition only.
    for patch in status_patches(&node, "vllm-0") {
        assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
        let conditions = patch.body["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1, "{:#}", patch.body);
        assert_eq!(conditions[0]["type"], GATE);
        assert_eq!(
            patch.body.as_object().unwrap().len(),
            1,
            "nothing but status"
        );
    }
    let kubelets = node.pod("vllm-0")["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] != GATE)
        .count();
    assert_eq!(kubelets, 4);
    wait_until("the node's model label", || {
        node.node()["metadata"]["labels"]["models.mlnode.dev/llama"] == "v1"
    });
    let gate_series = |m: &str, pod: &str| {
        sample(
            m,
            "mlnode_pod_model_gate",
            &[("namespace", node.inference.as_str()), ("pod", pod)],
        )
    };
    let metrics = agent.metrics();
    assert_eq!(gate_series(&metrics, "vllm-0"), Some(1.0));
    assert_eq!(gate_series(&metrics, "vllm-1"), Some(0.0));
    assert_eq!(gate_series(&metrics, "vllm-3"), None);
    assert_eq!(
        sample(
            &metrics,
            "mlnode_collector_up",
            &[("collector", "pod_gates")]
        ),
        Some(1.0)
    );

    // A corrupted weight file: the pod leaves its endpoints (condition False naming the file), the
    // label goes; the file repaired, both come back.
    let shard = "model-00001-of-00002.safetensors";
    let original = model.files[shard].clone();
    let mut corrupt = original.clone();
    corrupt[1000] ^= 0xff;
    std::fs::write(model.path(shard), &corrupt).unwrap();
    wait_until("vllm-0's gate False", || {
        condition("vllm-0")["status"] == "False"
    });
    assert_eq!(reason("vllm-0"), "ModelNotVerified");
    assert!(
        condition("vllm-0")["message"]
            .as_str()
            .unwrap()
            .contains(shard),
        "{}",
        condition("vllm-0")
    );
    wait_until("the label removed", || {
        node.node()["metadata"]["labels"]
            .get("models.mlnode.dev/llama")
            .is_none()
    });
    assert_eq!(gate_series(&agent.metrics(), "vllm-0"), Some(0.0));
    std::fs::write(model.path(shard), &original).unwrap();
    wait_until("vllm-0's gate True again", || {
        condition("vllm-0")["status"] == "True"
    });
    wait_until("the label back", || {
        node.node()["metadata"]["labels"]["models.mlnode.dev/llama"] == "v1"
    });
    assert_eq!(
        node.node()["metadata"]["labels"]["kubernetes.io/hostname"],
        node.name(),
        "others kept"
    );

    // A deleted pod's series goes with it.
    node.delete_pod("vllm-1");
    testbed::wait_until(
        "vllm-1's series gone",
        Duration::from_secs(20),
        || match gate_series(&agent.metrics(), "vllm-1") {
            None => Ok(()),
            Some(v) => Err(format!("still {v}")),
        },
    );
}

/// A pod whose status the API server refuses, and one deleted while the agent writes it: each
/// is counted or passed over, with bounded retries (a backoff per pod), and every other
/// pod and the node's own conditions are written as ever.
#[test]
fn a_refused_or_vanished_pod_leaves_the_others_and_the_node_alone() {
    let node = testbed::needs!(cluster_node());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let llama = json!({"mlnode.dev/model": "llama"});
    for name in ["vllm-0", "vllm-refused", "vllm-vanished"] {
        node.put_pod(&gated(name, node.name(), llama.clone(), "/var/lib/models"));
    }
    refuse_status_writes(&node, "vllm-refused");
    let agent = start(&node, &model, &manifest);
    let condition = |pod: &str| node.pod_condition(pod, GATE);
    wait_until("the gates True", || {
        condition("vllm-0")["status"] == "True" && condition("vllm-vanished")["status"] == "True"
    });
    wait_until("the node's condition", || {
        node.condition("ModelCacheVerified")["status"] == "True"
    });
    let errors = |a: &Agent| {
        sample(
            &a.metrics(),
            "mlnode_pod_gate_updates_total",
            &[("result", "error")],
        )
        .unwrap_or(0.0)
    };
    wait_until("the refusal counted", || errors(&agent) >= 2.0);
    // A verdict changes, and the pod is deleted just before the agent's write reaches the server
    // (its watch not yet told): the write finds no pod.
    let (control_plane, inference) = (node.control_plane, node.inference.clone());
    let vanished = node.pod_status_path("vllm-vanished");
    node.api.before_next(
        move |method, path| method == "PATCH" && path == vanished,
        move || {
            control_plane.admin(
                &[
                    "delete",
                    "pod",
                    "vllm-vanished",
                    "-n",
                    &inference,
                    "--wait=false",
                ],
                "",
            );
        },
    );
    let vanished_before = status_patches(&node, "vllm-vanished").len();
    std::fs::write(model.path("config.json"), b"{}").unwrap();
    wait_until("vllm-0's gate False", || {
        condition("vllm-0")["status"] == "False"
    });
    wait_until("the vanished pod tried", || {
        status_patches(&node, "vllm-vanished").len() > vanished_before
    });
    wait_until("the node's condition False", || {
        node.condition("ModelCacheVerified")["status"] == "False"
    });
    // The refused pod is retried with its own backoff: every refused write is counted once, and the
    // vanished pod's 404 not at all.
    let refused = status_patches(&node, "vllm-refused").len() as f64;
    let counted = errors(&agent);
    assert!(
        counted <= refused && counted >= refused - 1.0,
        "{counted} errors, {refused} refused writes"
    );
    let log = agent.log();
    assert!(
        log.contains("cannot write the pod's mlnode.dev/ModelVerified condition")
            && log.contains("pod-guard.example.com"),
        "{log}"
    );
    let said = log
        .lines()
        .filter(|l| l.contains("cannot write the pod's") && l.contains("vllm-refused"))
        .count();
    assert_eq!(said, 1, "said once: {log}");
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_collector_up",
            &[("collector", "pod_gates")]
        ),
        Some(0.0),
        "a refused write is the collector failing"
    );
}

#[test]
fn a_pod_mounting_the_cache_writable_is_warned_once_and_counted() {
    let node = testbed::needs!(cluster_node());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let mut writable = gated("vllm-0", node.name(), json!({}), "/var/lib/models");
    writable["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(false);
    node.put_pod(&writable);
    // Read-only, and another directory: neither is warned about.
    node.put_pod(&gated(
        "vllm-1",
        node.name(),
        json!({"mlnode.dev/model": "llama"}),
        "/var/lib/models",
    ));
    let mut elsewhere = gated("vllm-2", node.name(), json!({}), "/var/lib/other");
    elsewhere["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(false);
    node.put_pod(&elsewhere);
    let agent = start(&node, &model, &manifest);
    let writable_series = |pod: &str| {
        sample(
            &agent.metrics(),
            "mlnode_model_cache_writable_mounts",
            &[
                ("model_name", "llama"),
                ("namespace", node.inference.as_str()),
                ("pod", pod),
            ],
        )
    };
    wait_until("the writable mount counted", || {
        writable_series("vllm-0") == Some(1.0)
    });
    assert_eq!(writable_series("vllm-1"), None);
    assert_eq!(writable_series("vllm-2"), None);
    wait_until("the Warning event", || {
        node.requests()
            .iter()
            .any(|r| r.body["reason"] == "ModelCacheWritable")
    });
    // Rounds later, still one event.
    wait_until("the gate of the pod naming no model", || {
        node.pod_condition("vllm-0", GATE)["reason"] == "ModelNotNamed"
    });
    let events: Vec<Value> = node
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.body["reason"] == "ModelCacheWritable")
        .map(|r| r.body)
        .collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["metadata"]["namespace"], node.inference.as_str());
    let uid = node.pod("vllm-0")["metadata"]["uid"].clone();
    assert_eq!(
        event["involvedObject"],
        json!({"kind": "Pod", "apiVersion": "v1", "namespace": node.inference, "name": "vllm-0", "uid": uid})
    );
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("container vllm mounts the cache of model llama writable"),
        "{event}"
    );
    node.delete_pod("vllm-0");
    testbed::wait_until(
        "its series gone",
        Duration::from_secs(20),
        || match writable_series("vllm-0") {
            None => Ok(()),
            Some(v) => Err(format!("still {v}")),
        },
    );
}

/// Whether a node's labels satisfy a nodeSelectorTerm's `matchExpressions` (the operators the
/// example uses, as the scheduler's `nodeaffinity` plugin reads them).
fn matches(term: &Value, labels: &Value) -> bool {
    term["matchExpressions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| {
            let value = &labels[e["key"].as_str().unwrap()];
            match e["operator"].as_str().unwrap() {
                "In" => e["values"].as_array().unwrap().contains(value),
                "Exists" => !value.is_null(),
                other => panic!("operator {other} not modelled"),
            }
        })
}

/// deploy/examples/vllm-with-model-gate.yaml as users apply it: its pod template, scheduled onto
/// the node, is gated on its model and prefers the node once the agent labels it.
#[test]
fn the_example_deployment_is_gated_on_its_model_and_prefers_its_node() {
    let deployment = testbed::cluster::pods::gated_example();
    let template = &deployment["spec"]["template"];
    let revision = template["metadata"]["annotations"]["mlnode.dev/model-revision"]
        .as_str()
        .unwrap();
    let node = testbed::needs!(cluster_node());
    let pod = testbed::cluster::pods::gated_example_pod(
        "",
        "vllm-llama-3-1-8b-7d9f8c6b5-x2k4p",
        node.name(),
    );
    node.put_pod(&pod);
    let labels_before = node.node()["metadata"]["labels"].clone();
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json(revision, true));
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  model_labels: true\n{}    host_path: /var/lib/models/llama-3.1-8b\n",
        testbed::agent::model_config("llama-3.1-8b", model.root(), &manifest)
    );
    let agent = node.start_agent(&config);
    let condition = || node.pod_condition("vllm-llama-3-1-8b-7d9f8c6b5-x2k4p", GATE);
    wait_until("the example pod's gate True", || {
        condition()["status"] == "True"
    });
    assert_eq!(condition()["reason"], "ModelVerified");
    let preference = &template["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"];
    wait_until("the node preferred", || {
        matches(preference, &node.node()["metadata"]["labels"])
    });
    assert!(
        !matches(preference, &labels_before),
        "not before the agent labels it"
    );
    assert_eq!(
        sample(&agent.metrics(), "mlnode_model_cache_writable_mounts", &[]),
        None,
        "the example mounts its cache read-only"
    );
}
