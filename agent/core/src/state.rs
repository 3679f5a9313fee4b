//! What the rest of the agent reads about a model's cache: whether it may be served from
//! (`/readyz`, the `ModelCacheVerified` gate) and whether its monitor is alive (`/healthz`). Written
//! by the model's monitor; a leaf, so readers need not depend on the monitor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::shared::Shared;

/// A monitor whose heartbeat is older than this is wedged.
const HEARTBEAT_LIMIT: Duration = Duration::from_secs(30);

/// Whether a model's cache may be served from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// A restarted agent is looking whether the cache is as a previous agent of this boot
    /// verified it (the node's record, one look at each file): nothing is concluded yet, so the
    /// node's and the pods' verdicts are left as they are.
    Resuming,
    /// The first verification has not finished.
    Starting,
    Verified {
        revision: Option<String>,
    },
    Failed {
        reason: String,
    },
}

/// How a model's current `Verified` came about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifiedBy {
    /// Every file was hashed by this agent.
    Hash,
    /// A previous agent of this boot hashed every file at this Unix time, and none has changed
    /// since (or the ones that had were hashed again).
    UnchangedSince(u64),
}

impl VerifiedBy {
    /// The `verified_by` label.
    pub fn as_str(self) -> &'static str {
        match self {
            VerifiedBy::Hash => "hash",
            VerifiedBy::UnchangedSince(_) => "unchanged_since",
        }
    }
}

/// What a verification that passed leaves for a restarted agent of the same boot: what the
/// cache was verified against, when every byte was last hashed, and the fingerprint of the files
/// it found intact (`mlnode_verify::fingerprint`). The readiness controller keeps it in
/// `ModelCacheVerified`'s message, as it keeps held faults in `AcceleratorHealthy`'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheRecord {
    /// The first 16 bytes of SHA-256 over the manifest's bytes and the settings that decide the
    /// verdict: a record of another manifest or other settings never matches.
    pub against: [u8; 16],
    /// Unix seconds of the last hash of every file.
    pub hashed_at: u64,
    pub buckets: Vec<u64>,
}

/// What a previous agent of this boot recorded, by model, as the node showed it at the readiness
/// controller's first read. Unknown until then (or until it is known not to run: then empty).
#[derive(Clone, Debug)]
pub struct NodeRecords(Shared<Option<std::collections::BTreeMap<String, CacheRecord>>>);

impl Default for NodeRecords {
    fn default() -> Self {
        NodeRecords(Shared::new(None))
    }
}

impl NodeRecords {
    pub fn set(&self, records: std::collections::BTreeMap<String, CacheRecord>) {
        self.0.set(Some(records));
    }

    /// The record of `model`, waiting at most `limit` for the node to be read; None when there is
    /// none, or the node could not be read in time.
    pub async fn of(&self, model: &str, limit: Duration) -> Option<CacheRecord> {
        let _ = tokio::time::timeout(limit, self.0.wait_for(Option::is_some)).await;
        self.0
            .read(|records| records.as_ref().and_then(|r| r.get(model).cloned()))
    }
}

/// What the HTTP server reads about a model: readiness for /readyz, liveness for /healthz.
pub struct ModelState {
    pub name: String,
    readiness: Shared<Readiness>,
    verified_by: Shared<VerifiedBy>,
    /// The record of the last verification that passed, for the node to keep; None while the
    /// model is not verified, or its verification leaves nothing a restart could trust.
    record: Shared<Option<CacheRecord>>,
    heartbeat: Shared<Instant>,
    /// Set while a verification has hashed nothing for `verify.stall_timeout`.
    pub stalled: AtomicBool,
    /// Cleared while the model's files cannot be watched: its verdict is then only as fresh as
    /// the last rescan.
    watched: AtomicBool,
}

impl ModelState {
    /// A model whose first verdict is yet to come: `Resuming` when a previous agent's record may
    /// spare its first hash, `Starting` otherwise.
    pub fn new(name: &str, first: Readiness) -> ModelState {
        ModelState {
            name: name.to_string(),
            readiness: Shared::new(first),
            verified_by: Shared::new(VerifiedBy::Hash),
            record: Shared::new(None),
            heartbeat: Shared::new(Instant::now()),
            stalled: AtomicBool::new(false),
            watched: AtomicBool::new(true),
        }
    }

    pub fn set_watched(&self, watched: bool) {
        self.watched.store(watched, Ordering::Relaxed);
    }

    pub fn is_watched(&self) -> bool {
        self.watched.load(Ordering::Relaxed)
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness.get()
    }

    /// A verdict of `Verified`, with how it came about and what a restarted agent may trust.
    pub fn set_verified(
        &self,
        revision: Option<String>,
        by: VerifiedBy,
        record: Option<CacheRecord>,
    ) {
        self.verified_by.set(by);
        self.record.set(record);
        self.readiness
            .set_if_changed(Readiness::Verified { revision });
    }

