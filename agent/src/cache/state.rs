//! What the rest of the agent reads about a model's cache: whether it may be served from
//! (`/readyz`, the `ModelCacheVerified` gate) and whether its monitor is alive (`/healthz`). Written
//! by the model's monitor; a leaf, so readers need not depend on the monitor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    readiness: Mutex<Readiness>,
    heartbeat: Mutex<Instant>,
    /// Set while a verification has hashed nothing for `verify.stall_timeout`.
    pub stalled: AtomicBool,
}

impl ModelState {
    pub fn new(name: &str) -> ModelState {
        ModelState {
            name: name.to_string(),
            readiness: Mutex::new(Readiness::Starting),
            heartbeat: Mutex::new(Instant::now()),
            stalled: AtomicBool::new(false),
        }
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_readiness(&self, readiness: Readiness) {
        *self.readiness.lock().unwrap_or_else(|p| p.into_inner()) = readiness;
    }

    pub fn beat(&self) {
        *self.heartbeat.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Err says why the monitor is wedged.
    pub fn liveness(&self) -> Result<(), String> {
        let age = self
            .heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
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

/// Whether the node carries this agent's startup taint, as the readiness controller last saw it:
/// written there, read by the monitors to choose their hashing priority.
#[derive(Clone, Debug, Default)]
pub struct NodeTaint(Arc<AtomicBool>);

impl NodeTaint {
    pub fn set(&self, present: bool) {
        self.0.store(present, Ordering::Relaxed);
    }

    pub fn is_present(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
