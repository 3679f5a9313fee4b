//! What the agent costs the API server, against the real one (testbed::cluster::control_plane) through the
//! recording proxy that pushes back on demand (testbed::cluster::fault_proxy): in the steady state the node's
//! conditions are written once a heartbeat and a gated pod only when its verdict changes; a
//! restart writes nothing the node and its pods already show; and when the server pushes back
//! (API Priority and Fairness' 429 with `Retry-After`, 503, a watch ended or expired, no answer at
//! all) the agent waits as asked, relists only when told to, writes the latest verdict once the
//! server answers, says so once, and never holds up `/metrics` or SIGTERM.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mlnode_testbed as testbed;
use serde_json::json;
use testbed::agent::{sample, Agent, EXIT_BOUND};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::fault_proxy::Recorded;
use testbed::cluster::pods::gated_vllm_pod;
use testbed::models::PlainModel;

const GATE: &str = "mlnode.dev/ModelVerified";
const SHARD: &str = "model-00001-of-00002.safetensors";

/// A node with one gated pod serving `llama`, and its model.
struct Node {
    cluster: ApiOnlyNode,
    model: PlainModel,
    _manifest_dir: tempfile::TempDir,
    manifest: std::path::PathBuf,
}

impl Node {
    fn new() -> Result<Node, String> {
        let cluster = ApiOnlyNode::gpu(&[])?;
        cluster.put_pod(&gated_vllm_pod(
            "",
            "vllm-0",
            cluster.name(),
            "/var/lib/models",
            json!({"mlnode.dev/model": "llama"}),
        ));
        let model = PlainModel::new();
        let (dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
        Ok(Node {
            cluster,
            model,
            _manifest_dir: dir,
            manifest,
        })
    }

    /// The agent with readiness rounds every 200 ms, the node's heartbeat every `heartbeat`, and
    /// `extra` top-level settings.
    fn agent(&self, heartbeat: &str, extra: &str) -> Agent {
        let config = format!(
            "start_jitter: 0s\n{extra}nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: {heartbeat}\n{}    host_path: /var/lib/models/llama\n",
            testbed::agent::model_config("llama", self.model.root(), &self.manifest)
        );
        self.cluster.start_agent(&config)
    }

    /// A node whose agent (as [`Node::agent`] starts it) has verified the model and set the
    /// pod's gate True.
    fn serving(heartbeat: &str, extra: &str) -> Result<(Node, Agent), String> {
        let node = Node::new()?;
        let agent = node.agent(heartbeat, extra);
        node.wait_for_gate("True");
        Ok((node, agent))
    }

    fn gate(&self) -> String {
        self.cluster.pod_condition("vllm-0", GATE)["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn wait_for_gate(&self, status: &str) {
        testbed::wait_until(
            &format!("the pod's gate {status}"),
            Duration::from_secs(20),
            || {
                (self.gate() == status)
                    .then_some(())
                    .ok_or_else(|| self.gate())
            },
        );
    }

    fn wait_for_node_verdict(&self, status: &str) {
        testbed::wait_until(
            &format!("the node's ModelCacheVerified {status}"),
            Duration::from_secs(20),
            || {
                let c = self.cluster.condition("ModelCacheVerified");
                (c["status"] == status).then_some(()).ok_or(c.to_string())
            },
        );
    }

    /// A second gated pod serving `llama`, `vllm-1`.
    fn add_new_pod(&self) {
        self.cluster.put_pod(&gated_vllm_pod(
            "",
            "vllm-1",
            self.cluster.name(),
            "/var/lib/models",
            json!({"mlnode.dev/model": "llama"}),
        ));
    }

    fn wait_for_new_pods_gate(&self, status: &str) {
        testbed::wait_until(
            &format!("vllm-1's gate {status}"),
            Duration::from_secs(20),
            || {
                let c = self.cluster.pod_condition("vllm-1", GATE);
                (c["status"] == status).then_some(()).ok_or(c.to_string())
            },
        );
    }

    fn corrupt(&self) {
        let mut bytes = std::fs::read(self.model.path(SHARD)).unwrap();
        bytes[1000] ^= 0xff;
        std::fs::write(self.model.path(SHARD), bytes).unwrap();
    }

    /// The requests since `mark` (an index into the server's record).
    fn since(&self, mark: usize) -> Vec<Recorded> {
        self.cluster.requests().split_off(mark)
    }
}

fn is(request: &Recorded, method: &str, path_end: &str) -> bool {
    request.method == method && request.resource_path().ends_with(path_end)
}

fn count(requests: &[Recorded], method: &str, path_end: &str) -> usize {
    requests.iter().filter(|r| is(r, method, path_end)).count()
}

fn counted(agent: &Agent, verb: &str, resource: &str, code: &str) -> f64 {
    sample(
        &agent.metrics(),
        "mlnode_kube_requests_total",
        &[("verb", verb), ("resource", resource), ("code", code)],
    )
    .unwrap_or(0.0)
}

/// Until the agent's `name{labels}` reaches `at_least`.
fn wait_for_sample(agent: &Agent, name: &str, labels: &[(&str, &str)], at_least: f64) {
    let what = format!("{name}{labels:?} >= {at_least}");
    agent.wait_for(&what, Duration::from_secs(20), |m| {
        sample(m, name, labels).is_some_and(|n| n >= at_least)
    });
}

/// Until the agent has counted `at_least` requests of `verb` `resource` answered `code`.
fn wait_for_requests(agent: &Agent, verb: &str, resource: &str, code: &str, at_least: f64) {
    let labels = [("verb", verb), ("resource", resource), ("code", code)];
    wait_for_sample(agent, "mlnode_kube_requests_total", &labels, at_least);
}

/// The pods the agent lists and watches (the node's pods, by field selector).
fn pod_reads(requests: &[Recorded]) -> (Vec<&Recorded>, Vec<&Recorded>) {
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/api/v1/pods?"))
        .partition(|r| !r.path.contains("watch=true") && !r.path.contains("watch=1"))
}

#[test]
fn in_the_steady_state_the_node_is_written_each_heartbeat_and_the_pod_once() {
    let (node, agent) = testbed::needs!(Node::serving("1s", ""));
    // The round that wrote the node's verdict sent its events too: one round later, only the
    // steady state is left.
    node.wait_for_node_verdict("True");
    let skipped = [("result", "skipped")];
    let rounds = sample(
        &agent.metrics(),
        "mlnode_node_condition_updates_total",
        &skipped,
    )
    .unwrap_or(0.0);
    wait_for_sample(
        &agent,
        "mlnode_node_condition_updates_total",
        &skipped,
        rounds + 1.0,
    );
    let mark = node.cluster.requests().len();
    // Four heartbeats of the node: the pod's verdict has not changed, so it is not written again.
    testbed::wait_until("four heartbeats", Duration::from_secs(20), || {
        let n = count(
            &node.since(mark),
            "PATCH",
            &format!("/nodes/{}/status", node.cluster.name()),
        );
        (n >= 4).then_some(()).ok_or(n.to_string())
    });
    let requests = node.cluster.requests();
    let steady = node.since(mark);
    assert_eq!(
        count(&steady, "PATCH", "/pods/vllm-0/status"),
        0,
        "the gate is written when its verdict changes, never to refresh it"
    );
    let pod_status = count(&requests, "PATCH", "/pods/vllm-0/status");
    let other: Vec<_> = steady
        .iter()
        .filter(|r| !is(r, "PATCH", "/status"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        other.is_empty(),
        "nothing but heartbeats in the steady state: {other:?}"
    );
    // One LIST and one WATCH of the node's pods since the start, from the API server's cache.
    let (lists, watches) = pod_reads(&requests);
    assert_eq!(
        (lists.len(), watches.len()),
        (1, 1),
        "{lists:?} {watches:?}"
    );
    assert!(
        lists[0].path.contains("resourceVersion=0"),
        "{:?}",
        lists[0]
    );

    // Scrapes cost the API server nothing.
    let before = node.cluster.requests().len();
    let heartbeats_before = count(&node.cluster.requests(), "PATCH", "/status");
    for _ in 0..20 {
        agent.metrics();
    }
    let after = node.cluster.requests();
    assert_eq!(
        after.len() - before,
        count(&after, "PATCH", "/status") - heartbeats_before,
        "a scrape sent a request"
    );

    // The agent counts what the server saw, by the server's own names.
    assert_eq!(
        counted(&agent, "patch", "pods/status", "200"),
        pod_status as f64
    );
    assert_eq!(counted(&agent, "list", "pods", "200"), 1.0);
    assert_eq!(counted(&agent, "get", "nodes", "200"), 1.0);
    let written = counted(&agent, "patch", "nodes/status", "200");
    let seen = count(&node.cluster.requests(), "PATCH", "/status") - pod_status;
    assert!(
        written >= 5.0 && (seen as f64 - written).abs() <= 1.0,
        "agent counted {written}, server saw {seen}"
    );
}

#[test]
fn a_restart_writes_nothing_the_node_and_its_pods_already_show() {
    let (node, mut first) = testbed::needs!(Node::serving("1h", ""));
    wait_for_sample(
        &first,
        "mlnode_node_condition_updates_total",
        &[("result", "skipped")],
        1.0,
    );
    assert_eq!(first.terminate().0, Some(0));

    let mark = node.cluster.requests().len();
    let second = node.agent("1h", "");
    wait_for_sample(
        &second,
        "mlnode_node_condition_updates_total",
        &[("result", "skipped")],
        3.0,
    );
    let since = node.since(mark);
    let writes: Vec<String> = since
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {} {}", r.method, r.path, r.body))
        .collect();
    // The model's verdict is carried over from the previous agent's record: the one node write a
    // restart may make says so ("unchanged since a previous agent of this boot"); the pod's gate
    // already shows True and is not written at all.
    assert_eq!(
        count(&since, "PATCH", "/pods/vllm-0/status"),
        0,
        "{writes:?}"
    );
    assert!(
        count(&since, "PATCH", "/status") <= 1,
        "at most one node status write: {writes:?}"
    );
    assert_eq!(
        count(&since, "GET", &format!("/nodes/{}", node.cluster.name())),
        1
    );
    assert_eq!(node.gate(), "True");
}

/// Arrivals closer than this belong to one burst: the requests the agent's components had waiting.
const BURST: Duration = Duration::from_millis(500);

#[test]
fn a_429_holds_every_request_for_its_retry_after_and_the_latest_verdict_lands_after() {
    let (node, agent) = testbed::needs!(Node::serving("1s", ""));
    *node.cluster.api.state.throttle.lock().unwrap() = Some(2);
    let mark = node.cluster.requests().len();
    let throttled_at = Instant::now();
    // The model fails while the server refuses: the verdict must reach the node and the pod later.
    node.corrupt();
    agent.wait_for("the model failed", Duration::from_secs(20), |m| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(0.0)
    });
    testbed::wait_until("three bursts refused", Duration::from_secs(30), || {
        let n = bursts(&node.since(mark)).len();
        (n >= 3).then_some(()).ok_or(n.to_string())
    });
    // /metrics answers at once while every request of the agent waits.
    let scrape = Instant::now();
    assert!(counted(&agent, "patch", "nodes/status", "429") >= 1.0);
    assert!(scrape.elapsed() < Duration::from_secs(1));
    *node.cluster.api.state.throttle.lock().unwrap() = None;
    let throttled = node.since(mark);
    let bursts = bursts(&throttled);
    for pair in bursts.windows(2) {
        let (end, next) = (pair[0].1, pair[1].0);
        assert!(
            next.duration_since(end) >= Duration::from_secs(2),
            "a request {:?} after a 429 asking for 2 s: {:?}",
            next.duration_since(end),
            throttled
                .iter()
                .map(|r| (r.at.duration_since(throttled_at), &r.path))
                .collect::<Vec<_>>()
        );
    }

    node.wait_for_gate("False");
    node.wait_for_node_verdict("False");
    agent.wait_for_log("the server answers again", Duration::from_secs(20), |log| {
        log.contains("the API server answers again")
    });
    let log = agent.log();
    assert_eq!(
        log.matches("the API server asks its clients to wait")
            .count(),
        1,
        "said once: {log}"
    );
}

/// The first and last arrival of each burst of requests.
fn bursts(requests: &[Recorded]) -> Vec<(Instant, Instant)> {
    let mut bursts: Vec<(Instant, Instant)> = Vec::new();
    for request in requests {
        match bursts.last_mut() {
            Some((_, last)) if request.at.duration_since(*last) < BURST => *last = request.at,
            _ => bursts.push((request.at, request.at)),
        }
    }
    bursts
}

#[test]
fn a_server_that_is_down_is_retried_with_a_doubling_wait() {
    let (node, agent) = testbed::needs!(Node::serving("1s", ""));
    node.cluster.api.state.down.store(true, Ordering::Relaxed);
    let mark = node.cluster.requests().len();
    // The readiness controller's attempts: the refused write, then reads of the node (after a
    // failure it reads what the node shows before writing again).
    let attempts = || -> Vec<Instant> {
        node.since(mark)
            .iter()
            .filter(|r| {
                r.path
                    .starts_with(&format!("/api/v1/nodes/{}", node.cluster.name()))
            })
            .map(|r| r.at)
            .collect()
    };
    testbed::wait_until("four refused attempts", Duration::from_secs(30), || {
        let n = attempts().len();
        (n >= 4).then_some(()).ok_or(n.to_string())
    });
    let attempts = attempts();
    // Waits of 1, 2 and 4 s, each drawn between half its step and the step: 3.5 s at least.
    assert!(
        attempts[3].duration_since(attempts[0]) >= Duration::from_millis(3500),
        "{:?}",
        attempts
            .windows(2)
            .map(|w| w[1].duration_since(w[0]))
            .collect::<Vec<_>>()
    );
    assert!(
        counted(&agent, "patch", "nodes/status", "503") + counted(&agent, "get", "nodes", "503")
            >= 4.0
    );
    node.cluster
        .api
        .state
        .down
        .store(false, std::sync::atomic::Ordering::Relaxed);
    agent.wait_for_log("back in sync", Duration::from_secs(40), |log| {
        log.contains("API server reachable again")
    });
}

#[test]
fn a_watch_the_server_ends_is_resumed_and_one_it_expires_is_listed_again() {
    let (node, _agent) = testbed::needs!(Node::serving("1h", ""));
    testbed::wait_until("the pods watched", Duration::from_secs(20), || {
        let requests = node.cluster.requests();
        (!pod_reads(&requests).1.is_empty())
            .then_some(())
            .ok_or_else(String::new)
    });
    let mark = node.cluster.requests().len();
    node.cluster.api.end_watches();
    testbed::wait_until("the watch resumed", Duration::from_secs(20), || {
        let since = node.since(mark);
        let (_, watches) = pod_reads(&since);
        (!watches.is_empty())
            .then_some(())
            .ok_or(format!("{since:?}"))
    });
    let since = node.since(mark);
    let (lists, watches) = pod_reads(&since);
    assert!(
        lists.is_empty(),
        "a watch ended normally is resumed, not relisted: {lists:?}"
    );
    assert!(
        !watches[0].path.contains("resourceVersion=0&")
            && watches[0].path.contains("resourceVersion="),
        "resumed from where it was: {:?}",
        watches[0]
    );

    let mark = node.cluster.requests().len();
    node.cluster.api.expire_watches();
    testbed::wait_until("listed again", Duration::from_secs(20), || {
        let since = node.since(mark);
        let (lists, watches) = pod_reads(&since);
        (!lists.is_empty() && !watches.is_empty())
            .then_some(())
            .ok_or(format!("{since:?}"))
    });
    let since = node.since(mark);
    let (lists, _) = pod_reads(&since);
    assert_eq!(lists.len(), 1, "{lists:?}");
    assert!(
        lists[0].path.contains("resourceVersion=0"),
        "from the cache: {:?}",
        lists[0]
    );
    // A pod added after the relist still gets its gate: nothing was lost.
    node.add_new_pod();
    node.wait_for_new_pods_gate("True");
}

#[test]
fn a_server_that_never_answers_times_out_and_holds_up_neither_metrics_nor_sigterm() {
    let (node, agent) = testbed::needs!(Node::serving("1s", "api_request_timeout: 1s\n"));
    node.cluster.api.state.stall.store(true, Ordering::Relaxed);
    wait_for_requests(&agent, "patch", "nodes/status", "<timeout>", 1.0);
    answers_and_exits_at_once(agent);
}

/// While the agent's requests wait on the API server: /metrics answers within a second, and
/// SIGTERM ends the agent cleanly within the bound.
fn answers_and_exits_at_once(mut agent: Agent) {
    let scrape = Instant::now();
    agent.metrics();
    assert!(scrape.elapsed() < Duration::from_secs(1));
    let (code, took) = agent.terminate();
    assert_eq!(code, Some(0));
    assert!(took < EXIT_BOUND, "{took:?}");
}

#[test]
fn sigterm_is_not_held_up_by_a_long_retry_after() {
    let (node, agent) = testbed::needs!(Node::serving("1s", ""));
    *node.cluster.api.state.throttle.lock().unwrap() = Some(300);
    // Whichever request came first was refused, and holds every other for 300 s.
    wait_for_sample(
        &agent,
        "mlnode_kube_requests_total",
        &[("code", "429")],
        1.0,
    );
    answers_and_exits_at_once(agent);
}

/// Ends the pods' watch while every request is refused, until `times` renewals were, then lets
/// requests through again.
fn refuse_watch_renewals(node: &Node, agent: &Agent, times: f64) {
    *node.cluster.api.state.throttle.lock().unwrap() = Some(1);
    node.cluster.api.end_watches();
    wait_for_requests(agent, "watch", "pods", "429", times);
    *node.cluster.api.state.throttle.lock().unwrap() = None;
}

/// A watch that failed (its renewal refused) and resumed with nothing to tell sends nothing: the
/// gates must not wait for it. A verdict that changes meanwhile reaches the pods last seen.
#[test]
fn a_verdict_reaches_the_pods_while_their_watch_resumes_quietly() {
    let (node, agent) = testbed::needs!(Node::serving("1h", ""));
    refuse_watch_renewals(&node, &agent, 1.0);
    node.corrupt();
    node.wait_for_gate("False");
}

/// After an outage each loop waits out its own back-off, but the first request the server answers
/// tells them all: the node's verdict, decided while the server was down, is written at once when
/// a pod's gate write (a new pod, no back-off of its own) finds the server back.
#[test]
fn the_server_answering_again_ends_every_loops_back_off() {
    let (node, agent) = testbed::needs!(Node::serving("1h", ""));
    node.cluster.api.state.down.store(true, Ordering::Relaxed);
    node.corrupt();
    // Long enough for the node's back-off to reach 8 s steps (1, 2, 4 s waits first).
    wait_for_sample(
        &agent,
        "mlnode_node_condition_updates_total",
        &[("result", "error")],
        4.0,
    );
    node.cluster.api.state.down.store(false, Ordering::Relaxed);
    node.add_new_pod();
    let answered = testbed::wait_until("the new pod's gate", Duration::from_secs(20), || {
        let c = node.cluster.pod_condition("vllm-1", GATE);
        (c["status"] == "False")
            .then(Instant::now)
            .ok_or(c.to_string())
    });
    node.wait_for_node_verdict("False");
    assert!(
        answered.elapsed() < Duration::from_secs(2),
        "the node's verdict {:?} after the server answered a pod write",
        answered.elapsed()
    );
}

/// The pod watch backs off too (kube's 0.8 s doubling to 30 s), and resumes at once when another
/// request finds the server answering again: a pod created while its renewal was refused is seen
/// then, not a back-off later.
#[test]
fn a_refused_watch_resumes_when_the_server_answers_again() {
    let (node, agent) = testbed::needs!(Node::serving("1h", ""));
    // Four refused renewals: the watch's next wait is 6 s or more.
    refuse_watch_renewals(&node, &agent, 4.0);
    node.add_new_pod();
    // The model fails: the node's write is the request that finds the server back.
    node.corrupt();
    node.wait_for_node_verdict("False");
    let answered = Instant::now();
    node.wait_for_new_pods_gate("False");
    assert!(
        answered.elapsed() < Duration::from_secs(2),
        "the new pod seen {:?} after the server answered the node's write",
        answered.elapsed()
    );
}
