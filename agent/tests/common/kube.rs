//! An in-process fake Kubernetes API server (axum on loopback) for the readiness controller: it
//! serves one Node shaped as a real cluster returns it, applies strategic-merge patches of its status
//! and JSON patches of the node as the API server does (conditions merge on `type`; a failed `test`
//! is a 422 Status), accepts Events, and records every request with its content type.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};

#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: &'static str,
    pub path: String,
    pub content_type: String,
    pub body: Value,
}

#[derive(Default)]
pub struct ApiState {
    pub node: Mutex<Value>,
    pub requests: Mutex<Vec<Recorded>>,
    /// Answer 503 to everything, as an API server that is down behind its load balancer.
    pub down: AtomicBool,
    /// Before applying the next JSON patch of the node, add a foreign taint, as another controller
    /// writing between the agent's read and its write would.
    pub race_next_taint_patch: AtomicBool,
}

pub struct FakeApiServer {
    pub state: Arc<ApiState>,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

/// A GPU node just joined: kubelet's conditions, the startup taint, and the GPU taint beside it.
pub fn gpu_node(name: &str) -> Value {
    let heartbeat = "2026-11-30T03:59:00Z";
    let kubelet = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet: {reason}"),
               "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-11-30T03:50:00Z"})
    };
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": "6c1f3a2e-8d4b-4f7a-9e21-0b5d7c9a1e33",
            "resourceVersion": "1001",
            "creationTimestamp": "2026-11-30T03:50:00Z",
            "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "p5.48xlarge", "karpenter.sh/nodepool": "gpu"},
        },
        "spec": {
            "providerID": "aws:///us-east-2a/i-0123456789abcdef0",
            "taints": [
                {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"},
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            ],
        },
        "status": {
            "conditions": [
                kubelet("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                kubelet("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                kubelet("PIDPressure", "False", "KubeletHasSufficientPID"),
                kubelet("Ready", "True", "KubeletReady"),
            ],
            "capacity": {"cpu": "192", "memory": "2097152000Ki", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "191450m", "memory": "2086000000Ki", "nvidia.com/gpu": "8"},
            "nodeInfo": {"kubeletVersion": "v1.33.4-eks-1234567", "containerRuntimeVersion": "containerd://1.7.27"},
        },
    })
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
}

fn record(
    state: &ApiState,
    method: &'static str,
    path: String,
    headers: &HeaderMap,
    body: &Bytes,
) -> Value {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    state.requests.lock().unwrap().push(Recorded {
        method,
        path,
        content_type,
        body: value.clone(),
    });
    value
}

fn content_type_is(headers: &HeaderMap, expected: &str) -> bool {
    headers.get("content-type").and_then(|v| v.to_str().ok()) == Some(expected)
}

fn bump(node: &mut Value) {
    let version: u64 = node["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    node["metadata"]["resourceVersion"] = json!((version + 1).to_string());
}

async fn get_node(State(state): State<Arc<ApiState>>, Path(name): Path<String>) -> Response {
    if state.down.load(Ordering::Relaxed) {
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    state.requests.lock().unwrap().push(Recorded {
        method: "GET",
        path: format!("/api/v1/nodes/{name}"),
        content_type: String::new(),
        body: Value::Null,
    });
    let node = state.node.lock().unwrap().clone();
    if node["metadata"]["name"] != name.as_str() {
        return status(404, "NotFound", &format!("nodes \"{name}\" not found"));
    }
    axum::Json(node).into_response()
}

async fn patch_status(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if state.down.load(Ordering::Relaxed) {
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    let patch = record(
        &state,
        "PATCH",
        format!("/api/v1/nodes/{name}/status"),
        &headers,
        &body,
    );
    if !content_type_is(&headers, "application/strategic-merge-patch+json") {
        return status(
            415,
            "UnsupportedMediaType",
            "expected a strategic merge patch",
        );
    }
    let mut node = state.node.lock().unwrap();
    // Strategic merge of conditions: patchMergeKey "type".
    let conditions = node["status"]["conditions"].as_array_mut().unwrap();
    for new in patch["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        match conditions.iter_mut().find(|c| c["type"] == new["type"]) {
            Some(existing) => *existing = new,
            None => conditions.push(new),
        }
    }
    bump(&mut node);
    axum::Json(node.clone()).into_response()
}

async fn patch_node(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if state.down.load(Ordering::Relaxed) {
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    let patch = record(
        &state,
        "PATCH",
        format!("/api/v1/nodes/{name}"),
        &headers,
        &body,
    );
    if !content_type_is(&headers, "application/json-patch+json") {
        return status(415, "UnsupportedMediaType", "expected a JSON patch");
    }
    let mut node = state.node.lock().unwrap();
    if state.race_next_taint_patch.swap(false, Ordering::Relaxed) {
        node["spec"]["taints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "example.com/maintenance", "effect": "NoExecute"}));
        bump(&mut node);
    }
    let operations: json_patch::Patch = match serde_json::from_value(patch) {
        Ok(p) => p,
        Err(e) => return status(400, "BadRequest", &e.to_string()),
    };
    let mut updated = node.clone();
    if let Err(e) = json_patch::patch(&mut updated, &operations) {
        return status(
            422,
            "Invalid",
            &format!("the server rejected our request due to an error in our request: {e}"),
        );
    }
    bump(&mut updated);
    *node = updated;
    axum::Json(node.clone()).into_response()
}

async fn create_event(
    State(state): State<Arc<ApiState>>,
    Path(namespace): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if state.down.load(Ordering::Relaxed) {
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    let mut event = record(
        &state,
        "POST",
        format!("/api/v1/namespaces/{namespace}/events"),
        &headers,
        &body,
    );
    event["metadata"]["name"] = json!(format!(
        "{}abcde",
        event["metadata"]["generateName"]
            .as_str()
            .unwrap_or("event.")
    ));
    (StatusCode::CREATED, axum::Json(event)).into_response()
}

impl FakeApiServer {
    pub fn start(node: Value) -> FakeApiServer {
        let state = Arc::new(ApiState {
            node: Mutex::new(node),
            ..ApiState::default()
        });
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route(
                "/api/v1/nodes/{name}/status",
                axum::routing::patch(patch_status),
            )
            .route("/api/v1/namespaces/{namespace}/events", post(create_event))
            .with_state(state.clone());
        runtime.spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: agent\ncurrent-context: fake\nusers:\n- name: agent\n  user:\n    token: fake-token\n"
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
        FakeApiServer {
            state,
            addr,
            dir,
            _runtime: runtime,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn node(&self) -> Value {
        self.state.node.lock().unwrap().clone()
    }
}
