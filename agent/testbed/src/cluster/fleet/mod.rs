//! A fleet of agents on a real control plane of its own (crate::cluster::private_control_plane): each agent
//! the release or test binary as its DaemonSet runs it, on a Node of its own, with its own gated
//! vLLM pods bound there, its own small model, and its own token bound to its own pod (the
//! node-name claim), under the shipped RBAC, admission policies and Priority and Fairness example,
//! applied as users apply them (namespace `mlnode-system`). The server counts what the agents ask
//! in its audit log (crate::cluster::audit); its CPU and memory and etcd's are read from the kernel.
//!
//! The scenarios of docs/performance.md ("The fleet on a real API server") are written once
//! (`scenarios.rs`) from the fleet's actions here, so the benchmark (agent/benches/fleet.rs,
//! hundreds of agents) and the test (fleet.rs, a handful) run the same code; what a phase cost
//! is read in `measure.rs`, and the server's other clients run from `clients.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agent::{sample, Agent};
use crate::cluster::audit::{self, AuditReader, Request};
use crate::cluster::control_plane::{self, daemonset_pod, ControlPlane, CONFINING_KINDS};
use crate::cluster::pods::gated_vllm_pod;
use crate::cluster::private_control_plane::PrivateControlPlane;
use crate::models::PlainModel;
use crate::process_stats::{cpu_seconds, peak_rss_mib, reset_peak};

mod clients;
mod measure;
mod scenarios;

use clients::{Flood, OtherClient, CLIENT_TIMEOUT, FLOOD_CLIENTS};
use measure::{delta, peak_cores, request_p99, sum_of};
pub use scenarios::{run_scenarios, Timing};

/// The readiness gate the fleet's pods list.
pub const GATE: &str = "mlnode.dev/ModelVerified";
const NAMESPACE: &str = "mlnode-system";
/// Who every agent is to the server: the DaemonSet's one service account.
const AGENT_USER: &str = "system:serviceaccount:mlnode-system:mlnode-agent";
const MODEL_PATH: &str = "/var/lib/models/llama";
/// The weight file a "change on the node" rewrites.
const CHANGED_FILE: &str = "model-00002-of-00002.safetensors";

/// How large a fleet, and how fast its agents' clocks run.
pub struct Settings {
    pub agents: usize,
    pub pods_per_node: usize,
    /// How much faster than real time the agents' own clocks run: `readiness.interval` (10 s)
    /// and `readiness.heartbeat` (5 min) are divided by it. The server's are not: a watch lasts
    /// the 290 s the client asks for, in real time.
    pub scale: f64,
}

/// One Node of the fleet, its model and its agent.
pub struct FleetNode {
    pub name: String,
    model: PlainModel,
    manifest: PathBuf,
    kubeconfig: PathBuf,
    agent: Option<Agent>,
}

/// The fleet: its control plane of its own, its nodes and their agents.
pub struct Fleet {
    pub server: PrivateControlPlane,
    pub admin: ControlPlane,
    /// A cluster-admin service account's token in kube-system, for the harness's own reads and
    /// writes (a kube-system controller to Priority and Fairness: another client of the server).
    operator: String,
    pub inference: String,
    pub nodes: Vec<FleetNode>,
    pub settings: Settings,
    generation: usize,
    /// Nodes whose model is changed on disk: their verdict, and their pods' gates, must be False.
    broken: BTreeSet<usize>,
    audit: AuditReader,
    /// The current phase's start, and the moments its scenario named.
    phase_started: Instant,
    marks: Vec<(&'static str, f64)>,
    /// What the audit log said of the agents since the current phase began.
    recorded: Vec<Request>,
    /// The running kube-apiserver's pid, for the CPU sampler; CPU of earlier ones is kept in
    /// `retired_apiserver_cpu`.
    apiserver_pid: Arc<AtomicU32>,
    retired_apiserver_cpu: f64,
    dir: tempfile::TempDir,
}

/// What one phase cost, as the server and the kernel saw it.
pub struct Phase {
    pub name: &'static str,
    pub seconds: f64,
    /// The agents' requests, from the audit log.
    pub requests: Vec<Request>,
    pub apiserver_cpu_seconds: f64,
    pub etcd_cpu_seconds: f64,
    /// The most kube-apiserver used in any one second of the phase, in cores.
    pub apiserver_peak_cores: f64,
    pub apiserver_peak_mib: f64,
    pub etcd_peak_mib: f64,
    /// `apiserver_flowcontrol_dispatched_requests_total` and `..._rejected_requests_total` for the
    /// agents' FlowSchema, over the phase.
    pub dispatched: f64,
    pub rejected: f64,
    /// The 99th percentile of `apiserver_request_duration_seconds` over the phase, every client's
    /// requests but WATCH and CONNECT (the upstream SLO's scope), in seconds: the bucket bound.
    pub server_p99: Option<f64>,
    /// The latencies of another client (a kube-system controller's reads and writes) while the
    /// phase ran, seconds, when one ran.
    pub other_client: Vec<f64>,
    /// The watches open on the server as the phase ended, every client's
    /// (`apiserver_longrunning_requests{verb="WATCH"}`).
    pub open_watches: f64,
    /// Moments the scenario named, seconds into the phase: e.g. when the server answered again.
    pub marks: Vec<(&'static str, f64)>,
    /// Every agent's process id as the phase ended.
    pub agent_pids: Vec<u32>,
}

impl Phase {
    pub fn writes(&self) -> usize {
        self.requests.iter().filter(|r| r.is_write()).count()
    }

