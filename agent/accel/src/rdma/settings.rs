//! The settings of the RDMA collector (`rdma`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use std::time::Duration;

use mlnode_core::settings::{bounds, minutes, Toggle, Within};

bounds! {
    /// More `link_downed` rises than this within `flap_window` is a flapping link.
    pub FlapThreshold: u32 = 1, 1000;
    /// Shorter than a readiness round sees nothing; longer than a day remembers a repaired link.
    pub FlapWindow: Duration = minutes(1), minutes(24 * 60);
}

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
    /// EFA devices the node must have (the EFA interfaces it was launched with); 0: no
    /// expectation beyond the EFA functions on the PCI bus, each of which must have its device.
    pub expected_efa_devices: u32,
    pub flap_threshold: Within<FlapThreshold>,
    pub flap_window: Within<FlapWindow>,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        RdmaSettings {
            enabled: Toggle::Auto,
            sysfs_root: PathBuf::from("/sys/class/infiniband"),
            pci_devices: PathBuf::from("/sys/bus/pci/devices"),
            expected_efa_devices: 0,
            flap_threshold: Within::default_of(2),
            flap_window: Within::default_of(minutes(10)),
        }
    }
}
