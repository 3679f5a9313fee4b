//! The readiness loop: decide the gates, write them to the node when they change (or every
//! heartbeat), post a Node event for each change, and manage the startup taint. API errors back
//! off and retry; nothing is written that the agent does not know to be true. When to read, write
//! and wait is decided by [`super::plan::Planner`]; this task talks to the API server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use kube::api::{Api, Patch, PatchParams};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::gates::{
    self, Gate, ACCELERATOR_HEALTHY, FABRIC_HEALTHY, MODEL_CACHE_VERIFIED, NETWORKING_READY,
};
use super::labels;
use super::memory;
use super::node::{
    conditions_patch, differs, has_taint, other_writer, own_conditions, taint_patch, transitions,
    FIELD_MANAGER,
};
use super::plan::Planner;
use super::settings::ReadinessSettings;
use crate::events;
use mlnode_core::health::{DeviceKind, FromNode, HealthSource, LatestReports};
use mlnode_core::metrics::{AgentMetrics, Subsystem};
use mlnode_core::state::{
    any_readiness_differs, readiness_of, ModelState, NodeRecords, NodeTaint, Readiness,
};

const OWN_TYPES: [&str; 2] = [MODEL_CACHE_VERIFIED, ACCELERATOR_HEALTHY];
/// After handing the monitors their records, how long the first round waits for them to conclude
/// (a look at each file, milliseconds; longer only while changed files are hashed), so that the
/// first write carries every gate rather than all but the models'.
const RESUME_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Retries of the taint's test-and-replace when the list changed between read and write.
const TAINT_ATTEMPTS: usize = 5;

/// `mlnode_readiness_gate{gate}` and `mlnode_node_condition_updates_total{result}`.
#[derive(Clone)]
pub struct ReadinessMetrics {
    gate: IntGaugeVec,
    updates: IntCounterVec,
    memory_errors: prometheus::IntCounter,
    repair_refused: prometheus::IntGauge,
}

impl ReadinessMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<ReadinessMetrics> {
        let gate = IntGaugeVec::new(
            Opts::new(
                "mlnode_readiness_gate",
                "1 when the readiness gate passes, 0 when it fails.",
            ),
            &["gate"],
        )?;
        let updates = IntCounterVec::new(
            Opts::new(
                "mlnode_node_condition_updates_total",
                "Node condition syncs: written (a change or the heartbeat), skipped (nothing to write), error (the API server refused or was unreachable).",
            ),
            &["result"],
        )?;
        let memory_errors = prometheus::IntCounter::new(
            "mlnode_readiness_memory_errors_total",
            "Reads of the node whose remembered faults (AcceleratorHealthy's message), verified caches' records (ModelCacheVerified's), clearing annotation or device-count labels could not be parsed; the live facts decide then, and the caches are hashed.",
        )?;
        let repair_refused = prometheus::IntGauge::new(
            "mlnode_readiness_repair_condition_refused",
            "1 while readiness.repair_condition is set and another writer (its field manager) owns that node condition, or NetworkingReady where the fabric is judged, so the agent does not write it.",
        )?;
        registry.register(Box::new(gate.clone()))?;
        registry.register(Box::new(repair_refused.clone()))?;
        registry.register(Box::new(updates.clone()))?;
        registry.register(Box::new(memory_errors.clone()))?;
        for result in ["written", "skipped", "error"] {
            updates.with_label_values(&[result]).inc_by(0);
        }
        Ok(ReadinessMetrics {
            gate,
            updates,
            memory_errors,
            repair_refused,
        })
    }

    pub fn set_gate(&self, gate: &str, ok: bool) {
        self.gate.with_label_values(&[gate]).set(i64::from(ok));
    }
}

/// Where the gates' facts come from.
pub struct Sources {
    pub models: Vec<Arc<ModelState>>,
    /// The accelerator collectors that run.
    pub health: Vec<Box<dyn HealthSource>>,
    /// Collectors required (`enabled: true`) but not running, with why.
    pub missing_collectors: Vec<String>,
    /// Where the controller says whether our taint is on the node (the verifiers' priority).
    pub node_taint: NodeTaint,
    /// Where it hands the monitors what a previous agent of this boot verified (at its first read
    /// of the node).
    pub node_records: NodeRecords,
    /// Where it leaves the accelerator reports of each round, for the pods' own gates.
    pub latest_reports: LatestReports,
}

