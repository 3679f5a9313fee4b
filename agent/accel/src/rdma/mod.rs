//! RDMA devices (EFA on AWS, InfiniBand and RoCE HCAs elsewhere): the fabric multi-node inference
//! runs on, read from the RDMA core's sysfs class, world-readable (no privilege, no device node
//! opened). [`sysfs`] reads the tree into plain data; [`collector`] exports it at scrape time;
//! [`health`] judges it for the readiness gate's `FabricHealthy`.

pub mod attribution;
pub mod collector;
pub mod health;
pub mod settings;
pub mod sysfs;

use mlnode_core::settings::Toggle;
use settings::RdmaSettings;

/// Registers the RDMA collector; returns how many devices it found. Err says why there is none; the
/// agent runs on without it.
pub fn start(
    settings: &RdmaSettings,
    holders: Option<collector::Holders>,
    registry: &prometheus::Registry,
) -> Result<usize, String> {
    if settings.enabled == Toggle::Off {
        return Err("disabled (rdma.enabled: false)".into());
    }
    let root = settings.sysfs_root.as_path();
    if !root.is_dir() {
        return Err(format!(
            "{} does not exist: no RDMA device on this node",
            root.display()
        ));
    }
    let devices = sysfs::read(root, &|_| false)?.devices.len();
    let collector =
        collector::RdmaCollector::new(settings.clone(), holders).map_err(|e| e.to_string())?;
    registry
        .register(Box::new(collector))
        .map_err(|e| e.to_string())?;
    Ok(devices)
}
