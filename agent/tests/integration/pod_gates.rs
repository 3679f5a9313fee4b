//! Per-workload model trust in the agent binary against the fake API server: each pod that lists
//! the `mlnode.dev/ModelVerified` readiness gate gets its own model's verdict (the exact
//! `pods/status` patch, only the agent's condition), a corrupted file takes it False and a repair
//! back, the node's `models.mlnode.dev/` label follows, and a pod mounting the cache writable gets
//! a Warning event and a series.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::agent::{sample, Agent};
use common::kube::{gpu_node, FakeApiServer};
use common::pods::{gated_vllm_pod, NODE};
use common::PlainModel;
use serde_json::{json, Value};

const GATE: &str = "mlnode.dev/ModelVerified";

fn gated(uid: &str, name: &str, node: &str, annotations: Value, host_path: &str) -> Value {
    gated_vllm_pod(uid, name, node, host_path, annotations)
}

fn wait_until(what: &str, check: impl Fn() -> bool) {
    common::wait_until(what, Duration::from_secs(20), || {
        check().then_some(()).ok_or_else(String::new)
    })
}

fn status_patches(api: &FakeApiServer, pod: &str) -> Vec<common::kube::Recorded> {
    let path = format!("/api/v1/namespaces/inference/pods/{pod}/status");
    api.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .collect()
}

fn start(api: &FakeApiServer, model: &PlainModel, manifest: &Path) -> Agent {
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1h\n  model_labels: true\n{}    host_path: /var/lib/models/llama\n",
        common::agent::model_config("llama", model.root(), manifest)
    );
    Agent::start_with_env(
        &config,
        &[
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(NODE)),
        ],
    )
}