pub struct Controller {
    client: kube::Client,
    recoveries: crate::api::Recoveries,
    nodes: Api<Node>,
    node_name: String,
    settings: ReadinessSettings,
    taint: Option<Taint>,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`): what the held XIDs written into
    /// `AcceleratorHealthy` are tied to.
    boot_id: String,
    sources: Sources,
    metrics: ReadinessMetrics,
    /// `mlnode_collector_up{collector="readiness"}`: 1 while syncs succeed.
    up: AgentMetrics,
}

/// What the loop remembers between rounds: the decisions' state, and the agent's conditions as
/// the node last showed them.
struct Memory {
    planner: Planner,
    conditions: BTreeMap<String, NodeCondition>,
    /// What a previous agent held on this boot (taken back at the first read of the node, which
    /// sets `since`), and the operator's clearing time.
    from_node: FromNode,
    /// The last trouble reading the node's memory, said once.
    memory_trouble: String,
    /// The node's labels under the agent's prefix, as it last showed them.
    labels: BTreeMap<String, String>,
    /// Who else writes the repair condition, as the node last showed it, and as last said.
    repair_writers: BTreeMap<&'static str, String>,
    repair_writers_said: BTreeMap<&'static str, String>,
}

impl Controller {
    pub fn new(
        client: kube::Client,
        recoveries: crate::api::Recoveries,
        node_name: String,
        settings: ReadinessSettings,
        sources: Sources,
        metrics: ReadinessMetrics,
        up: AgentMetrics,
    ) -> Controller {
        let taint = settings.startup_taint.as_ref().map(super::node::taint);
        Controller {
            nodes: Api::all(client.clone()),
            client,
            recoveries,
            boot_id: read_boot_id(&settings.boot_id_file),
            node_name,
            settings,
            taint,
            sources,
            metrics,
            up,
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut memory = Memory {
            planner: Planner::new(
                self.settings.interval.get(),
                self.settings.heartbeat.get(),
                self.taint.as_ref().map(|_| self.settings.taint_mode),
            ),
            conditions: BTreeMap::new(),
            from_node: FromNode::default(),
            memory_trouble: String::new(),
            labels: BTreeMap::new(),
            repair_writers: BTreeMap::new(),
            repair_writers_said: BTreeMap::new(),
        };
        let mut last_error = String::new();
        let mut recoveries = self.recoveries.clone();
        loop {
            // The node is read before the first gates are decided: they must include what a
            // previous agent on this boot held, never overwrite it with a premature True.
            let round = async {
                let first_read = memory.from_node.since.is_none();
                if let Err(e) = self.read_node_if_needed(&mut memory).await {
                    return (Err(e), readiness_of(&self.sources.models));
                }
                if first_read {
                    self.let_models_resume().await;
                }
                // The verdicts the gates are decided on: one given while this round writes wakes
                // the next at once, not an interval later.
                let decided_on = readiness_of(&self.sources.models);
                let gates = self.gates(&mut memory);
                for gate in &gates {
                    self.metrics.set_gate(gate.condition_type, gate.ok());
                }
                (self.sync(&gates, &mut memory).await, decided_on)
            };
            // A round waiting out the API server's push-back must not hold up the shutdown.
            let (synced, decided_on) = tokio::select! {
                _ = shutdown.cancelled() => return,
                synced = round => synced,
            };
            let in_sync = synced.is_ok();
            if in_sync {
                // What another loop's recovery said is old news to a loop in sync.
                recoveries.mark_unchanged();
            }
            let wait = memory.planner.round_done(in_sync, crate::api::draw());
            match synced {
                Ok(()) => {
                    self.up.set_up(Subsystem::Readiness, true);
                    if !last_error.is_empty() {
                        tracing::info!(node = %self.node_name, "API server reachable again; node conditions in sync");
                        last_error.clear();
                    }
                }
                Err(e) => {
                    self.up.set_up(Subsystem::Readiness, false);
                    self.metrics.updates.with_label_values(&["error"]).inc();
                    let message = e.to_string();
                    if message != last_error {
                        tracing::warn!(node = %self.node_name, error = %message, retry_in = ?wait, "cannot sync node conditions");
                        last_error = message;
                    }
                }
            }
            // A model that passes or fails its verification is said at once, not a round later;
            // while the API server fails, only the back-off decides.
            let model_changed = async {
                match in_sync {
                    true => any_readiness_differs(&self.sources.models, &decided_on).await,
                    false => std::future::pending().await,
                }
            };
            // A device's fault is judged at once too: a source's new reading wakes the round
            // (its reports change the conditions and the pods' gates only when they differ).
            let health_changed = async {
                let sources = &self.sources.health;
                match in_sync && !sources.is_empty() {
                    true => {
                        futures_util::future::select_all(sources.iter().map(|s| s.changed())).await;
                    }
                    false => std::future::pending().await,
                }
            };
            // While the API server fails, the back-off decides, unless the server is seen
            // answering again (another loop's request): then at once.
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = model_changed => {}
                _ = health_changed => {}
                Ok(()) = recoveries.changed(), if !in_sync => {}
            }
        }
    }

    /// Waits, at most [`RESUME_WAIT`], until no model is resuming a previous agent's verdict.
    async fn let_models_resume(&self) {
        let models = &self.sources.models;
        let resuming = || models.iter().any(|m| m.readiness() == Readiness::Resuming);
        let _ = tokio::time::timeout(RESUME_WAIT, async {
            while resuming() {
                any_readiness_differs(models, &readiness_of(models)).await;
            }
        })
        .await;
    }

    /// Reads the node when the planner needs it, from the API server's cache (`resourceVersion=0`,
    /// as informers list): what the agent learns from it is its own writes and the node's labels,
    /// and the cache trails etcd by milliseconds. The taint's guarded patch reads the latest.
    async fn read_node_if_needed(&self, memory: &mut Memory) -> Result<(), kube::Error> {
        if memory.planner.needs_read() {
            let first = memory.from_node.since.is_none();
            let node = self
                .nodes
                .get_with(&self.node_name, &kube::api::GetParams::any())
                .await?;
            self.saw_node(memory, &node);
            if first {
                if let Some(age) = heartbeat_age(&memory.conditions, &self.own_types()) {
                    memory.planner.node_heartbeat(age, Instant::now());
                }
            }
        }
        Ok(())
    }

    fn model_facts(&self) -> Vec<gates::ModelFacts> {
        self.sources
            .models
            .iter()
            .map(|m| gates::ModelFacts {
                name: m.name.clone(),
                readiness: m.readiness(),
                watched: m.is_watched(),
                verified_by: m.verified_by(),
            })
            .collect()
    }

    fn gates(&mut self, memory: &mut Memory) -> Vec<Gate> {
        let models = self.model_facts();
        let now = Instant::now();
        let reports: Vec<_> = self
            .sources
            .health
            .iter_mut()
            .map(|source| source.report(&memory.from_node, now))
            .collect();
        let held: mlnode_core::health::HeldFaults =
            reports.iter().flat_map(|r| r.held.clone()).collect();
        // The pods' gates wake only when a report changed (a fault, a recovery, a pod placed).
        self.sources.latest_reports.set_if_changed(Some(
            reports
                .iter()
                .filter(|r| r.kind != DeviceKind::Fabric)
                .cloned()
                .collect(),
        ));
        let missing = &self.sources.missing_collectors;
        let records = self
            .sources
            .models
            .iter()
            .filter_map(|m| Some((m.name.clone(), m.record()?)))
            .collect();
        let mut gates: Vec<Gate> =
            gates::model_cache_gate(&models, &memory::records_trailer(&self.boot_id, &records))
                .into_iter()
                .collect();
        gates.push(gates::accelerator_gate(
            missing,
            &reports,
            &memory::trailer(&self.boot_id, &held),
        ));
        gates.extend(gates::fabric_gate(&reports));
        if let Some(repair) = self.settings.repair_condition {
            gates.push(gates::repair_gate(repair.as_str(), missing, &reports));
            gates.extend(gates::networking_gate(&reports));
        }
        gates
    }

    /// The condition types this agent writes: its own, and the repair conditions when set.
    fn own_types(&self) -> Vec<&'static str> {
        let fabric = self.has_fabric().then_some(FABRIC_HEALTHY);
        OWN_TYPES
            .iter()
            .copied()
            .chain(fabric)
            .chain(self.repair_types())
            .collect()
    }

    fn has_fabric(&self) -> bool {
        self.sources
            .health
            .iter()
            .any(|source| source.kind() == DeviceKind::Fabric)
    }

    /// The conditions node-repair engines act on that this agent writes, with
    /// `readiness.repair_condition`: that one, and `NetworkingReady` where the fabric is judged.
    fn repair_types(&self) -> Vec<&'static str> {
        let Some(repair) = self.settings.repair_condition else {
            return Vec::new();
        };
        let networking = self.has_fabric().then_some(NETWORKING_READY);
        std::iter::once(repair.as_str()).chain(networking).collect()
    }

    /// Says once, in the log and as a Node event, when another writer takes a repair condition or
    /// leaves it: never run two writers of one condition (docs/readiness.md).
    async fn say_repair_writer(&self, memory: &mut Memory) {
        if memory.repair_writers == memory.repair_writers_said {
            return;
        }
        self.metrics
            .repair_refused
            .set(i64::from(!memory.repair_writers.is_empty()));
        for condition in self.repair_types() {
            let (now, said) = (
                memory.repair_writers.get(condition),
                memory.repair_writers_said.get(condition),
            );
            if now != said {
                self.say_writer(condition, now).await;
            }
        }
        memory.repair_writers_said = memory.repair_writers.clone();
    }

    async fn say_writer(&self, condition: &'static str, writer: Option<&String>) {
        match writer {
            Some(writer) => {
                let message = format!("{condition} is written by {writer}, not by mlnode-agent: the agent does not take it over (two writers would overwrite each other's verdicts). Remove readiness.repair_condition, or stop {writer} writing it");
                tracing::warn!(node = %self.node_name, condition, writer = %writer, "{message}");
                self.event("Warning", "RepairConditionRefused", &message)
                    .await;
            }
            None => {
                tracing::info!(node = %self.node_name, condition, "no other writer owns the repair condition now: writing it")
            }
        }
    }

    async fn sync(&self, all: &[Gate], memory: &mut Memory) -> Result<(), kube::Error> {
        self.say_repair_writer(memory).await;
        let gates: Vec<Gate> = all
            .iter()
            .filter(|g| !memory.repair_writers.contains_key(g.condition_type))
            .cloned()
            .collect();
        let current = memory.conditions.clone();
        let changed: Vec<&Gate> = gates
            .iter()
            .filter(|g| differs(g, current.get(g.condition_type)))
            .collect();
        if !memory
            .planner
            .write_conditions(!changed.is_empty(), Instant::now())
        {
            self.metrics.updates.with_label_values(&["skipped"]).inc();
        } else {
            let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
            let body = conditions_patch(&gates, &current, &now);
            let node = self
                .nodes
                .patch_status(&self.node_name, &as_agent(), &Patch::Strategic(body))
                .await?;
            self.metrics.updates.with_label_values(&["written"]).inc();
            // The write answers with the whole node: its taints as they are now, whoever changed
            // them. Continuous mode reconciles against that at least every heartbeat, at no extra
            // request.
            self.saw_node(memory, &node);
            memory.planner.wrote_conditions(Instant::now());
            for gate in changed {
                tracing::info!(node = %self.node_name, condition = gate.condition_type, status = gate.status.as_str(), reason = %gate.reason, detail = %gate.message, "node condition changed");
                if !transitions(gate, current.get(gate.condition_type)) {
                    continue;
                }
                let kind = if gate.ok() { "Normal" } else { "Warning" };
                self.event(
                    kind,
                    &gate.reason,
                    &format!("{}: {}", gate.condition_type, gate.message),
                )
                .await;
            }
        }
        // A model still resuming has no gate yet: nothing about the caches is concluded, so the
        // taint and the model labels stay as the node shows them.
        if !all.iter().any(|g| g.condition_type == MODEL_CACHE_VERIFIED) {
            return Ok(());
        }
        // A fabric fault does not hold the node out of scheduling: most inference runs on one
        // node without RDMA, and a pod that needs the fabric asks the device plugin for its
        // devices, which it then lacks (docs/fabric.md). It fails FabricHealthy for alerts and
        // for a node-readiness-controller rule that wants it.
        let holding_ok = all
            .iter()
            .filter(|g| g.condition_type != FABRIC_HEALTHY)
            .all(Gate::ok);
        self.sync_taint(holding_ok, memory).await?;
        self.sync_labels(memory).await
    }

    /// With `readiness.model_labels`, makes the node's `models.mlnode.dev/` labels those of the
    /// models verified now, with one merge patch of the keys that differ.
    async fn sync_labels(&self, memory: &mut Memory) -> Result<(), kube::Error> {
        if !self.settings.model_labels {
            return Ok(());
        }
        let wanted = labels::wanted(&self.model_facts());
        let Some(patch) = labels::patch(&memory.labels, &wanted) else {
            return Ok(());
        };
        let node = self
            .nodes
            .patch(&self.node_name, &as_agent(), &Patch::Merge(&patch))
            .await?;
        tracing::info!(node = %self.node_name, labels = %patch["metadata"]["labels"], "model labels updated");
        self.saw_node(memory, &node);
        Ok(())
    }

    /// Remembers the node's copy of our conditions and whether it has our taint, and tells the
    /// verifiers (their priority).
    fn saw_node(&self, memory: &mut Memory, node: &Node) {
        memory.conditions = own_conditions(node, &self.own_types());
        memory.labels = labels::current(node);
        memory.repair_writers = self
            .repair_types()
            .into_iter()
            .filter_map(|condition| Some((condition, other_writer(node, condition)?)))
            .collect();
        self.take_memory(memory, node);
        let present = self.taint.as_ref().map(|t| has_taint(node, t));
        memory.planner.saw_node(present);
        self.sources.node_taint.set(present == Some(true));
    }

    /// What the node remembers for this agent: on the first read, the held XIDs a previous agent
    /// on this boot wrote into `AcceleratorHealthy`'s message; on every read, the operator's
    /// clearing time. What cannot be read is said once and leaves the live facts to decide.
    fn take_memory(&self, memory: &mut Memory, node: &Node) {
        let now = (Instant::now(), std::time::SystemTime::now());
        let (expected, mut trouble) =
            mlnode_core::health::ExpectedDevices::of(node.metadata.labels.as_ref());
        memory.from_node.expected = expected;
        match memory::cleared_at(node.metadata.annotations.as_ref()) {
            Ok(cleared) => {
                memory.from_node.cleared_before = cleared.map(|at| {
                    let ago = now.1.duration_since(at).unwrap_or_default();
                    now.0.checked_sub(ago).unwrap_or(now.0)
                })
            }
            Err(e) => trouble.push(e),
        }
        if memory.from_node.since.is_none() {
            memory.from_node.since = Some(now.0);
            trouble.extend(self.hand_over_records(memory));
            let message = memory
                .conditions
                .get(ACCELERATOR_HEALTHY)
                .and_then(|c| c.message.as_deref())
                .unwrap_or_default();
            match memory::parse(message) {
                Ok(Some((boot, held))) if boot == self.boot_id => {
                    tracing::warn!(node = %self.node_name, held = ?held, "keeping the XIDs the previous agent held on this boot: the GPUs stay unhealthy until the driver clears them, the node reboots, or an operator clears them");
                    memory.from_node.faults = held;
                }
                Ok(Some((boot, _))) => {
                    tracing::info!(node = %self.node_name, previous_boot = %boot, "the held XIDs in AcceleratorHealthy are from an earlier boot: the reboot cleared them");
                }
                Ok(None) => {}
                Err(e) => trouble.push(format!(
                    "AcceleratorHealthy's message does not carry held XIDs in the form this agent writes: {e}"
                )),
            }
        }
        let trouble = trouble.join("; ");
        if !trouble.is_empty() && trouble != memory.memory_trouble {
            self.metrics.memory_errors.inc();
            tracing::warn!(node = %self.node_name, error = %trouble, "cannot read what the node remembers; the live facts decide");
        }
        memory.memory_trouble = trouble;
    }

    /// On the first read: gives the monitors the records a previous agent of this boot left in
    /// `ModelCacheVerified`'s message (none from another boot, or when they cannot be read: then
    /// each model is hashed). Returns the trouble, if any.
    fn hand_over_records(&self, memory: &Memory) -> Option<String> {
        let message = memory
            .conditions
            .get(MODEL_CACHE_VERIFIED)
            .and_then(|c| c.message.as_deref())
            .unwrap_or_default();
        let (records, trouble) = match memory::parse_records(message) {
            Ok(Some((boot, records))) if boot == self.boot_id => {
                tracing::info!(node = %self.node_name, models = records.len(), "a previous agent of this boot recorded what it verified: files still as recorded are not hashed again");
                (records, None)
            }
            Ok(Some((boot, _))) => {
                tracing::info!(node = %self.node_name, previous_boot = %boot, "the verified caches' records are from an earlier boot: every model is hashed");
                (Default::default(), None)
            }
            Ok(None) => (Default::default(), None),
            Err(e) => (
                Default::default(),
                Some(format!("ModelCacheVerified's message does not carry the verified caches' records in the form this agent writes: {e}")),
            ),
        };
        self.sources.node_records.set(records);
        trouble
    }

    /// Puts the taint where the planner wants it (see [`Planner::taint_wanted`]).
    async fn sync_taint(&self, all_ok: bool, memory: &mut Memory) -> Result<(), kube::Error> {
        let (Some(taint), Some(want_present)) = (&self.taint, memory.planner.taint_wanted(all_ok))
        else {
            return Ok(());
        };
        for attempt in 1..=TAINT_ATTEMPTS {
            let node = self.nodes.get(&self.node_name).await?;
            let Some(patch) = taint_patch(&node, taint, want_present) else {
                break;
            };
            let patch: json_patch::Patch =
                serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
            match self
                .nodes
                .patch(&self.node_name, &as_agent(), &Patch::Json::<()>(patch))
                .await
            {
                Ok(_) => break,
                // The list changed between our read and our write: read it again.
                Err(kube::Error::Api(status))
                    if (status.code == 409 || status.code == 422) && attempt < TAINT_ATTEMPTS =>
                {
                    tracing::debug!(attempt, "taint list changed under us; retrying");
                }
                Err(e) => return Err(e),
            }
        }
        memory.planner.taint_set(want_present);
        self.sources.node_taint.set(want_present);
        let (reason, verb) = if want_present {
            ("StartupTaintAdded", "added")
        } else {
            ("StartupTaintRemoved", "removed")
        };
        tracing::info!(node = %self.node_name, taint = %taint.key, "startup taint {verb}");
        self.event(
            "Normal",
            reason,
            &format!("taint {}:{} {verb}", taint.key, taint.effect),
        )
        .await;
        Ok(())
    }

    /// A Node event, as node-problem-detector posts them.
    async fn event(&self, kind: &str, reason: &str, message: &str) {
        let about = events::About::node(&self.node_name);
        events::post(&self.client, &self.node_name, &about, kind, reason, message).await;
    }
}

/// How long ago the oldest of our conditions on the node was written; None when one is missing.
fn heartbeat_age(
    conditions: &BTreeMap<String, NodeCondition>,
    types: &[&str],
) -> Option<std::time::Duration> {
    let oldest = types
        .iter()
        .map(|t| conditions.get(*t)?.last_heartbeat_time.as_ref())
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min_by_key(|time| time.0)?;
    let written = std::time::SystemTime::from(oldest.0);
    Some(
        std::time::SystemTime::now()
            .duration_since(written)
            .unwrap_or_default(),
    )
}

/// Every write carries the agent's field manager, so the node's managed fields say which
/// conditions are the agent's ([`other_writer`]).
fn as_agent() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// The kernel's id of this boot; empty when it cannot be read (then nothing is carried across a
/// restart: an empty id matches no message this agent writes, as `memory::parse` refuses it).
fn read_boot_id(path: &std::path::Path) -> String {
    match mlnode_files::read_bounded_text(path, 64) {
        Ok(text) => text.trim().to_string(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the boot id: held XIDs are not kept across an agent restart");
            String::new()
        }
    }
}