    /// A verdict other than `Verified`: nothing is left for a restart to trust.
    pub fn set_not_verified(&self, readiness: Readiness) {
        self.record.set(None);
        self.readiness.set_if_changed(readiness);
    }

    pub fn verified_by(&self) -> VerifiedBy {
        self.verified_by.get()
    }

    pub fn record(&self) -> Option<CacheRecord> {
        self.record.get()
    }

    /// Waits until the model's readiness changes: a verification that passed, or one that failed.
    /// Waits until the verdict is other than `seen`; at once when it already is, so a verdict
    /// given between a reader's look and its wait is never missed.
    pub async fn readiness_differs_from(&self, seen: &Readiness) {
        self.readiness.wait_for(|now| now != seen).await
    }

    pub fn beat(&self) {
        self.heartbeat.set(Instant::now());
    }

    /// Err says why the monitor is wedged.
    pub fn liveness(&self) -> Result<(), String> {
        let age = self.heartbeat.get().elapsed();
        if age > HEARTBEAT_LIMIT {
            return Err(format!("its monitor has not run for {}s", age.as_secs()));
        }
        if self.stalled.load(Ordering::Relaxed) {
            return Err(
                "its verification has hashed nothing for longer than verify.stall_timeout".into(),
            );
        }
        Ok(())
    }
}

/// Each of `models`' verdicts as it is now: what a reader decides on, and later waits to change.
pub fn readiness_of(models: &[std::sync::Arc<ModelState>]) -> Vec<Readiness> {
    models.iter().map(|m| m.readiness()).collect()
}

/// Waits until one of `models` has a verdict other than `seen` (from [`readiness_of`]), at once
/// when one already has; with no model, forever.
pub async fn any_readiness_differs(models: &[std::sync::Arc<ModelState>], seen: &[Readiness]) {
    if models.is_empty() {
        return std::future::pending().await;
    }
    let waits = models
        .iter()
        .zip(seen)
        .map(|(model, seen)| Box::pin(model.readiness_differs_from(seen)));
    futures_util::future::select_all(waits).await;
}

/// Whether the node carries this agent's startup taint, as the readiness controller last saw it:
/// written there, read by the monitors to choose their hashing priority. Unknown until the
/// controller has read the node once (or is known not to run).
#[derive(Clone, Debug)]
pub struct NodeTaint(Shared<Option<bool>>);

impl Default for NodeTaint {
    fn default() -> Self {
        NodeTaint(Shared::new(None))
    }
}

impl NodeTaint {
    pub fn set(&self, present: bool) {
        self.0.set(Some(present));
    }

    pub fn is_present(&self) -> bool {
        self.0.get() == Some(true)
    }

    /// Waits, at most `limit`, until the controller has said whether the taint is there: a
    /// verification that starts before it would not know the node is held for it.
    pub async fn known(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.0.wait_for(Option::is_some)).await;
    }
}

/// Whether pods on the node hold accelerator devices, as the kubelet's pod-resources API last
/// said: written by its poller, read by the monitors to choose their hashing priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// The kubelet has not answered (yet, or lately), or is not asked (no accelerator collector):
    /// nothing can be concluded about what serves.
    Unknown,
    /// No pod holds a GPU, MIG device, Neuron device or NeuronCore.
    NoAcceleratorPods,
    /// At least one pod holds one: something may be serving from a model.
    AcceleratorPods,
}

#[derive(Clone, Debug)]
pub struct NodeWorkload(Shared<Workload>);

impl Default for NodeWorkload {
    fn default() -> Self {
        NodeWorkload(Shared::new(Workload::Unknown))
    }
}

impl NodeWorkload {
    pub fn set(&self, workload: Workload) {
        self.0.set(workload);
    }

    pub fn get(&self) -> Workload {
        self.0.get()
    }
}

/// What the monitors know of the node, each fact written by the part of the agent that sees it.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    pub taint: NodeTaint,
    pub workload: NodeWorkload,
    pub records: NodeRecords,
}

#[cfg(test)]
mod readiness_waits {
    use std::sync::Arc;

    use super::*;

    /// A verdict given after a reader looked and before it waits is not missed: the wait returns
    /// at once, where a wait for the next change would sleep until another one.
    #[tokio::test(start_paused = true)]
    async fn a_verdict_given_between_the_look_and_the_wait_wakes_the_wait() {
        let models = vec![
            Arc::new(ModelState::new("a", Readiness::Starting)),
            Arc::new(ModelState::new("b", Readiness::Starting)),
        ];
        let seen = readiness_of(&models);
        models[1].set_not_verified(Readiness::Failed {
            reason: "digest_mismatch".into(),
        });
        tokio::time::timeout(
            Duration::from_secs(1),
            any_readiness_differs(&models, &seen),
        )
        .await
        .expect("the verdict given before the wait");

        let seen = readiness_of(&models);
        let unchanged = tokio::time::timeout(
            Duration::from_secs(60),
            any_readiness_differs(&models, &seen),
        )
        .await;
        assert!(unchanged.is_err(), "no verdict changed: the wait goes on");
    }
}
