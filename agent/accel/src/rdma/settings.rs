//! The settings of the RDMA collector (`rdma`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use mlnode_core::settings::Toggle;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RdmaSettings {
    /// `auto`: on where `sysfs_root` exists.
    pub enabled: Toggle,
    /// The RDMA core's device class.
    pub sysfs_root: PathBuf,
    /// Where the kernel lists PCI devices: the EFA functions there are counted, to compare with the
    /// devices the driver registered.
    pub pci_devices: PathBuf,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        RdmaSettings {
            enabled: Toggle::Auto,
            sysfs_root: PathBuf::from("/sys/class/infiniband"),
            pci_devices: PathBuf::from("/sys/bus/pci/devices"),
        }
    }
}
