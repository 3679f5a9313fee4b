//! What the agent costs the API server, counted and bounded in one place: a layer under the one
//! client every component shares. It counts each request by verb, resource and answer
//! (`mlnode_kube_requests_total`), holds every request of the agent while the server has asked it
//! to wait (a 429's or 5xx's `Retry-After`, with jitter so that a fleet does not come back in one
//! second), and bounds how long a request that is not a watch may take. The loops above it decide
//! what to retry and when ([`Backoff`]); nothing here retries.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{HeaderMap, Method, StatusCode};
use prometheus::{IntCounterVec, Opts, Registry};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt};

use mlnode_core::settings::jitter;

/// The longest `Retry-After` honoured as given: kube-apiserver sends 1 s (API Priority and
/// Fairness, max-inflight) or 5 s (shutting down); anything longer is a proxy's, and no verdict
/// should wait more than this for it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// A request's verb and resource as the API server's own `apiserver_request_total` names them:
/// `get`, `list`, `watch`, `create`, `patch`, `update`, `delete`, `deletecollection`; the resource
/// with its subresource (`pods/status`), without group or version. Paths that name no resource
/// (`/version`, discovery) are `other`.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[][..],
    };
    let rest = match rest {
        ["namespaces", _namespace, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [] => return (verb(method, false, query), "other".into()),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, subresource, ..] => (format!("{resource}/{subresource}"), true),
    };
    (verb(method, named, query), resource)
}

fn verb(method: &Method, named: bool, query: Option<&str>) -> &'static str {
    let watching = query
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1");
    match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PATCH => "patch",
        Method::PUT => "update",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

/// How long the server asks every client to wait: `Retry-After` in seconds (the only form
/// kube-apiserver writes) on a 429 or a 5xx, at most [`MAX_RETRY_AFTER`]. None otherwise.
pub fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The doubling wait of a loop whose requests fail, as every well-behaved controller backs off:
/// one step after the first failure, doubling to `max`; each wait drawn between half its step and
/// the step ("equal jitter"), so that agents failing together do not retry together. A success
/// starts it over.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
}

/// The agent's loops: a second after the first failure, at most a minute.
impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
    }
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            step: first,
        }
    }

    /// The wait after a failure; `draw` in [0, 1) picks where in (step/2, step] it falls.
    pub fn failed(&mut self, draw: f64) -> Duration {
        let wait = self.step.mul_f64(1.0 - draw.clamp(0.0, 1.0) / 2.0);
        self.step = (self.step * 2).min(self.max);
        wait
    }

    /// [`Backoff::failed`] with a random draw, different in each process.
    pub fn failed_now(&mut self) -> Duration {
        self.failed(draw())
    }

    pub fn succeeded(&mut self) {
        self.step = self.first;
    }
}

/// A random number in [0, 1), different in each process.
pub fn draw() -> f64 {
    jitter(Duration::from_secs(1)).as_secs_f64()
}

/// Changes each time the API server answers again after it refused (429, 5xx), failed or did not
/// answer: a loop waiting out its back-off tries again then, not a minute later.
pub type Recoveries = tokio::sync::watch::Receiver<u64>;

/// What the layer shares across every request of the process.
struct Shared {
    requests: IntCounterVec,
    request_timeout: Duration,
    hold: Mutex<Hold>,
    recovered: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct Hold {
    /// No request is sent before this.
    until: Option<Instant>,
    /// The answer that started the hold now in force, said once.
    said: Option<StatusCode>,
    /// The last answer was a refusal, a failure or none at all.
    troubled: bool,
}

impl Shared {
    /// Waits while the server's last push-back holds.
    async fn wait_turn(&self) {
        loop {
            let until = self.hold.lock().unwrap_or_else(|e| e.into_inner()).until;
            match until {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => return,
            }
        }
    }

    fn answered(&self, verb: &str, resource: &str, status: StatusCode, headers: &HeaderMap) {
        self.count(verb, resource, status.as_str());
        let mut hold = self.hold.lock().unwrap_or_else(|e| e.into_inner());
        let refused = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
        if !refused && std::mem::take(&mut hold.troubled) {
            self.recovered.send_modify(|n| *n += 1);
        }
        hold.troubled |= refused;
        if let Some(wait) = retry_after(status, headers) {
            let wait = wait + jitter(wait / 2);
            hold.until = Some(Instant::now() + wait);
            if hold.said.is_none() {
                tracing::warn!(code = status.as_u16(), verb, resource, wait = ?wait, "the API server asks its clients to wait (Retry-After): every request of this agent waits until then; verdicts are written once it answers");
                hold.said = Some(status);
            }
        } else if status.is_success() && hold.said.take().is_some() {
            tracing::info!("the API server answers again");
        }
    }

    fn count(&self, verb: &str, resource: &str, code: &str) {
        self.requests
            .with_label_values(&[verb, resource, code])
            .inc();
    }

