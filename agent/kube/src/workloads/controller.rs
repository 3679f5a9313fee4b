//! The pod-gate loop: the node's one pod watch (its reflector store, `node_pods`), and each round, for every
//! pod with the `mlnode.dev/ModelVerified` or `mlnode.dev/AcceleratorHealthy` readiness gate, its
//! condition written to `pods/status` when [`gate::due`] says so (the pod does not show it: a
//! verdict changed, or a new pod), never as a heartbeat; a pod whose write was refused (a 429
//! included) is tried again after a jittered backoff of its own, with the verdict as it is then;
//! for every pod mounting a model cache writable, a Warning event once and a series while it
//! runs. Woken by a pod change, a model's new verdict, new accelerator reports, or the interval.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::device_gate::{self, ACCELERATOR_HEALTHY};
use super::exposure::{writable_mounts, WritableMount};
use super::gate::{self, PodGate, Written, MODEL_VERIFIED};
use crate::api::Backoff;
use crate::events::{self, About};
use crate::models::{HostPaths, ModelMount};
use crate::node_pods::NodePods;
use crate::readiness::node::FIELD_MANAGER;
use mlnode_core::health::{LatestReports, PodRef};
use mlnode_core::metrics::{AgentMetrics, Subsystem};
use mlnode_core::state::{any_readiness_differs, readiness_of, ModelState, Readiness};
use mlnode_core::trouble::Trouble;

/// `mlnode_pod_model_gate`, `mlnode_pod_accelerator_gate`, `mlnode_pod_gate_updates_total` and
/// `mlnode_model_cache_writable_mounts`.
#[derive(Clone)]
pub struct WorkloadMetrics {
    gate: IntGaugeVec,
    device_gate: IntGaugeVec,
    updates: IntCounterVec,
    writable: IntGaugeVec,
}

impl WorkloadMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<WorkloadMetrics> {
        let metrics = WorkloadMetrics {
            gate: IntGaugeVec::new(
                Opts::new(
                    "mlnode_pod_model_gate",
                    "1 while a pod's mlnode.dev/ModelVerified readiness gate is True (its model verified, at the revision it requires), 0 otherwise; one series per pod on this node with the gate.",
                ),
                &["namespace", "pod", "model_name"],
            )?,
            device_gate: IntGaugeVec::new(
                Opts::new(
                    "mlnode_pod_accelerator_gate",
                    "1 while a pod's mlnode.dev/AcceleratorHealthy readiness gate is True (every accelerator it holds healthy), 0 while False or Unknown; one series per pod on this node with the gate.",
                ),
                &["namespace", "pod"],
            )?,
            updates: IntCounterVec::new(
                Opts::new(
                    "mlnode_pod_gate_updates_total",
                    "Writes of pods' mlnode.dev/ModelVerified and mlnode.dev/AcceleratorHealthy conditions: written, or error (the API server refused or was unreachable).",
                ),
                &["result"],
            )?,
            writable: IntGaugeVec::new(
                Opts::new(
                    "mlnode_model_cache_writable_mounts",
                    "Mounts of a model's cache that a running pod's containers can write (readOnly unset or false): what verification checks, the pod can change.",
                ),
                &["model_name", "namespace", "pod"],
            )?,
        };
        registry.register(Box::new(metrics.gate.clone()))?;
        registry.register(Box::new(metrics.device_gate.clone()))?;
        registry.register(Box::new(metrics.updates.clone()))?;
        registry.register(Box::new(metrics.writable.clone()))?;
        for result in ["written", "error"] {
            metrics.updates.with_label_values(&[result]).inc_by(0);
        }
        Ok(metrics)
    }

    pub fn set_gate(&self, namespace: &str, pod: &str, model: &str, ok: bool) {
        self.gate
            .with_label_values(&[namespace, pod, model])
            .set(i64::from(ok));
    }

    pub fn set_device_gate(&self, namespace: &str, pod: &str, ok: bool) {
        self.device_gate
            .with_label_values(&[namespace, pod])
            .set(i64::from(ok));
    }

    pub fn set_writable(&self, model: &str, namespace: &str, pod: &str, mounts: i64) {
        self.writable
            .with_label_values(&[model, namespace, pod])
            .set(mounts);
    }
}

