//! Pods and Events shaped as the API server returns them for a vLLM pod on a GPU node, with
//! kubelet's own event messages.

use serde_json::{json, Value};

/// The node the shaped pods are bound to, named as EKS names nodes.
pub const NODE: &str = "ip-10-0-1-23.us-east-2.compute.internal";

/// Now, in Unix seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Unix seconds as the API server writes a time (RFC 3339, whole seconds).
pub fn rfc3339(unix: f64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix),
    )
    .to_string()
}

/// The unix time of an RFC 3339 timestamp the server wrote: [`rfc3339`] undone.
pub fn unix(timestamp: &Value) -> f64 {
    humantime::parse_rfc3339(timestamp.as_str().unwrap())
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// When each moment of a pod's start happened, in Unix seconds.
#[derive(Default)]
pub struct PodTimes {
    pub created: f64,
    pub scheduled: f64,
    pub started: f64,
    pub ready: Option<f64>,
    pub restart_count: i32,
    /// When the previous container exited, for a restart.
    pub last_finished: Option<f64>,
}

/// A vLLM pod on a GPU node as the API server returns it, its status at the times `t` says.
pub fn vllm_pod(uid: &str, name: &str, model_host_path: &str, t: &PodTimes) -> Value {
    let mut conditions = vec![
        json!({"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": null, "lastTransitionTime": rfc3339(t.scheduled + 1.0)}),
        json!({"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": rfc3339(t.scheduled + 1.0)}),
        json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": rfc3339(t.scheduled)}),
    ];
    let ready = match t.ready {
        Some(at) => {
            json!({"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": rfc3339(at)})
        }
        None => {
            json!({"type": "Ready", "status": "False", "lastProbeTime": null, "lastTransitionTime": rfc3339(t.scheduled + 1.0), "reason": "ContainersNotReady", "message": "containers with unready status: [vllm]"})
        }
    };
    conditions.push(ready.clone());
    let mut container = json!({
        "name": "vllm",
        "image": "docker.io/vllm/vllm-openai:v0.11.0",
        "imageID": "docker.io/vllm/vllm-openai@sha256:5f0e2b0c9d8a7e6f5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e",
        "containerID": "containerd://9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b",
        "ready": t.ready.is_some(),
        "started": true,
        "restartCount": t.restart_count,
        "state": {"running": {"startedAt": rfc3339(t.started)}},
    });
    if let Some(finished) = t.last_finished {
        container["lastState"] = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": rfc3339(t.created + 30.0), "finishedAt": rfc3339(finished),
            "containerID": "containerd://0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"}});
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "inference", "uid": uid,
            "creationTimestamp": rfc3339(t.created),
            "labels": {"app": "vllm-llama", "pod-template-hash": "7d9f8c6b5"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-llama-7d9f8c6b5", "uid": "1b2c3d4e-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "/models/llama", "--served-model-name", "llama"],
                "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": true}]}],
            "volumes": [
                {"name": "models", "hostPath": {"path": model_host_path, "type": "Directory"}},
                {"name": "kube-api-access-x7k2p", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}},
            ],
        },
        "status": {
            "phase": "Running", "hostIP": "10.0.1.23", "podIP": "10.0.1.101",
            "startTime": rfc3339(t.scheduled),
            "conditions": conditions,
            "containerStatuses": [container],
        },
    })
}

/// A vLLM pod named `name` as its ReplicaSet creates it on a real server, bound to `node`: no
/// status (the kubelet writes it) and no times (the server sets its creation).
pub fn bound_vllm_pod(name: &str, model_host_path: &str, node: &str) -> Value {
    let mut pod = vllm_pod("", name, model_host_path, &PodTimes::default());
    pod["spec"]["nodeName"] = json!(node);
    pod.as_object_mut().unwrap().remove("status");
    pod
}

/// `event` (as [`kubelet_event`] makes it) about a pod of `namespace`, recorded there.
pub fn in_namespace(mut event: Value, namespace: &str) -> Value {
    event["metadata"]["namespace"] = json!(namespace);
    event["involvedObject"]["namespace"] = json!(namespace);
    event
}

/// A core/v1 Event about the pod, as kubelet records it.
pub fn kubelet_event(
    uid: &str,
    pod: &str,
    reason: &str,
    message: &str,
    field_path: Option<&str>,
    at: f64,
) -> Value {
    let mut involved = json!({"kind": "Pod", "namespace": "inference", "name": pod, "uid": uid, "apiVersion": "v1", "resourceVersion": "48213"});
    if let Some(path) = field_path {
        involved["fieldPath"] = json!(path);
    }
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{pod}.18{:x}", (at as u64) % 0xffff), "namespace": "inference"},
        "involvedObject": involved,
        "reason": reason, "message": message,
        "source": {"component": "kubelet", "host": NODE},
        "firstTimestamp": rfc3339(at), "lastTimestamp": rfc3339(at), "count": 1, "type": "Normal",
        "eventTime": null, "reportingComponent": "kubelet", "reportingInstance": NODE,
    })
}

/// A vLLM pod that started half a minute ago on `node`, not yet Ready, listing the agent's
/// readiness gate (`spec.readinessGates`, kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle)
/// with these annotations.
pub fn gated_vllm_pod(
    uid: &str,
    name: &str,
    node: &str,
    host_path: &str,
    annotations: Value,
) -> Value {
    let now = unix_now();
    let times = PodTimes {
        created: now - 60.0,
        scheduled: now - 59.0,
        started: now - 30.0,
        ready: None,
        restart_count: 0,
        last_finished: None,
    };
    let mut pod = vllm_pod(uid, name, host_path, &times);
    pod["spec"]["nodeName"] = json!(node);
    pod["spec"]["readinessGates"] = json!([{"conditionType": "mlnode.dev/ModelVerified"}]);
    pod["metadata"]["annotations"] = annotations;
    pod
}

/// deploy/examples/vllm-with-model-gate.yaml's Deployment, as users apply it.
pub fn gated_example() -> Value {
    let path = crate::repo_root().join("deploy/examples/vllm-with-model-gate.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .find(|o| o["kind"] == "Deployment")
        .unwrap()
}

/// A pod of that Deployment's template bound to `node`, with a running container's status.
pub fn gated_example_pod(uid: &str, name: &str, node: &str) -> Value {
    let template = &gated_example()["spec"]["template"];
    let mut pod = gated_vllm_pod(uid, name, node, "/var/lib/models", json!({}));
    pod["metadata"]["annotations"] = template["metadata"]["annotations"].clone();
    pod["metadata"]["labels"] = template["metadata"]["labels"].clone();
    pod["spec"] = template["spec"].clone();
    pod["spec"]["nodeName"] = json!(node);
    pod
}