#[test]
fn each_pod_follows_its_own_models_verification() {
    let api = FakeApiServer::start(gpu_node(NODE));
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let llama = json!({"mlnode.dev/model": "llama"});
    api.put_pod(gated(
        "u0",
        "vllm-0",
        NODE,
        llama.clone(),
        "/var/lib/models",
    ));
    api.put_pod(gated(
        "u1",
        "vllm-1",
        NODE,
        json!({"mlnode.dev/model": "qwen"}),
        "/var/lib/models",
    ));
    api.put_pod(gated(
        "u2",
        "vllm-2",
        NODE,
        json!({"mlnode.dev/model": "llama", "mlnode.dev/model-revision": "v2"}),
        "/var/lib/models",
    ));
    let mut ungated = gated("u3", "vllm-3", NODE, llama.clone(), "/var/lib/models");
    ungated["spec"]["readinessGates"] = json!([]);
    api.put_pod(ungated);
    api.put_pod(gated(
        "u4",
        "vllm-4",
        "ip-10-0-9-99.us-east-2.compute.internal",
        llama.clone(),
        "/var/lib/models",
    ));
    let agent = start(&api, &model, &manifest);

    let condition = |pod: &str| api.pod_condition("inference", pod, GATE);
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
    assert!(status_patches(&api, "vllm-3").is_empty() && status_patches(&api, "vllm-4").is_empty());
    // The kubelet's conditions are untouched: the patch carries the agent's condition only.
    for patch in status_patches(&api, "vllm-0") {
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
    let kubelets = api.pod("inference", "vllm-0")["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] != GATE)
        .count();
    assert_eq!(kubelets, 4);
    wait_until("the node's model label", || {
        api.node()["metadata"]["labels"]["models.mlnode.dev/llama"] == "v1"
    });
    let gate_series = |m: &str, pod: &str| {
        sample(
            m,
            "mlnode_pod_model_gate",
            &[("namespace", "inference"), ("pod", pod)],
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
        api.node()["metadata"]["labels"]
            .get("models.mlnode.dev/llama")
            .is_none()
    });
    assert_eq!(gate_series(&agent.metrics(), "vllm-0"), Some(0.0));
    std::fs::write(model.path(shard), &original).unwrap();
    wait_until("vllm-0's gate True again", || {
        condition("vllm-0")["status"] == "True"
    });
    wait_until("the label back", || {
        api.node()["metadata"]["labels"]["models.mlnode.dev/llama"] == "v1"
    });
    assert_eq!(
        api.node()["metadata"]["labels"]["kubernetes.io/hostname"],
        NODE,
        "others kept"
    );

    // A deleted pod's series goes with it.
    api.delete_pod("u1");
    common::wait_until(
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
    let api = FakeApiServer::start(gpu_node(NODE));
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let llama = json!({"mlnode.dev/model": "llama"});
    for (uid, name) in [
        ("u0", "vllm-0"),
        ("u1", "vllm-refused"),
        ("u2", "vllm-vanished"),
    ] {
        api.put_pod(gated(uid, name, NODE, llama.clone(), "/var/lib/models"));
    }
    api.state
        .refuse_pod_status
        .lock()
        .unwrap()
        .push("vllm-refused".into());
    let agent = start(&api, &model, &manifest);
    let condition = |pod: &str| api.pod_condition("inference", pod, GATE);
    wait_until("the gates True", || {
        condition("vllm-0")["status"] == "True" && condition("vllm-vanished")["status"] == "True"
    });
    wait_until("the node's condition", || {
        api.condition("ModelCacheVerified")["status"] == "True"
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
    // Deleted, and the watch not yet told; then a verdict changes: the write to it finds no pod.
    api.forget_pod("u2");
    let vanished_before = status_patches(&api, "vllm-vanished").len();
    std::fs::write(model.path("config.json"), b"{}").unwrap();
    wait_until("vllm-0's gate False", || {
        condition("vllm-0")["status"] == "False"
    });
    wait_until("the vanished pod tried", || {
        status_patches(&api, "vllm-vanished").len() > vanished_before
    });
    wait_until("the node's condition False", || {
        api.condition("ModelCacheVerified")["status"] == "False"
    });
    // The refused pod is retried with its own backoff: every refused write is counted once, and the
    // vanished pod's 404 not at all.
    let refused = status_patches(&api, "vllm-refused").len() as f64;
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
    let api = FakeApiServer::start(gpu_node(NODE));
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let mut writable = gated("u0", "vllm-0", NODE, json!({}), "/var/lib/models");
    writable["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(false);
    api.put_pod(writable);
    // Read-only, and another directory: neither is warned about.
    api.put_pod(gated(
        "u1",
        "vllm-1",
        NODE,
        json!({"mlnode.dev/model": "llama"}),
        "/var/lib/models",
    ));
    let mut elsewhere = gated("u2", "vllm-2", NODE, json!({}), "/var/lib/other");
    elsewhere["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = json!(false);
    api.put_pod(elsewhere);
    let agent = start(&api, &model, &manifest);
    let writable_series = |pod: &str| {
        sample(
            &agent.metrics(),
            "mlnode_model_cache_writable_mounts",
            &[
                ("model_name", "llama"),
                ("namespace", "inference"),
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
        api.requests()
            .iter()
            .any(|r| r.body["reason"] == "ModelCacheWritable")
    });
    // Rounds later, still one event.
    wait_until("the gate of the pod naming no model", || {
        api.pod_condition("inference", "vllm-0", GATE)["reason"] == "ModelNotNamed"
    });
    let events: Vec<Value> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.body["reason"] == "ModelCacheWritable")
        .map(|r| r.body)
        .collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["metadata"]["namespace"], "inference");
    assert_eq!(
        event["involvedObject"],
        json!({"kind": "Pod", "apiVersion": "v1", "namespace": "inference", "name": "vllm-0", "uid": "u0"})
    );
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("container vllm mounts the cache of model llama writable"),
        "{event}"
    );
    api.delete_pod("u0");
    common::wait_until(
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
    let deployment = common::pods::gated_example();
    let template = &deployment["spec"]["template"];
    let revision = template["metadata"]["annotations"]["mlnode.dev/model-revision"]
        .as_str()
        .unwrap();
    let pod = common::pods::gated_example_pod("e1", "vllm-llama-3-1-8b-7d9f8c6b5-x2k4p", NODE);
    let api = FakeApiServer::start(gpu_node(NODE));
    api.put_pod(pod);
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json(revision, true));
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  model_labels: true\n{}    host_path: /var/lib/models/llama-3.1-8b\n",
        common::agent::model_config("llama-3.1-8b", model.root(), &manifest)
    );
    let agent = Agent::start_with_env(
        &config,
        &[
            ("KUBECONFIG", &api.kubeconfig()),
            ("MLNODE_NODE_NAME", Path::new(NODE)),
        ],
    );
    let condition = || api.pod_condition("inference", "vllm-llama-3-1-8b-7d9f8c6b5-x2k4p", GATE);
    wait_until("the example pod's gate True", || {
        condition()["status"] == "True"
    });
    assert_eq!(condition()["reason"], "ModelVerified");
    let preference = &template["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"];
    wait_until("the node preferred", || {
        matches(preference, &api.node()["metadata"]["labels"])
    });
    assert!(
        !matches(preference, &gpu_node(NODE)["metadata"]["labels"]),
        "not before the agent labels it"
    );
    assert_eq!(
        sample(&agent.metrics(), "mlnode_model_cache_writable_mounts", &[]),
        None,
        "the example mounts its cache read-only"
    );
}