pub struct PodController {
    pub client: kube::Client,
    pub node_name: String,
    pub models: Vec<Arc<ModelState>>,
    pub mounts: Vec<ModelMount>,
    /// Derives each model's path on the node from the agent's own pod.
    pub host_paths: HostPaths,
    /// Told when the API server answers again after trouble: pods backing off are tried then.
    pub recoveries: crate::api::Recoveries,
    /// How often the pods are looked at without a change, and how long a write may take to show.
    pub interval: Duration,
    pub metrics: WorkloadMetrics,
    pub up: AgentMetrics,
    /// The accelerator collectors' reports, as the readiness controller last took them.
    pub reports: LatestReports,
}

/// What the loop remembers between rounds.
#[derive(Default)]
struct Memory {
    /// The last gate written to each pod (by uid and condition type).
    written: HashMap<(String, &'static str), Written>,
    /// The series each pod (by uid) has now: its namespace and name, and the gate's and the
    /// writable mounts' models.
    series: HashMap<String, Series>,
    /// (pod uid, model) pairs whose writable mount was warned about.
    warned: HashSet<(String, String)>,
    /// The pods (by uid) whose last write was refused.
    failing: HashMap<String, Failing>,
    /// Whether the pods' watch works: while it fails, the pods as last seen are stale.
    watching: bool,
}

/// A pod whose writes the API server refuses: its error, said once, and when to try again.
struct Failing {
    said: Trouble,
    retry_at: Instant,
    backoff: Backoff,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Series {
    namespace: String,
    pod: String,
    /// The model gate's model and whether it passes.
    gate: Option<(String, bool)>,
    /// Whether the device gate passes.
    device_gate: Option<bool>,
    writable: BTreeMap<String, i64>,
}

impl PodController {
    pub async fn run(mut self, mut pods: NodePods, shutdown: CancellationToken) {
        let mut memory = Memory::default();
        let mut recoveries = self.recoveries.clone();
        // The verdicts the last round wrote the gates from: one given during a round wakes the
        // next at once.
        let mut decided_on = readiness_of(&self.models);
        let mut reports = self.reports.get();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Ok(()) = recoveries.changed() => {
                    let now = Instant::now();
                    for failing in memory.failing.values_mut() {
                        failing.retry_at = now;
                    }
                }
                changed = pods.changes.changed() => if changed.is_err() { return },
                _ = any_readiness_differs(&self.models, &decided_on) => {}
                _ = self.reports.wait_for(|latest| *latest != reports) => {}
                _ = tokio::time::sleep(self.interval) => {}
            }
            // A failed watch says so itself and resumes quietly (a resumed watch with nothing to
            // tell sends nothing), so it never holds the rounds: a verdict that changes meanwhile
            // is written to the pods last seen. The collector is up only while both work.
            memory.watching = pods.changes.borrow_and_update().is_ok();
            // Taken whether or not the round runs: a verdict that differs from one never written
            // (the pods not listed yet) must not wake this loop again and again; the list's
            // arrival starts the round that writes it.
            decided_on = readiness_of(&self.models);
            reports = self.reports.get();
            if pods.store.wait_until_ready().now_or_never().is_some() {
                // A write waiting out the API server's push-back must not hold up the shutdown.
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.round(&pods.store, reports.as_deref(), &mut memory) => {}
                }
            }
            if !memory.watching {
                self.up.set_up(Subsystem::PodGates, false);
            }
        }
    }

    /// Once the agent's own pod is seen: the host path of each model that sets none, from the
    /// hostPath the agent mounts it from.
    fn derive_host_paths(&mut self, store: &Store<Pod>) {
        let unset: Vec<bool> = self.mounts.iter().map(|m| m.host_path.is_none()).collect();
        if !self.host_paths.derive(&mut self.mounts, &store.state()) {
            return;
        }
        for (mount, _) in self.mounts.iter().zip(unset).filter(|(_, unset)| *unset) {
            tracing::info!(model_name = %mount.name, root = %mount.root.display(), host_path = %mount.node_path().display(),
                derived = mount.host_path.is_some(), "the model cache's path on the node, for pods mounting it");
        }
    }

    async fn round(
        &mut self,
        store: &Store<Pod>,
        reports: Option<&[mlnode_core::health::Report]>,
        memory: &mut Memory,
    ) {
        self.derive_host_paths(store);
        let verdicts: BTreeMap<String, Readiness> = self
            .models
            .iter()
            .map(|m| (m.name.clone(), m.readiness()))
            .collect();
        let pods = store.state();
        let mut seen = HashSet::new();
        let mut synced = true;
        for pod in pods.iter().filter(|p| is_running(p)) {
            let (Some(uid), Some(namespace), Some(name)) = (
                pod.metadata.uid.clone(),
                pod.metadata.namespace.clone(),
                pod.metadata.name.clone(),
            ) else {
                continue;
            };
            seen.insert(uid.clone());
            let mut series = Series {
                namespace: namespace.clone(),
                pod: name.clone(),
                ..Series::default()
            };
            // What the pod's gates showed, kept where no verdict is concluded yet.
            let (last_gate, last_device_gate) = memory
                .series
                .get(&uid)
                .map_or((None, None), |s| (s.gate.clone(), s.device_gate));
            if gate::has_gate(pod, MODEL_VERIFIED) {
                match gate::decide(pod, &verdicts) {
                    Some(decided) => {
                        series.gate = Some((decided.subject.clone(), decided.ok()));
                        synced &= self.write_gate(pod, &uid, &decided, memory).await;
                    }
                    // Its model's verdict is not concluded yet: the pod keeps what it shows.
                    None => series.gate = last_gate,
                }
            }
            if gate::has_gate(pod, ACCELERATOR_HEALTHY) {
                let holder = PodRef {
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                match device_gate::decide(&holder, reports) {
                    Some(decided) => {
                        series.device_gate = Some(decided.ok());
                        synced &= self.write_gate(pod, &uid, &decided, memory).await;
                    }
                    // No reports taken yet: the pod keeps what it shows.
                    None => series.device_gate = last_device_gate,
                }
            }
            let writable = writable_mounts(pod, &self.mounts);
            for mount in &writable {
                *series.writable.entry(mount.model.clone()).or_default() += 1;
                if memory.warned.insert((uid.clone(), mount.model.clone())) {
                    self.warn_writable(&namespace, &name, &uid, mount).await;
                }
            }
            self.export(memory.series.get(&uid), &series);
            memory.series.insert(uid, series);
        }
        // Pods gone (or finished): their series and memory go with them.
        let gone: Vec<String> = memory
            .series
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(old) = memory.series.remove(&uid) {
                self.export(Some(&old), &Series::default());
            }
            memory.written.retain(|(u, _), _| *u != uid);
            memory.failing.remove(&uid);
            memory.warned.retain(|(u, _)| *u != uid);
        }
        self.up.set_up(Subsystem::PodGates, synced);
    }

    /// Writes the pod's condition when due; false when the API server refused.
    async fn write_gate(
        &self,
        pod: &Pod,
        uid: &str,
        decided: &PodGate,
        memory: &mut Memory,
    ) -> bool {
        let current = gate::current(pod, decided.condition_type);
        let now = Instant::now();
        let key = (uid.to_string(), decided.condition_type);
        let last = memory.written.get(&key);
        let settle = memory.watching.then_some(self.interval);
        if !gate::due(decided, current, last, now, settle) {
            return true;
        }
        if memory.failing.get(uid).is_some_and(|f| now < f.retry_at) {
            return false;
        }
        let changed = last.is_none_or(|l| l.gate != *decided);
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return true;
        };
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let body = gate::condition_patch(decided, current, &stamp);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        match pods
            .patch_status(name, &params, &Patch::Strategic(body))
            .await
        {
            Ok(_) => {
                self.metrics.updates.with_label_values(&["written"]).inc();
                memory.written.insert(
                    key,
                    Written {
                        gate: decided.clone(),
                        at: now,
                    },
                );
                if changed {
                    tracing::info!(namespace = %namespace, pod = %name, condition = decided.condition_type, subject = %decided.subject, status = decided.status.as_str(), reason = %decided.reason, detail = %decided.message, "pod readiness gate changed");
                }
                if memory.failing.remove(uid).is_some() {
                    tracing::info!(namespace = %namespace, pod = %name, "the pod's condition can be written again");
                }
                true
            }
            // Deleted between the watch and the write: the watch will say so.
            Err(kube::Error::Api(status)) if status.code == 404 => true,
            Err(e) => {
                self.metrics.updates.with_label_values(&["error"]).inc();
                let failing = memory
                    .failing
                    .entry(uid.to_string())
                    .or_insert_with(|| Failing {
                        said: Trouble::default(),
                        retry_at: now,
                        backoff: Backoff::default(),
                    });
                let wait = failing.backoff.failed_now();
                failing.retry_at = Instant::now() + wait;
                if let Some(message) = failing.said.failed(e.to_string()) {
                    let hint = match &e {
                        kube::Error::Api(status) if status.code == 403 => " (RBAC: patch pods/status; the admission policy: pods on this node only)",
                        _ => "",
                    };
                    tracing::warn!(namespace = %namespace, pod = %name, error = %message, retry_in = ?wait, "cannot write the pod's {} condition{hint}; retried with backoff", decided.condition_type);
                }
                false
            }
        }
    }

    async fn warn_writable(&self, namespace: &str, name: &str, uid: &str, mount: &WritableMount) {
        let message = format!(
            "container {} mounts the cache of model {} writable (volume {} at {}): the pod can change what the agent verifies; mount it readOnly: true",
            mount.container, mount.model, mount.volume, mount.mount_path
        );
        tracing::warn!(namespace, pod = name, model_name = %mount.model, container = %mount.container, "a pod mounts a model cache writable");
        let about = About::pod(namespace, name, uid);
        events::post(
            &self.client,
            &self.node_name,
            &about,
            "Warning",
            "ModelCacheWritable",
            &message,
        )
        .await;
    }

    /// Moves a pod's series from `old` to `new`: sets what `new` has, removes what only `old` had.
    fn export(&self, old: Option<&Series>, new: &Series) {
        if let Some(old) = old {
            if let Some((model, _)) = old
                .gate
                .as_ref()
                .filter(|(m, _)| new.gate.as_ref().map(|(n, _)| n) != Some(m))
            {
                let _ = self
                    .metrics
                    .gate
                    .remove_label_values(&[&old.namespace, &old.pod, model]);
            }
            for model in old
                .writable
                .keys()
                .filter(|m| !new.writable.contains_key(*m))
            {
                let _ =
                    self.metrics
                        .writable
                        .remove_label_values(&[model, &old.namespace, &old.pod]);
            }
        }
        if let Some((model, ok)) = &new.gate {
            self.metrics.set_gate(&new.namespace, &new.pod, model, *ok);
        }
        match new.device_gate {
            Some(ok) => self.metrics.set_device_gate(&new.namespace, &new.pod, ok),
            None => {
                if let Some(old) = old.filter(|o| o.device_gate.is_some()) {
                    let _ = self
                        .metrics
                        .device_gate
                        .remove_label_values(&[&old.namespace, &old.pod]);
                }
            }
        }
        for (model, count) in &new.writable {
            self.metrics
                .set_writable(model, &new.namespace, &new.pod, *count);
        }
    }
}

/// A pod whose containers can still serve: not Succeeded or Failed, not being deleted.
fn is_running(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}
