//! AWS Neuron devices (Inf2, Trn1, Trn2) from the Neuron driver's sysfs tree, readable without
//! privileges, exported with neuron-monitor-prometheus's label names.
//!
//! [`sysfs`] reads the tree into plain data, discovering devices, cores, categories and counter
//! names from the directories (driver 2.31 moved nodes); [`counters`] keeps exported counters
//! monotonic across resets; [`collector`] builds the series at scrape time.

pub mod collector;
pub mod counters;
pub mod sysfs;

use crate::config::{KubeletSettings, NeuronSettings, Toggle};
use crate::kubelet::pod_resources::SharedAssignments;

/// Registers the Neuron collector. Err says why there is none; the agent runs on without it.
pub fn start(
    settings: &NeuronSettings,
    kubelet: &KubeletSettings,
    assignments: SharedAssignments,
    registry: &prometheus::Registry,
) -> Result<(), String> {
    if settings.enabled == Toggle::Off {
        return Err("disabled (neuron.enabled: false)".into());
    }
    let root = settings.sysfs_root.as_path();
    if !root.is_dir() {
        return Err(format!(
            "{} does not exist: no Neuron driver on this node",
            root.display()
        ));
    }
    let devices =
        sysfs::device_indexes(root).map_err(|e| format!("cannot list {}: {e}", root.display()))?;
    let collector = collector::NeuronCollector::new(
        settings.clone(),
        assignments,
        kubelet.neuron_device_resource_names.clone(),
        kubelet.neuron_core_resource_names.clone(),
    )
    .map_err(|e| e.to_string())?;
    registry
        .register(Box::new(collector))
        .map_err(|e| e.to_string())?;
    tracing::info!(devices = devices.len(), sysfs_root = %root.display(), "Neuron collector started");
    Ok(())
}

/// `neuron<N>` → N.
fn index_after(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}