    pub fn of(&self, verb: &str, resource: &str) -> usize {
        self.requests
            .iter()
            .filter(|r| r.verb == verb && r.resource == resource)
            .count()
    }

    /// The most requests of `verb` on `resource` answered `code` any one node's agent made.
    pub fn most_by_one_node(&self, verb: &str, resource: &str, code: u16) -> usize {
        audit::by_node(
            self.requests
                .iter()
                .filter(|r| r.verb == verb && r.resource == resource && r.code == code),
        )
        .into_values()
        .max()
        .unwrap_or(0)
    }

    /// The mean time between one node's successive requests that `which` selects, over every
    /// node with two or more: a rate free of where the phase's window falls.
    pub fn mean_interval(&self, which: impl Fn(&Request) -> bool) -> Option<f64> {
        let mut by_node = BTreeMap::<&str, Vec<f64>>::new();
        for r in self.requests.iter().filter(|r| which(r)) {
            by_node.entry(&r.node).or_default().push(r.at);
        }
        let intervals: Vec<f64> = by_node
            .into_values()
            .filter(|times| times.len() >= 2)
            .map(|mut times| {
                times.sort_by(f64::total_cmp);
                (times[times.len() - 1] - times[0]) / (times.len() - 1) as f64
            })
            .collect();
        (!intervals.is_empty()).then(|| intervals.iter().sum::<f64>() / intervals.len() as f64)
    }

    /// One line: what the phase took and cost the server.
    pub fn summary(&self) -> String {
        format!(
            "{}: {:.1} s {:?}; kube-apiserver {:.1} CPU s (peak {:.2} cores, {:.0} MiB), etcd {:.1} CPU s ({:.0} MiB); {} agent requests, {} writes: {:?}",
            self.name,
            self.seconds,
            self.marks,
            self.apiserver_cpu_seconds,
            self.apiserver_peak_cores,
            self.apiserver_peak_mib,
            self.etcd_cpu_seconds,
            self.etcd_peak_mib,
            self.requests.len(),
            self.writes(),
            self.counts()
        )
    }

    pub fn counts(&self) -> audit::Counts {
        audit::counts(&self.requests)
    }