    /// No answer: the connection failed, or none came in time.
    fn unanswered(&self, verb: &str, resource: &str, code: &str) {
        self.count(verb, resource, code);
        self.hold.lock().unwrap_or_else(|e| e.into_inner()).troubled = true;
    }
}

/// The layer under the shared client ([`ApiLayer::new`]); its service needs a `Clone` inner
/// service (a `tower::buffer::Buffer` over kube's stack).
#[derive(Clone)]
pub struct ApiLayer {
    shared: Arc<Shared>,
}

impl ApiLayer {
    /// Registers `mlnode_kube_requests_total` in `registry`; requests other than watches fail
    /// after `request_timeout` without an answer.
    pub fn new(registry: &Registry, request_timeout: Duration) -> prometheus::Result<ApiLayer> {
        let requests = IntCounterVec::new(
            Opts::new(
                "mlnode_kube_requests_total",
                "Requests this agent sent to the Kubernetes API server, by verb and resource as the API server's apiserver_request_total names them, and the answer's HTTP code (<error>: no answer, the connection failed; <timeout>: no answer within api_request_timeout).",
            ),
            &["verb", "resource", "code"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        Ok(ApiLayer {
            shared: Arc::new(Shared {
                requests,
                request_timeout,
                hold: Mutex::default(),
                recovered: tokio::sync::watch::channel(0).0,
            }),
        })
    }

    /// Told each time the API server answers again after trouble.
    pub fn recoveries(&self) -> Recoveries {
        self.shared.recovered.subscribe()
    }
}

impl<S> Layer<S> for ApiLayer {
    type Service = ApiService<S>;

    fn layer(&self, inner: S) -> ApiService<S> {
        ApiService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ApiService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B, RB> Service<http::Request<B>> for ApiService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<http::Response<RB>, BoxError>>;

    // Readiness is awaited in the call, after the push-back: a request waiting its turn must not
    // hold a slot of the service below.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let (verb, resource) = classify(
                request.method(),
                request.uri().path(),
                request.uri().query(),
            );
            shared.wait_turn().await;
            let answer = inner.oneshot(request);
            let answer = if verb == "watch" {
                answer.await.map_err(Into::into)
            } else {
                match tokio::time::timeout(shared.request_timeout, answer).await {
                    Ok(answer) => answer.map_err(Into::into),
                    Err(_) => {
                        shared.unanswered(verb, &resource, "<timeout>");
                        return Err(format!(
                            "no answer to {verb} {resource} within {:?} (api_request_timeout)",
                            shared.request_timeout
                        )
                        .into());
                    }
                }
            };
            match &answer {
                Ok(response) => {
                    shared.answered(verb, &resource, response.status(), response.headers())
                }
                Err(_) => shared.unanswered(verb, &resource, "<error>"),
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_the_api_server_names_them() {
        let get = Method::GET;
        let cases = [
            (&get, "/api/v1/nodes/n1", None, ("get", "nodes")),
            (
                &Method::PATCH,
                "/api/v1/nodes/n1/status",
                None,
                ("patch", "nodes/status"),
            ),
            (
                &Method::PATCH,
                "/api/v1/namespaces/ml/pods/vllm-0/status",
                None,
                ("patch", "pods/status"),
            ),
            (
                &get,
                "/api/v1/pods",
                Some("fieldSelector=spec.nodeName%3Dn1&resourceVersion=0"),
                ("list", "pods"),
            ),
            (
                &get,
                "/api/v1/pods",
                Some("watch=true&resourceVersion=12&allowWatchBookmarks=true"),
                ("watch", "pods"),
            ),
            (
                &Method::POST,
                "/api/v1/namespaces/default/events",
                None,
                ("create", "events"),
            ),
            (
                &get,
                "/apis/resource.k8s.io/v1/resourceslices",
                Some("watch=1"),
                ("watch", "resourceslices"),
            ),
            (&get, "/api/v1/namespaces/ml", None, ("get", "namespaces")),
            (&get, "/version", None, ("list", "other")),
        ];
        for (method, path, query, (verb, resource)) in cases {
            assert_eq!(
                classify(method, path, query),
                (verb, resource.to_string()),
                "{method} {path}"
            );
        }
    }

    /// kube-apiserver's 429s carry `Retry-After: 1` (API Priority and Fairness and max-inflight,
    /// `staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go`) or 5 (shutting down,
    /// `with_retry_after.go`), as seconds.
    #[test]
    fn retry_after_is_read_from_429s_and_5xx_in_seconds_and_bounded() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::RETRY_AFTER, value.parse().unwrap());
            headers
        };
        let too_many = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(
            retry_after(too_many, &with("1")),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(StatusCode::SERVICE_UNAVAILABLE, &with("5")),
            Some(Duration::from_secs(5))
        );
        assert_eq!(retry_after(too_many, &with("86400")), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(too_many, &HeaderMap::new()), None);
        assert_eq!(
            retry_after(too_many, &with("Wed, 21 Oct 2026 07:28:00 GMT")),
            None,
            "a date: the loops' own backoff decides"
        );
        assert_eq!(retry_after(StatusCode::CONFLICT, &with("1")), None);
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_with_each_wait_within_half_its_step() {
        let mut backoff = Backoff::default();
        let longest: Vec<u64> = (0..8).map(|_| backoff.failed(0.0).as_secs()).collect();
        assert_eq!(longest, [1, 2, 4, 8, 16, 32, 60, 60]);
        backoff.succeeded();
        assert_eq!(
            backoff.failed(0.999_999),
            Duration::from_secs(1).mul_f64(0.5000005)
        );
        let drawn = backoff.failed_now();
        assert!(
            drawn > Duration::from_secs(1) && drawn <= Duration::from_secs(2),
            "{drawn:?}"
        );
    }

    type Answer = http::Response<()>;

    /// A server answering from `script` in turn (then 200), recording when each request came.
    fn server(
        script: Vec<(u16, Option<&'static str>)>,
    ) -> (
        Arc<Mutex<Vec<Instant>>>,
        impl Service<
                http::Request<()>,
                Response = Answer,
                Error = BoxError,
                Future = impl Send + 'static,
            > + Clone
            + Send
            + 'static,
    ) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(std::collections::VecDeque::from(script)));
        let record = seen.clone();
        let service = tower::service_fn(move |_request: http::Request<()>| {
            record.lock().unwrap().push(Instant::now());
            let (code, retry) = script.lock().unwrap().pop_front().unwrap_or((200, None));
            async move {
                let mut answer = http::Response::builder().status(code);
                if let Some(retry) = retry {
                    answer = answer.header("Retry-After", retry);
                }
                Ok::<_, BoxError>(answer.body(()).unwrap())
            }
        });
        (seen, service)
    }

