//! An in-process fake Kubernetes API server (axum on loopback), for the GPU tests and benches not
//! yet moved onto the real control plane (docs/testing.md): it serves one Node shaped as a real
//! cluster returns it, applies strategic-merge patches of its status and JSON patches of the node
//! as the API server does (conditions merge on `type`; a failed `test` is a 422 Status), serves
//! pods, ResourceSlices and Events, and records every request with its content type. Who may do
//! what is the real server's to judge (common::control_plane). Its push-back switches (429 with
//! `Retry-After`, 503, no answer at all) and its record are also the proxy's in front of the real
//! server (common::api_proxy); a watch resumed from a resourceVersion gets what came after it
//! first, as the watch cache replays it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
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
    /// When it arrived.
    pub at: std::time::Instant,
}

impl Recorded {
    /// The path without its query.
    pub fn resource_path(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }

    fn new(method: &'static str, path: String) -> Recorded {
        Recorded {
            method,
            path,
            content_type: String::new(),
            body: Value::Null,
            at: std::time::Instant::now(),
        }
    }
}

#[derive(Default)]
pub struct ApiState {
    pub node: Mutex<Value>,
    pub requests: Mutex<Vec<Recorded>>,
    /// Answer 503 to everything, as an API server that is down behind its load balancer.
    pub down: AtomicBool,
    /// Answer every request with API Priority and Fairness' 429 and this `Retry-After` (seconds).
    pub throttle: Mutex<Option<u64>>,
    /// Answer nothing: every request (watches too) hangs, as behind a dead connection.
    pub stall: AtomicBool,
    /// Pods (as listed), ResourceSlices and Events (as stored).
    pub pods: Mutex<Vec<Value>>,
    pub slices: Mutex<Vec<Value>>,
    pub events: Mutex<Vec<Value>>,
    /// Watch event lines for open watches (each keeps those of its own kind).
    pub watch: Mutex<Option<tokio::sync::broadcast::Sender<Value>>>,
    /// Every object event sent, for a watch resumed from a resourceVersion: the watch cache
    /// replays what came after it.
    pub history: Mutex<Vec<Value>>,
    pub resource_version: std::sync::atomic::AtomicU64,
}

/// A request's method as the record names it.
pub fn method_name(method: &axum::http::Method) -> &'static str {
    match *method {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PATCH => "PATCH",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

/// What API Priority and Fairness answers a request it rejects (kube-apiserver,
/// `staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go` calls
/// `tooManyRequests` of `maxinflight.go`, kubernetes/kubernetes 04791b49): status 429, `Retry-After`
/// in seconds, a plain-text body through Go's `http.Error`, and the UIDs of the matched flow schema
/// and priority level. Before any handler, as the filter runs before the handler chain; recorded.
/// While the server is "down", a 503 Status as an API server behind its load balancer answers;
/// while it stalls, no answer at all.
pub async fn push_back(
    State(state): State<Arc<ApiState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let stalled = state.stall.load(Ordering::Relaxed);
    let throttle = *state.throttle.lock().unwrap();
    let down = state.down.load(Ordering::Relaxed);
    if !stalled && throttle.is_none() && !down {
        return next.run(request).await;
    }
    let method = method_name(request.method());
    let path = match request.uri().query() {
        Some(query) => format!("{}?{query}", request.uri().path()),
        None => request.uri().path().to_string(),
    };
    state
        .requests
        .lock()
        .unwrap()
        .push(Recorded::new(method, path));
    if stalled {
        return std::future::pending().await;
    }
    if down {
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    Response::builder()
        .status(429)
        .header("Retry-After", throttle.unwrap_or(1).to_string())
        .header("Content-Type", "text/plain; charset=utf-8")
        .header("X-Content-Type-Options", "nosniff")
        .header(
            "X-Kubernetes-Pf-Flowschema-Uid",
            "7e3c1f0a-2b4d-4c6e-8f90-a1b2c3d4e5f6",
        )
        .header(
            "X-Kubernetes-Pf-Prioritylevel-Uid",
            "0f1e2d3c-4b5a-4968-8776-655443322110",
        )
        .body(axum::body::Body::from(
            "Too many requests, please try again later.\n",
        ))
        .unwrap()
}

/// An HTTP server on 127.0.0.1 with a runtime of its own, and a kubeconfig that points at it.
pub struct Loopback {
    dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

impl Loopback {
    /// Serves the router `app` builds (inside the runtime), the kubeconfig holding `token`.
    pub fn serve(token: &str, app: impl FnOnce() -> axum::Router) -> Loopback {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = {
            let _inside = runtime.enter();
            app()
        };
        runtime.spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: loopback\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: loopback\n  context:\n    cluster: loopback\n    user: agent\ncurrent-context: loopback\nusers:\n- name: agent\n  user:\n    token: {token}\n"
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
        Loopback {
            dir,
            _runtime: runtime,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }
}

pub struct FakeApiServer {
    pub state: Arc<ApiState>,
    loopback: Loopback,
}

/// A GPU node just joined: kubelet's conditions, the startup taint, and the GPU taint beside it.
pub fn gpu_node(name: &str) -> Value {
    let heartbeat = "2026-11-30T03:59:00Z";
    let kubelet = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet: {reason}"),
               "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-11-30T03:50:00Z"})
    };
    let mut node = json!({
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
    });
    manage_conditions(
        &mut node,
        "kubelet",
        &[
            json!("MemoryPressure"),
            json!("DiskPressure"),
            json!("PIDPressure"),
            json!("Ready"),
        ],
    );
    node
}

/// NVIDIA's DRA driver's ResourceSlice for `node` (tests/fixtures/dra, cited in SOURCES): `gpu-0`
/// is GPU 0 of the fake NVML's scenarios, `gpu-1-mig-1g10gb-19-0` a MIG device of GPU 1.
pub fn nvidia_resource_slice(node: &str) -> Value {
    let fixture = include_str!("../../../../tests/fixtures/dra/nvidia-resourceslice.json");
    serde_json::from_str(&fixture.replace("gpu-node-1", node)).unwrap()
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
        content_type,
        body: value.clone(),
        ..Recorded::new(method, path)
    });
    value
}

