//! RDMA device trees as the kernel lays them out under `/sys/class/infiniband`, shaped from the
//! sources: the RDMA core's `drivers/infiniband/core/sysfs.c` (torvalds/linux at 0147ebcf: the
//! port files and their formats, the PMA `counters/` group, `hw_counters/` with its `lifespan`),
//! and the EFA driver's statistics, `drivers/infiniband/hw/efa/efa_verbs.c`
//! (`EFA_DEFINE_DEVICE_STATS`, `EFA_DEFINE_PORT_STATS`; leon/linux-rdma at 06e3181): EFA answers
//! no management datagrams, so its ports have no `counters/`, and `efa_query_port` always reports
//! `ACTIVE`/`LinkUp`. PCI functions as the kernel lists them (`vendor`, `device`, `class`), with
//! the EFA ids of amzn-drivers' `efa_main.c`.

use std::path::{Path, PathBuf};

/// `EFA_DEFINE_DEVICE_STATS`, in the driver's order.
pub const EFA_DEVICE_STATS: [&str; 12] = [
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
];

/// `EFA_DEFINE_PORT_STATS`, in the driver's order.
pub const EFA_PORT_STATS: [&str; 22] = [
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
];

/// The PMA port counters of `pma_attrs_ext` (sysfs.c), with extended (64-bit) data counters.
pub const PMA_COUNTERS: [&str; 20] = [
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
];

/// A node's `/sys/class/infiniband`, and the PCI functions and drivers its links point at.
pub struct Tree {
    pub dir: tempfile::TempDir,
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

impl Tree {
    /// An empty tree: `class/infiniband` and `bus/pci/devices`, no device yet.
    pub fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("class/infiniband")).unwrap();
        std::fs::create_dir_all(dir.path().join("bus/pci/devices")).unwrap();
        Tree { dir }
    }

    pub fn class(&self) -> PathBuf {
        self.dir.path().join("class/infiniband")
    }

    /// The uverbs character device the RDMA core creates for `device`
    /// (drivers/infiniband/core/uverbs_main.c: `/sys/class/infiniband_verbs/uverbs<N>/ibdev`
    /// holds the device's name).
    pub fn uverbs(&self, n: u32, device: &str) {
        write(
            &self
                .dir
                .path()
                .join(format!("class/infiniband_verbs/uverbs{n}/ibdev")),
            &format!("{device}\n"),
        );
    }

    pub fn pci_devices(&self) -> PathBuf {
        self.dir.path().join("bus/pci/devices")
    }

    pub fn device(&self, name: &str) -> PathBuf {
        self.class().join(name)
    }

    pub fn port(&self, name: &str, port: u32) -> PathBuf {
        self.device(name).join(format!("ports/{port}"))
    }

    /// A PCI function bound to `driver`, linked from the device as the kernel links it.
    fn pci_function(&self, device: &str, bus_id: &str, ids: (&str, &str, &str), driver: &str) {
        let function = self.dir.path().join("devices/pci0000:00").join(bus_id);
        write(&function.join("vendor"), &format!("{}\n", ids.0));
        write(&function.join("device"), &format!("{}\n", ids.1));
        write(&function.join("class"), &format!("{}\n", ids.2));
        let drivers = self.dir.path().join("bus/pci/drivers").join(driver);
        std::fs::create_dir_all(&drivers).unwrap();
        std::os::unix::fs::symlink(&drivers, function.join("driver")).unwrap();
        std::os::unix::fs::symlink(&function, self.pci_devices().join(bus_id)).unwrap();
        std::fs::create_dir_all(self.device(device)).unwrap();
        std::os::unix::fs::symlink(&function, self.device(device).join("device")).unwrap();
    }

    /// An EFA device as the EFA driver registers it: one port, always ACTIVE, its statistics at 0
    /// but `tx_bytes`/`rx_bytes` (`seed` bytes each).
    pub fn efa(&self, name: &str, bus_id: &str, seed: u64) {
        self.pci_function(name, bus_id, ("0x1d0f", "0xefa1", "0x020000"), "efa");
        let device = self.device(name);
        for stat in EFA_DEVICE_STATS {
            write(&device.join("hw_counters").join(stat), "0\n");
        }
        write(&device.join("hw_counters/lifespan"), "10\n");
        let port = self.port(name, 1);
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("phys_state"), "5: LinkUp\n");
        write(&port.join("rate"), "100 Gb/sec (4X EDR)\n");
        write(&port.join("link_layer"), "Unknown\n");
        for stat in EFA_PORT_STATS {
            let value = if stat.ends_with("x_bytes") { seed } else { 0 };
            write(&port.join("hw_counters").join(stat), &format!("{value}\n"));
        }
        write(&port.join("hw_counters/lifespan"), "10\n");
    }

    /// A p5.48xlarge's EFA devices: 32 (network cards 0 to 31), named as rdma-core names them
    /// (`rdmap<bus>s<slot>`).
    pub fn p5(&self) -> Vec<String> {
        (0..32)
            .map(|i| {
                let bus = 0x10 + i * 4;
                let name = format!("rdmap{bus}s0");
                self.efa(
                    &name,
                    &format!("0000:{bus:02x}:00.0"),
                    1000 * (i as u64 + 1),
                );
                name
            })
            .collect()
    }

    /// An InfiniBand HCA port (mlx5) with its PMA counters (all 0 but `link_downed`).
    pub fn infiniband(
        &self,
        name: &str,
        bus_id: &str,
        state: &str,
        phys_state: &str,
        link_downed: u64,
    ) {
        self.pci_function(name, bus_id, ("0x15b3", "0x1021", "0x020700"), "mlx5_core");
        let port = self.port(name, 1);
        write(&port.join("state"), &format!("{state}\n"));
        write(&port.join("phys_state"), &format!("{phys_state}\n"));
        write(&port.join("rate"), "400 Gb/sec (4X NDR)\n");
        write(&port.join("link_layer"), "InfiniBand\n");
        for counter in PMA_COUNTERS {
            let value = if counter == "link_downed" {
                link_downed
            } else {
                0
            };
            write(&port.join("counters").join(counter), &format!("{value}\n"));
        }
    }
}

impl Default for Tree {
    fn default() -> Tree {
        Tree::new()
    }
}