    pub fn other_client_p99(&self) -> Option<f64> {
        percentile(&self.other_client, 0.99)
    }
}

/// The `q` quantile of `values`: the value at the rounded rank; None for none.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((last as f64) * q).round() as usize])
}

impl Fleet {
    /// The control plane started, the shipped objects and the Priority and Fairness example
    /// applied, `settings.agents` nodes registered with the agent's pod and `pods_per_node` gated
    /// pods on each, and every agent's model and token ready; no agent runs yet. Err when the
    /// control plane or kubectl is missing.
    pub fn new(settings: Settings) -> Result<Fleet, String> {
        let dir = tempfile::tempdir_in(crate::target_tmpdir()).unwrap();
        let (server, admin) = PrivateControlPlane::start(
            &dir.path().join("server"),
            &audit::policy_for(AGENT_USER),
            // Watches ended when kube-apiserver is told to stop, as clusters that care about
            // restart time set it; with the default (0) each open watch holds the old server up
            // to its request timeout (60 s) after it stopped listening.
            &["--shutdown-watch-termination-grace-period=5s"],
        )?;
        let objects = crate::renderers::kustomize::render_with("overlays/gpu", &[])?;
        let shipped: Vec<Value> = objects
            .iter()
            .filter(|o| CONFINING_KINDS.contains(&o["kind"].as_str().unwrap_or_default()))
            .cloned()
            .collect();
        admin
            .apply(&shipped)
            .unwrap_or_else(|refusal| panic!("the shipped objects were refused: {refusal}"));
        admin.admin(
            &[
                "apply",
                "-f",
                priority_and_fairness_example().to_str().unwrap(),
            ],
            "",
        );
        admin.admin(
            &[
                "create",
                "serviceaccount",
                "fleet-operator",
                "-n",
                "kube-system",
            ],
            "",
        );
        admin.admin(
            &[
                "create",
                "clusterrolebinding",
                "fleet-operator",
                "--clusterrole=cluster-admin",
                "--serviceaccount=kube-system:fleet-operator",
            ],
            "",
        );
        let operator = admin.token("kube-system", "fleet-operator", &["--duration=6h"]);
        let inference = admin.namespace("inference", json!({}));
        let names: Vec<String> = (0..settings.agents)
            .map(|i| format!("fleet-{i:04}"))
            .collect();
        admin.create(&control_plane::list(
            names
                .iter()
                .map(|n| control_plane::node(n, json!({})))
                .collect(),
        ));
        let daemonset = crate::renderers::kustomize::daemonset(&objects);
        admin.create(&control_plane::list(
            names
                .iter()
                .map(|n| daemonset_pod(daemonset, n, &format!("mlnode-agent-{n}")))
                .collect(),
        ));
        let apiserver_pid = Arc::new(AtomicU32::new(server.apiserver_pid()));
        let mut fleet = Fleet {
            server,
            admin,
            operator,
            inference,
            nodes: Vec::new(),
            settings,
            generation: 0,
            broken: BTreeSet::new(),
            audit: AuditReader::default(),
            recorded: Vec::new(),
            phase_started: Instant::now(),
            marks: Vec::new(),
            apiserver_pid,
            retired_apiserver_cpu: 0.0,
            dir,
        };
        for name in &names {
            let home = fleet.dir.path().join(name);
            std::fs::create_dir_all(&home).unwrap();
            let token = fleet.pod_token(&format!("mlnode-agent-{name}"));
            let model = PlainModel::new();
            let manifest = home.join("manifest.json");
            std::fs::write(&manifest, model.manifest_json("r1", true)).unwrap();
            fleet.nodes.push(FleetNode {
                name: name.clone(),
                kubeconfig: fleet.admin.token_kubeconfig(&token, &home),
                model,
                manifest,
                agent: None,
            });
        }
        fleet.create_gated_pods();
        Ok(fleet)
    }

    /// A TokenRequest for the agent's service account bound to `pod`, as the kubelet makes it
    /// for the pod's projected volume: the server adds the pod's node as the node-name claim.
    /// One request, where [`ControlPlane::pod_token`] starts a kubectl for each of hundreds.
    fn pod_token(&self, pod: &str) -> String {
        let (code, answer) = self.request(
            "POST",
            &format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts/mlnode-agent/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 21600, "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod}}}),
        );
        assert_eq!(code, 201, "TokenRequest for {pod}: {answer}");
        answer["status"]["token"].as_str().unwrap().to_string()
    }

    /// One request as the operator.
    fn request(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let content_type = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        self.admin
            .request_as(&self.operator, method, path, content_type, body)
    }

    fn create_gated_pods(&mut self) {
        let pods: Vec<Value> = self
            .nodes
            .iter()
            .flat_map(|node| {
                (0..self.settings.pods_per_node).map(|i| {
                    let name = format!("vllm-{}-{}-{i}", node.name, self.generation);
                    gated_vllm_pod(
                        "",
                        &name,
                        &node.name,
                        MODEL_PATH,
                        json!({"mlnode.dev/model": "llama"}),
                    )
                })
            })
            .collect();
        self.admin.create_pods(&self.inference, &pods);
    }

    fn config(&self, node: &FleetNode) -> String {
        let interval = (10_000.0 / self.settings.scale).max(100.0) as u64;
        let heartbeat = (300_000.0 / self.settings.scale).max(1_000.0) as u64;
        format!(
            "nvml:\n  enabled: false\nneuron:\n  enabled: false\nstartup:\n  enabled: true\nreadiness:\n  enabled: true\n  interval: {interval}ms\n  heartbeat: {heartbeat}ms\n{}    host_path: {MODEL_PATH}\n",
            crate::agent::model_config("llama", node.model.root(), &node.manifest)
        )
    }