/// What every PATCH goes through (after the push-back filter): the record, and the content type the
/// API server requires for that kind of patch.
fn accept(
    state: &ApiState,
    path: String,
    headers: &HeaderMap,
    body: &Bytes,
    content_type: &str,
    refusal: &str,
) -> Result<Value, Box<Response>> {
    let patch = record(state, "PATCH", path, headers, body);
    if !content_type_is(headers, content_type) {
        return Err(Box::new(status(415, "UnsupportedMediaType", refusal)));
    }
    Ok(patch)
}

/// [`accept`] for a status subresource: only a strategic merge patch.
fn accept_strategic(
    state: &ApiState,
    path: String,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Value, Box<Response>> {
    let expected = "application/strategic-merge-patch+json";
    accept(
        state,
        path,
        headers,
        body,
        expected,
        "expected a strategic merge patch",
    )
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
    state
        .requests
        .lock()
        .unwrap()
        .push(Recorded::new("GET", format!("/api/v1/nodes/{name}")));
    let node = state.node.lock().unwrap().clone();
    if node["metadata"]["name"] != name.as_str() {
        return status(404, "NotFound", &format!("nodes \"{name}\" not found"));
    }
    axum::Json(node).into_response()
}

/// The field manager of a write, as the API server names it: the `fieldManager` parameter, else
/// the user agent up to its first `/` (k8s.io/apiserver `fieldmanager`, "prefixFromUserAgent").
fn field_manager(query: Option<&str>, headers: &HeaderMap) -> String {
    let given = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("fieldManager=").map(str::to_string));
    given.unwrap_or_else(|| {
        let agent = headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown");
        agent.split('/').next().unwrap_or(agent).to_string()
    })
}