    fn patch() -> http::Request<()> {
        http::Request::patch("/api/v1/nodes/n1/status")
            .body(())
            .unwrap()
    }

    fn counted(registry: &Registry, code: &str) -> u64 {
        registry
            .gather()
            .iter()
            .flat_map(|f| f.get_metric())
            .filter(|m| m.get_label().iter().any(|l| l.value() == code))
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_429_no_request_leaves_before_the_servers_retry_after() {
        let registry = Registry::new();
        let layer = ApiLayer::new(&registry, Duration::from_secs(30)).unwrap();
        let (seen, inner) = server(vec![(429, Some("2"))]);
        let mut service = layer.layer(inner);
        let first = service.call(patch()).await.unwrap();
        assert_eq!(first.status(), 429);
        // Another component's request, right after: it waits its turn.
        let other = service.call(
            http::Request::get("/api/v1/pods?watch=true")
                .body(())
                .unwrap(),
        );
        let answered = other.await.unwrap();
        assert_eq!(answered.status(), 200);
        let times = seen.lock().unwrap().clone();
        let waited = times[1] - times[0];
        assert!(
            waited >= Duration::from_secs(2) && waited <= Duration::from_secs(3),
            "{waited:?}: Retry-After 2 s plus up to half of it"
        );
        assert_eq!(counted(&registry, "429"), 1);
        assert_eq!(counted(&registry, "200"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_loops_are_told_once_when_the_server_answers_again() {
        let registry = Registry::new();
        let layer = ApiLayer::new(&registry, Duration::from_secs(30)).unwrap();
        let mut recoveries = layer.recoveries();
        let (_, inner) = server(vec![
            (200, None),
            (503, None),
            (500, None),
            (404, None),
            (200, None),
        ]);
        let mut service = layer.layer(inner);
        let mut told = Vec::new();
        for _ in 0..5 {
            service.call(patch()).await.unwrap();
            told.push(recoveries.has_changed().unwrap());
            recoveries.mark_unchanged();
        }
        // An answer, even a 404, after the 5xx is the server working again; nothing else is news.
        assert_eq!(told, [false, false, false, true, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_an_answer_times_out_but_a_watch_does_not() {
        let registry = Registry::new();
        let layer = ApiLayer::new(&registry, Duration::from_secs(30)).unwrap();
        let silent = tower::service_fn(|_request: http::Request<()>| async {
            std::future::pending::<Result<Answer, BoxError>>().await
        });
        let mut service = layer.layer(silent);
        let error = service.call(patch()).await.unwrap_err();
        assert!(error.to_string().contains("api_request_timeout"), "{error}");
        assert_eq!(counted(&registry, "<timeout>"), 1);
        let watch = service.call(
            http::Request::get("/api/v1/pods?watch=true")
                .body(())
                .unwrap(),
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(600), watch)
                .await
                .is_err(),
            "a watch waits as long as the server keeps it"
        );
    }
}