    /// The agent of node `i` started, as its DaemonSet's pod runs it: its kubeconfig holds the
    /// token bound to its pod, and `MLNODE_NODE_NAME` names its node.
    pub fn start_agent(&mut self, i: usize) {
        let config = self.config(&self.nodes[i]);
        let node = &mut self.nodes[i];
        node.agent = Some(Agent::start_with_env(
            &config,
            &[
                ("KUBECONFIG", &node.kubeconfig),
                ("MLNODE_NODE_NAME", Path::new(&node.name)),
            ],
        ));
    }

    /// The agent of node `i` stopped (SIGTERM) and a new one started, as a DaemonSet rollout
    /// replaces its pod.
    pub fn restart_agent(&mut self, i: usize) {
        if let Some(mut agent) = self.nodes[i].agent.take() {
            agent.terminate();
        }
        self.start_agent(i);
    }

    pub fn start_agents(&mut self) {
        for i in 0..self.nodes.len() {
            self.start_agent(i);
        }
    }

    /// Every agent's process id, in node order.
    pub fn agent_pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .map(|n| n.agent.as_ref().map_or(0, Agent::pid))
            .collect()
    }

    /// The nodes whose agent watches its model's files (the kernel's per-user limit on inotify
    /// instances, 128 by default, is shared by every agent of this one machine; on a cluster each
    /// agent has a node's).
    pub fn watched_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].agent.as_ref().is_some_and(|a| {
                    sample(
                        &a.metrics(),
                        "mlnode_model_cache_watched",
                        &[("model_name", "llama")],
                    ) == Some(1.0)
                })
            })
            .collect()
    }

    /// Node `i`'s model changed on disk (one weight file rewritten with other bytes), as a bad
    /// copy or bit rot does: its verdict and its pods' gates must turn False.
    pub fn break_model(&mut self, i: usize) {
        let path = self.nodes[i].model.path(CHANGED_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        self.broken.insert(i);
    }

    /// Node `i`'s model written back as the manifest says.
    pub fn repair_model(&mut self, i: usize) {
        let node = &self.nodes[i];
        std::fs::write(
            node.model.path(CHANGED_FILE),
            &node.model.files[CHANGED_FILE],
        )
        .unwrap();
        self.broken.remove(&i);
    }

    /// The nodes, and the pods of the current generation, whose verdict is not yet what their
    /// model says on disk, as the server stores them.
    pub fn verdicts_missing(&self) -> Vec<String> {
        let expected = |node: &str| {
            let i = self.nodes.iter().position(|n| n.name == node);
            if i.is_some_and(|i| self.broken.contains(&i)) {
                "False"
            } else {
                "True"
            }
        };
        let mut missing = Vec::new();
        let (_, nodes) = self.request("GET", "/api/v1/nodes", &Value::Null);
        for node in nodes["items"].as_array().unwrap() {
            let name = node["metadata"]["name"].as_str().unwrap();
            let condition = control_plane::condition(node, "ModelCacheVerified");
            if condition["status"] != expected(name) {
                missing.push(format!("node {name}: {condition}"));
            }
        }
        let prefix = format!("-{}-", self.generation);
        let (_, pods) = self.request(
            "GET",
            &format!("/api/v1/namespaces/{}/pods", self.inference),
            &Value::Null,
        );
        let mut current = 0;
        for pod in pods["items"].as_array().unwrap() {
            let name = pod["metadata"]["name"].as_str().unwrap();
            let node = pod["spec"]["nodeName"].as_str().unwrap();
            if !name.contains(&prefix) || pod["metadata"]["deletionTimestamp"].is_string() {
                continue;
            }
            current += 1;
            let condition = control_plane::condition(pod, GATE);
            if condition["status"] != expected(node) {
                missing.push(format!("pod {name}: {condition}"));
            }
        }
        let wanted = self.nodes.len() * self.settings.pods_per_node;
        if current != wanted {
            missing.push(format!(
                "{current} pods of generation {} of {wanted}",
                self.generation
            ));
        }
        missing
    }

    /// Waits until [`Fleet::verdicts_missing`] names nothing: polls at most twice a second, each
    /// poll two LISTs of the whole fleet.
    pub fn await_verdicts(&self, what: &str, limit: Duration) {
        let mut polled = Instant::now() - Duration::from_secs(1);
        let mut state = String::new();
        crate::wait_until(what, limit, || {
            if polled.elapsed() >= Duration::from_millis(500) {
                polled = Instant::now();
                let missing = self.verdicts_missing();
                if missing.is_empty() {
                    return Ok(());
                }
                state = format!(
                    "{} missing, first: {:?}",
                    missing.len(),
                    &missing[..missing.len().min(5)]
                );
            }
            Err(state.clone())
        });
    }

    /// Each node's gated pods replaced by new ones of the next generation, as a Deployment's
    /// rollout replaces them: the old deleted (at once: no kubelet here confirms a graceful
    /// deletion), the new created and their kubelet status written.
    pub fn churn_pods(&mut self) {
        self.admin.admin(
            &[
                "delete",
                "pods",
                "--all",
                "-n",
                &self.inference,
                "--grace-period=0",
                "--force",
                "--wait=false",
            ],
            "",
        );
        self.generation += 1;
        self.create_gated_pods();
    }

    /// The agents' PriorityLevelConfiguration narrowed to nothing: no seat of its own, none
    /// borrowed, and requests rejected rather than queued, so every request of theirs is answered
    /// 429 by Priority and Fairness.
    pub fn narrow_priority_level(&self) {
        let patch = json!({"spec": {"limited": {"nominalConcurrencyShares": 0, "lendablePercent": 0,
            "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject", "queuing": null}}}});
        let (code, answer) = self.request(
            "PATCH",
            "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations/mlnode-agent",
            &patch,
        );
        assert_eq!(code, 200, "narrowing the agents' priority level: {answer}");
    }

    /// Waits until the server's Priority and Fairness has taken the narrowed level in: its
    /// `apiserver_flowcontrol_upper_limit_seats` is 0.
    pub fn await_level_closed(&self, limit: Duration) {
        crate::wait_until("the agents' priority level closed", limit, || {
            let seats = sample(
                &self.server_metrics(),
                "apiserver_flowcontrol_upper_limit_seats",
                &[("priority_level", "mlnode-agent")],
            );
            if seats == Some(0.0) {
                Ok(())
            } else {
                Err(format!("upper limit seats: {seats:?}"))
            }
        });
    }

    /// [`Flood`] for as long as `during` runs.
    pub fn flooded(&mut self, during: impl FnOnce(&mut Fleet)) {
        let running = Arc::new(AtomicBool::new(true));
        let token = self.admin.token(NAMESPACE, "mlnode-agent", &[]);
        let clients: Vec<_> = (0..FLOOD_CLIENTS)
            .map(|_| {
                let flood = Flood {
                    running: running.clone(),
                    client: self.admin.client(CLIENT_TIMEOUT),
                    server: self.admin.server().to_string(),
                    token: token.clone(),
                };
                std::thread::spawn(move || flood.run())
            })
            .collect();
        during(self);
        running.store(false, Ordering::Relaxed);
        for client in clients {
            client.join().unwrap();
        }
    }

    /// The example's PriorityLevelConfiguration applied again, as shipped.
    pub fn widen_priority_level(&self) {
        self.admin.admin(
            &[
                "apply",
                "-f",
                priority_and_fairness_example().to_str().unwrap(),
            ],
            "",
        );
    }

    /// kube-apiserver stopped (see [`PrivateControlPlane::stop_apiserver`]), `during` run while it
    /// is down, and started again on the same etcd.
    pub fn restart_apiserver(&mut self, graceful: bool, during: impl FnOnce(&mut Fleet)) {
        self.retired_apiserver_cpu += cpu_seconds(self.server.apiserver_pid());
        self.server.stop_apiserver(graceful);
        during(self);
        self.admin = self.server.start_apiserver();
        self.apiserver_pid
            .store(self.server.apiserver_pid(), Ordering::Relaxed);
        self.mark("server ready");
    }

    fn apiserver_cpu(&self) -> f64 {
        self.retired_apiserver_cpu + cpu_seconds(self.server.apiserver_pid())
    }

    /// The server's own metrics, text.
    fn server_metrics(&self) -> String {
        match self.request("GET", "/metrics", &Value::Null) {
            (200, Value::String(text)) => text,
            (code, answer) => panic!("the server's /metrics: {code} {answer}"),
        }
    }

    /// Runs `scenario` as one phase and says what it cost. With `other_client`, a kube-system
    /// controller reads a node and writes a ConfigMap, one after the other, for the whole phase,
    /// and each one's latency is kept.
    pub fn phase(
        &mut self,
        name: &'static str,
        other_client: bool,
        scenario: impl FnOnce(&mut Fleet),
    ) -> Phase {
        self.recorded();
        self.recorded.clear();
        let metrics_before = self.server_metrics();
        let (apiserver_before, etcd_before) =
            (self.apiserver_cpu(), cpu_seconds(self.server.etcd_pid()));
        reset_peak(self.server.apiserver_pid());
        reset_peak(self.server.etcd_pid());
        let running = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (running, pid) = (running.clone(), self.apiserver_pid.clone());
            std::thread::spawn(move || peak_cores(&running, &pid))
        };
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let probe = other_client.then(|| {
            let probe = OtherClient {
                running: running.clone(),
                latencies: latencies.clone(),
                client: self.admin.client(CLIENT_TIMEOUT),
                server: self.admin.server().to_string(),
                token: self.operator.clone(),
                node: self.nodes[0].name.clone(),
            };
            std::thread::spawn(move || probe.run())
        });
        let started = Instant::now();
        self.phase_started = started;
        self.marks.clear();
        scenario(self);
        let seconds = started.elapsed().as_secs_f64();
        running.store(false, Ordering::Relaxed);
        let apiserver_peak_cores = sampler.join().unwrap();
        if let Some(probe) = probe {
            probe.join().unwrap();
        }
        let metrics_after = self.server_metrics();
        let other_client = std::mem::take(&mut *latencies.lock().unwrap());
        let flow = |name: &str| {
            let select = |text: &str| sum_of(text, name, "flow_schema=\"mlnode-agent\"");
            delta(select(&metrics_before), select(&metrics_after))
        };
        Phase {
            name,
            seconds,
            requests: {
                self.recorded();
                std::mem::take(&mut self.recorded)
            },
            apiserver_cpu_seconds: self.apiserver_cpu() - apiserver_before,
            etcd_cpu_seconds: cpu_seconds(self.server.etcd_pid()) - etcd_before,
            apiserver_peak_cores,
            apiserver_peak_mib: peak_rss_mib(self.server.apiserver_pid()),
            etcd_peak_mib: peak_rss_mib(self.server.etcd_pid()),
            dispatched: flow("apiserver_flowcontrol_dispatched_requests_total"),
            rejected: flow("apiserver_flowcontrol_rejected_requests_total"),
            server_p99: request_p99(&metrics_before, &metrics_after),
            other_client,
            open_watches: sum_of(
                &metrics_after,
                "apiserver_longrunning_requests",
                "verb=\"WATCH\"",
            ),
            marks: std::mem::take(&mut self.marks),
            agent_pids: self.agent_pids(),
        }
    }

    /// Names this moment of the current phase (see [`Phase::marks`]).
    pub fn mark(&mut self, what: &'static str) {
        self.marks
            .push((what, self.phase_started.elapsed().as_secs_f64()));
    }

    /// The agents' requests the audit log holds since the phase began.
    fn recorded(&mut self) -> &[Request] {
        let new = self.audit.read(self.server.audit_logs());
        // The flood's requests are the service account's too, bound to no node.
        self.recorded
            .extend(new.into_iter().filter(|r| !r.node.is_empty()));
        &self.recorded
    }

    /// Waits until the agent of every node has made at least `at_least` requests that `which`
    /// selects since the phase began, as the server recorded them: e.g. each restarted agent's
    /// first LIST, each agent's heartbeats, a 429 for each.
    pub fn await_each_node(
        &mut self,
        what: &str,
        at_least: usize,
        limit: Duration,
        which: impl Fn(&Request) -> bool,
    ) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        crate::wait_until(what, limit, || {
            let by_node = audit::by_node(self.recorded().iter().filter(|r| which(r)));
            let short: Vec<&String> = names
                .iter()
                .filter(|n| by_node.get(n.as_str()).copied().unwrap_or(0) < at_least)
                .collect();
            if short.is_empty() {
                return Ok(());
            }
            let first = short[0];
            let theirs = audit::counts(self.recorded.iter().filter(|r| &r.node == first));
            Err(format!(
                "{} nodes short: {:?}; {first}'s requests in this phase: {theirs:?}",
                short.len(),
                &short[..short.len().min(5)]
            ))
        });
    }
}

fn priority_and_fairness_example() -> PathBuf {
    crate::repo_root().join("deploy/examples/api-priority-and-fairness.yaml")
}
