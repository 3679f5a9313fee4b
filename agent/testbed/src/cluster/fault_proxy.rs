//! A small proxy in front of the real API server (crate::cluster::control_plane), for what the real server
//! cannot be made to do on demand: API Priority and Fairness' 429, a 503 storm, a stall, a watch
//! ended, or ended with 410 Gone, at a chosen moment, another writer acting between two of the
//! agent's requests. Everything else is the real server's: each request is forwarded as the agent sent it, its own token
//! authenticating it there, and answered with the server's answer, watches streamed. Every request
//! is recorded (method, path, content type, body), for tests that assert what the agent sends.
//! The agent reaches it over plain HTTP on loopback; it reaches the server over TLS.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::cluster::control_plane::ControlPlane;

/// How the proxy ends the watches streaming through it.
#[derive(Clone, Copy)]
enum Cut {
    /// As a server closing its connections: the client resumes from where it was.
    End,
    /// With 410 Gone, as when their resourceVersion has been compacted away: it lists again.
    Expire,
}

/// The proxy: an address the agent is given as its API server, the faults it is told to inject,
/// and the requests it saw.
pub struct ApiProxy {
    /// The push-back switches and the record.
    pub state: Arc<ApiState>,
    cut: tokio::sync::broadcast::Sender<Cut>,
    before: Arc<std::sync::Mutex<Option<Hook>>>,
    loopback: Loopback,
}

/// Something done on the real server before the next request the predicate picks is forwarded.
type Hook = (
    Box<dyn Fn(&str, &str) -> bool + Send>,
    Box<dyn FnOnce() + Send>,
);

struct Forward {
    state: Arc<ApiState>,
    server: kube::Client,
    cut: tokio::sync::broadcast::Sender<Cut>,
    before: Arc<std::sync::Mutex<Option<Hook>>>,
}

impl ApiProxy {
    /// A proxy to `control_plane` and a kubeconfig for it holding `token`.
    pub fn start(control_plane: &ControlPlane, token: &str) -> ApiProxy {
        let state = Arc::new(ApiState::default());
        let before = Arc::new(std::sync::Mutex::new(None));
        let (cut, _) = tokio::sync::broadcast::channel(4);
        let mut config = kube::Config::new(control_plane.server().parse().unwrap());
        config.root_cert = Some(vec![control_plane.ca_der()]);
        let loopback = Loopback::serve(token, || {
            let forward = Arc::new(Forward {
                state: state.clone(),
                server: kube::Client::try_from(config).unwrap(),
                cut: cut.clone(),
                before: before.clone(),
            });
            axum::Router::new()
                .fallback(forward_request)
                .with_state(forward)
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    push_back,
                ))
        });
        ApiProxy {
            state,
            cut,
            before,
            loopback,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.loopback.kubeconfig()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Ends every watch streaming now, as a server closing its connections does.
    pub fn end_watches(&self) {
        let _ = self.cut.send(Cut::End);
    }

    /// Ends every watch streaming now with 410 Gone: the client must list again.
    pub fn expire_watches(&self) {
        let _ = self.cut.send(Cut::Expire);
    }

    /// Runs `action` (against the real server) just before forwarding the next request whose
    /// method and path (without its query) `picks`: another writer racing the agent's read and
    /// write.
    pub fn before_next(
        &self,
        picks: impl Fn(&str, &str) -> bool + Send + 'static,
        action: impl FnOnce() + Send + 'static,
    ) {
        *self.before.lock().unwrap() = Some((Box::new(picks), Box::new(action)));
    }
}

async fn forward_request(
    State(forward): State<Arc<Forward>>,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body: Bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let content_type = parts
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    // A watch is cut by any cut made once it is recorded, before the server has answered too.
    let watch_cut =
        (path.contains("watch=true") || path.contains("watch=1")).then(|| forward.cut.subscribe());
    let method = method_name(&parts.method);
    let recorded = Recorded {
        method,
        // As the server reads it: an empty query is none.
        path: path.trim_end_matches('?').to_string(),
        content_type,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: std::time::Instant::now(),
    };
    let resource = recorded.resource_path().to_string();
    forward.state.requests.lock().unwrap().push(recorded);
    let hook = {
        let mut before = forward.before.lock().unwrap();
        match before.as_ref() {
            Some((picks, _)) if picks(method, &resource) => before.take(),
            _ => None,
        }
    };
    if let Some((_, action)) = hook {
        tokio::task::spawn_blocking(action).await.unwrap();
    }
    let mut upstream = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(path.as_str());
    for (name, value) in &parts.headers {
        if name != axum::http::header::HOST && name != axum::http::header::CONTENT_LENGTH {
            upstream = upstream.header(name, value);
        }
    }
    let upstream = upstream
        .body(kube::client::Body::from(body.to_vec()))
        .unwrap();
    match forward.server.send(upstream).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            let body = axum::body::Body::new(body);
            let Some(mut cut) = watch_cut else {
                return Response::from_parts(parts, body);
            };
            // A watch: streamed until cut, then, where the cut expires it, the server's 410 event.
            let tail = Arc::new(std::sync::Mutex::new(None::<Bytes>));
            let cut_tail = tail.clone();
            let stop = async move {
                if let Ok(Cut::Expire) = cut.recv().await {
                    *cut_tail.lock().unwrap() = Some(Bytes::from(format!("{}\n", expired())));
                }
            };
            let last =
                futures_util::stream::iter(std::iter::from_fn(move || tail.lock().unwrap().take()));
            let stream = body.into_data_stream().take_until(stop).chain(last.map(Ok));
            Response::from_parts(parts, axum::body::Body::from_stream(stream))
        }
        Err(e) => (
            axum::http::StatusCode::BAD_GATEWAY,
            format!("the API server did not answer the proxy: {e}"),
        )
            .into_response(),
    }
}

/// The watch event an API server ends a watch with when its resourceVersion has been compacted
/// away (410 Gone): the client must list again.
fn expired() -> Value {
    json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version: 1 (1001)", "reason": "Expired", "code": 410}})
}

/// One request the proxy saw.
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

/// The proxy's push-back switches and its record of requests.
#[derive(Default)]
pub struct ApiState {
    pub requests: Mutex<Vec<Recorded>>,
    /// Answer 503 to everything, as an API server that is down behind its load balancer.
    pub down: AtomicBool,
    /// Answer every request with API Priority and Fairness' 429 and this `Retry-After` (seconds).
    pub throttle: Mutex<Option<u64>>,
    /// Answer nothing: every request (watches too) hangs, as behind a dead connection.
    pub stall: AtomicBool,
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

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
}
