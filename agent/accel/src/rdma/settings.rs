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
    /// The counters exported, by their drivers' names (`*`: every one): each is a series per
    /// device or port, 32 of each on a p5.48xlarge. The verdicts read every counter regardless.
    pub counters: Vec<String>,
}

/// The default `counters`: traffic, errors and link events an SRE acts on. The PMA port counters
/// (the kernel's `pma_attrs_ext`), EFA's port statistics (`EFA_DEFINE_PORT_STATS`) less the packet
/// and work-request counts, and EFA's two command-failure counts.
pub const DEFAULT_COUNTERS: [&str; 28] = [
    "link_downed",
    "link_error_recovery",
    "symbol_error",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "tx_bytes",
    "rx_bytes",
    "rx_drops",
    "send_bytes",
    "recv_bytes",
    "rdma_read_bytes",
    "rdma_write_bytes",
    "rdma_write_recv_bytes",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
    "cmds_err",
    "no_completion_cmds",
];

impl RdmaSettings {
    /// Whether the counter `name` is exported.
    pub fn exports(&self, name: &str) -> bool {
        self.counters.iter().any(|c| c == "*" || c == name)
    }
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
            counters: DEFAULT_COUNTERS.iter().map(|c| c.to_string()).collect(),
        }
    }
}