/// Field management of an Update, as the API server keeps `metadata.managedFields`: each condition
/// the write changed becomes the writer's (key `k:{"type":...}` under `f:status`/`f:conditions`,
/// in the writer's `subresource: status` entry) and leaves every other manager's set.
fn manage_conditions(node: &mut Value, manager: &str, changed: &[Value]) {
    if changed.is_empty() {
        return;
    }
    let keys: Vec<String> = changed
        .iter()
        .map(|t| format!("k:{}", json!({ "type": t })))
        .collect();
    let fields = json!({".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}});
    let entries = node["metadata"]
        .as_object_mut()
        .unwrap()
        .entry("managedFields")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .unwrap();
    for entry in entries.iter_mut() {
        if let Some(conditions) = entry
            .pointer_mut("/fieldsV1/f:status/f:conditions")
            .and_then(Value::as_object_mut)
        {
            for key in &keys {
                conditions.remove(key);
            }
        }
    }
    let position = entries
        .iter()
        .position(|e| e["manager"] == manager && e["subresource"] == "status");
    let entry = match position {
        Some(i) => &mut entries[i],
        None => {
            entries.push(json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {"f:conditions": {}}}}));
            entries.last_mut().unwrap()
        }
    };
    entry["time"] = json!("2026-11-30T04:00:00Z");
    let conditions = entry
        .pointer_mut("/fieldsV1/f:status/f:conditions")
        .and_then(Value::as_object_mut)
        .unwrap();
    for key in keys {
        conditions.insert(key, fields.clone());
    }
}

/// A strategic merge of `patch`'s `status.conditions` into `object`'s (patchMergeKey `type`, for
/// NodeStatus and PodStatus alike); returns the types that changed.
fn merge_conditions(object: &mut Value, patch: &Value) -> Vec<Value> {
    let conditions = object["status"]["conditions"].as_array_mut().unwrap();
    let mut changed = Vec::new();
    for new in patch["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        match conditions.iter_mut().find(|c| c["type"] == new["type"]) {
            Some(existing) if *existing == new => {}
            Some(existing) => {
                changed.push(new["type"].clone());
                *existing = new;
            }
            None => {
                changed.push(new["type"].clone());
                conditions.push(new);
            }
        }
    }
    changed
}

async fn patch_status(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/api/v1/nodes/{name}/status");
    let patch = match accept_strategic(&state, path, &headers, &body) {
        Ok(patch) => patch,
        Err(refused) => return *refused,
    };
    let mut node = state.node.lock().unwrap();
    let mut updated = node.clone();
    let changed = merge_conditions(&mut updated, &patch);
    manage_conditions(
        &mut updated,
        &field_manager(query.as_deref(), &headers),
        &changed,
    );
    *node = updated;
    bump(&mut node);
    axum::Json(node.clone()).into_response()
}

