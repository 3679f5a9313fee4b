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
    /// The first verification has not finished.
    Starting,
    Verified {
        revision: Option<String>,
    },
    Failed {
        reason: String,
    },
}

/// What the HTTP server reads about a model: readiness for /readyz, liveness for /healthz.
pub struct ModelState {
    pub name: String,
    readiness: Shared<Readiness>,
    heartbeat: Shared<Instant>,
    /// Set while a verification has hashed nothing for `verify.stall_timeout`.
    pub stalled: AtomicBool,
    /// Cleared while the model's files cannot be watched: its verdict is then only as fresh as
    /// the last rescan.
    watched: AtomicBool,
}

impl ModelState {
    pub fn new(name: &str) -> ModelState {
        ModelState {
            name: name.to_string(),
            readiness: Shared::new(Readiness::Starting),
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

    pub fn set_readiness(&self, readiness: Readiness) {
        self.readiness.set_if_changed(readiness);
    }

    /// Waits until the model's readiness changes: a verification that passed, or one that failed.
    pub async fn readiness_changed(&self) {
        self.readiness.changed().await
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

/// Waits until one of `models` has a new verdict; with none, forever.
pub async fn any_readiness_changed(models: &[std::sync::Arc<ModelState>]) {
    if models.is_empty() {
        return std::future::pending().await;
    }
    futures_util::future::select_all(models.iter().map(|m| Box::pin(m.readiness_changed()))).await;
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
}