async fn patch_node(
    State(state): State<Arc<ApiState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // The taint is a guarded JSON patch, the labels a merge patch: the API server takes both.
    let merge = content_type_is(&headers, "application/merge-patch+json");
    let expected = if merge {
        "application/merge-patch+json"
    } else {
        "application/json-patch+json"
    };
    let patch = match accept(
        &state,
        format!("/api/v1/nodes/{name}"),
        &headers,
        &body,
        expected,
        "expected a JSON patch or a merge patch",
    ) {
        Ok(patch) => patch,
        Err(refused) => return *refused,
    };
    let mut node = state.node.lock().unwrap();
    let mut updated = node.clone();
    if merge {
        json_patch::merge(&mut updated, &patch);
        bump(&mut updated);
        *node = updated;
        return axum::Json(node.clone()).into_response();
    }
    let operations: json_patch::Patch = match serde_json::from_value(patch) {
        Ok(p) => p,
        Err(e) => return status(400, "BadRequest", &e.to_string()),
    };
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

/// Pods, honouring a `spec.nodeName` field selector (on the list; the watch sends every pod
/// change, and the agent's watch only ever asks for its node's).
async fn pods(
    State(state): State<Arc<ApiState>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let node = field_selector(query.as_deref().unwrap_or_default())
        .and_then(|s| s.strip_prefix("spec.nodeName=").map(str::to_string));
    let items = state
        .pods
        .lock()
        .unwrap()
        .iter()
        .filter(|p| node.as_deref().is_none_or(|n| p["spec"]["nodeName"] == n))
        .cloned()
        .collect();
    list_or_watch(
        &state,
        "/api/v1/pods",
        "PodList",
        "v1",
        items,
        query,
        move |o| o["kind"] != "Node" && node.as_deref().is_none_or(|n| o["spec"]["nodeName"] == n),
    )
}

/// A strategic-merge patch of a pod's status (conditions merge on `type`), through admission as
/// an UPDATE of `pods/status`; the stored pod's watchers are told.
async fn patch_pod_status(
    State(state): State<Arc<ApiState>>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/status");
    let patch = match accept_strategic(&state, path, &headers, &body) {
        Ok(patch) => patch,
        Err(refused) => return *refused,
    };
    let mut pods = state.pods.lock().unwrap();
    let Some(pod) = pods.iter_mut().find(|p| {
        p["metadata"]["namespace"] == namespace.as_str() && p["metadata"]["name"] == name.as_str()
    }) else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    let mut updated = pod.clone();
    merge_conditions(&mut updated, &patch);
    let version = state.resource_version.fetch_add(1, Ordering::Relaxed) + 1;
    updated["metadata"]["resourceVersion"] = json!(version.to_string());
    *pod = updated.clone();
    drop(pods);
    if let Some(tx) = state.watch.lock().unwrap().as_ref() {
        let _ = tx.send(json!({"type": "MODIFIED", "object": updated}));
    }
    axum::Json(updated).into_response()
}

/// Nodes, honouring a `metadata.name` field selector: the list, or the watch of the node's changes
/// (each write to it, as the API server's watch cache sends them).
async fn nodes(
    State(state): State<Arc<ApiState>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let name = field_selector(query.as_deref().unwrap_or_default())
        .and_then(|s| s.strip_prefix("metadata.name=").map(str::to_string));
    let node = state.node.lock().unwrap().clone();
    let matches = move |o: &Value| {
        o["kind"] == "Node" && name.as_deref().is_none_or(|n| o["metadata"]["name"] == n)
    };
    let items = [node].into_iter().filter(|n| matches(n)).collect();
    list_or_watch(
        &state,
        "/api/v1/nodes",
        "NodeList",
        "v1",
        items,
        query,
        matches,
    )
}

/// ResourceSlices, as resource.k8s.io/v1 serves them, honouring a `spec.nodeName` field selector.
async fn resource_slices(
    State(state): State<Arc<ApiState>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let node = field_selector(query.as_deref().unwrap_or_default())
        .and_then(|s| s.strip_prefix("spec.nodeName=").map(str::to_string));
    let items = state
        .slices
        .lock()
        .unwrap()
        .iter()
        .filter(|s| node.as_deref().is_none_or(|n| s["spec"]["nodeName"] == n))
        .cloned()
        .collect();
    list_or_watch(
        &state,
        "/apis/resource.k8s.io/v1/resourceslices",
        "ResourceSliceList",
        "resource.k8s.io/v1",
        items,
        query,
        move |o| node.as_deref().is_none_or(|n| o["spec"]["nodeName"] == n),
    )
}

fn field_selector(query: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldSelector="))
        .map(|s| s.replace("%3D", "=").replace("%2C", ","))
}

/// A list (`items` at the current resourceVersion) or, with `watch=true`, the stream of watch
/// events for objects of `api_version` as they change (of `node`'s, when the field selector names
/// one).
fn list_or_watch(
    state: &ApiState,
    path: &str,
    list_kind: &str,
    api_version: &'static str,
    items: Vec<Value>,
    query: Option<String>,
    keep: impl Fn(&Value) -> bool + Send + 'static,
) -> Response {
    let query = query.unwrap_or_default();
    let watching = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    state
        .requests
        .lock()
        .unwrap()
        .push(Recorded::new("GET", format!("{path}?{query}")));
    if !watching {
        let version = state.resource_version.load(Ordering::Relaxed).to_string();
        return axum::Json(json!({"kind": list_kind, "apiVersion": api_version, "metadata": {"resourceVersion": version}, "items": items})).into_response();
    }
    let receiver = state
        .watch
        .lock()
        .unwrap()
        .get_or_insert_with(|| tokio::sync::broadcast::channel(1024).0)
        .subscribe();
    // Resumed from a resourceVersion: what came after it first, as the watch cache replays it.
    let since: u64 = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let missed: Vec<Result<Value, tokio_stream::wrappers::errors::BroadcastStreamRecvError>> =
        state
            .history
            .lock()
            .unwrap()
            .iter()
            .filter(|line| {
                since > 0
                    && line["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|v| v.parse::<u64>().ok())
                        .is_some_and(|v| v > since)
            })
            .cloned()
            .map(Ok)
            .collect();
    let open = tokio_stream::StreamExt::chain(
        tokio_stream::iter(missed),
        tokio_stream::wrappers::BroadcastStream::new(receiver),
    );
    let lines = tokio_stream::StreamExt::filter_map(open, move |line| {
        line.ok()
            .filter(|v: &Value| {
                v["type"] == "ERROR"
                    || (v["object"]["apiVersion"] == api_version && keep(&v["object"]))
            })
            .map(|v| Ok::<_, std::convert::Infallible>(Bytes::from(format!("{v}\n"))))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from_stream(lines))
        .unwrap()
}

async fn list_events(
    State(state): State<Arc<ApiState>>,
    Path(namespace): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    state.requests.lock().unwrap().push(Recorded::new(
        "GET",
        format!("/api/v1/namespaces/{namespace}/events?{query}"),
    ));
    let uid = field_selector(&query)
        .and_then(|s| s.strip_prefix("involvedObject.uid=").map(str::to_string));
    let items: Vec<Value> = state
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            e["metadata"]["namespace"] == namespace.as_str()
                && uid
                    .as_deref()
                    .is_none_or(|u| e["involvedObject"]["uid"] == u)
        })
        .cloned()
        .collect();
    axum::Json(json!({"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items})).into_response()
}

impl FakeApiServer {
    /// Adds or replaces a pod (by uid) and tells open watches.
    pub fn put_pod(&self, mut pod: Value) {
        let version = self.state.resource_version.fetch_add(1, Ordering::Relaxed) + 1;
        pod["metadata"]["resourceVersion"] = json!(version.to_string());
        let mut pods = self.state.pods.lock().unwrap();
        let kind = match pods
            .iter_mut()
            .find(|p| p["metadata"]["uid"] == pod["metadata"]["uid"])
        {
            Some(existing) => {
                *existing = pod.clone();
                "MODIFIED"
            }
            None => {
                pods.push(pod.clone());
                "ADDED"
            }
        };
        drop(pods);
        self.send(json!({"type": kind, "object": pod}));
    }

    /// Deletes a pod and tells the watches.
    #[allow(dead_code)] // the startup_churn bench replaces pods; no test does on the fake now
    pub fn delete_pod(&self, uid: &str) {
        let mut pods = self.state.pods.lock().unwrap();
        if let Some(i) = pods.iter().position(|p| p["metadata"]["uid"] == uid) {
            let pod = pods.remove(i);
            drop(pods);
            self.send(json!({"type": "DELETED", "object": pod}));
        }
    }

    fn send(&self, line: Value) {
        if line["object"]["metadata"]["resourceVersion"].is_string() {
            self.state.history.lock().unwrap().push(line.clone());
        }
        if let Some(tx) = self.state.watch.lock().unwrap().as_ref() {
            let _ = tx.send(line);
        }
    }

    pub fn add_event(&self, event: Value) {
        self.state.events.lock().unwrap().push(event);
    }

    fn router(state: Arc<ApiState>) -> axum::Router {
        axum::Router::new()
            .route("/api/v1/nodes", get(nodes))
            .route("/api/v1/nodes/{name}", get(get_node).patch(patch_node))
            .route(
                "/api/v1/nodes/{name}/status",
                axum::routing::patch(patch_status),
            )
            .route(
                "/api/v1/namespaces/{namespace}/events",
                post(create_event).get(list_events),
            )
            .route("/api/v1/pods", get(pods))
            .route(
                "/api/v1/namespaces/{namespace}/pods/{name}/status",
                axum::routing::patch(patch_pod_status),
            )
            .route(
                "/apis/resource.k8s.io/v1/resourceslices",
                get(resource_slices),
            )
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                push_back,
            ))
            .with_state(state)
    }

    /// Plain HTTP, no authentication: a kubeconfig (see [`FakeApiServer::kubeconfig`]) points at it.
    pub fn start(node: Value) -> FakeApiServer {
        let state = Arc::new(ApiState {
            node: Mutex::new(node),
            ..ApiState::default()
        });
        let loopback = Loopback::serve("fake-token", || FakeApiServer::router(state.clone()));
        FakeApiServer { state, loopback }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.loopback.kubeconfig()
    }

    #[allow(dead_code)] // the startup_churn bench counts what the agent asked; no test does now
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }
}

/// Polls `check` until it holds; panics after `limit`.
pub fn wait(check: impl Fn() -> bool, limit: std::time::Duration) {
    super::wait_until("the fake API server's condition", limit, || {
        check().then_some(()).ok_or_else(String::new)
    })
}
