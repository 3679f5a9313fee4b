//! Neuron sysfs trees written as the Neuron driver writes them. Every path, file shape and fixed
//! value is cited to aws-neuron/aws-neuron-driver at fca19f7 (aws-neuronx-dkms 2.24.7.0; the
//! sysfs code is byte-identical in 2.23.9.0 and 2.25.4.0), `neuron_sysfs_metrics.c` unless another
//! file is named. Runtime-dependent values (memory in use, execution counts, cycle counts) are
//! arbitrary but of the driver's format.

use std::path::{Path, PathBuf};

/// `status_counter_nodes_info_tbl`, `:75-100`, in the driver's order.
pub const DRIVER_STATUS_NAMES: [&str; 24] = [
    "success",
    "failure",
    "timeout",
    "exec_bad_input",
    "hw_error",
    "execute_completed_with_error",
    "execute_completed_with_num_error",
    "generic_error",
    "resource_error",
    "resource_nc_error",
    "execute_failed_to_queue",
    "invalid_error",
    "unsupported_neff_version",
    "oob_error",
    "hw_collectives_error",
    "hw_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "execute_sw_nq_overflow",
    "execute_sw_semaphore_error",
    "execute_sw_event_error",
    "execute_sw_psum_collision",
    "execute_sw_sequencer_fatal",
    "hw_repairable_hbm_ue_error",
];

/// `device_mem_category_counter_nodes_info_tbl`, `:103-115`.
const DEVICE_MEM_CATEGORIES: [&str; 11] = [
    "model_code",
    "tensors",
    "constants",
    "model_shared_scratchpad",
    "runtime_memory",
    "driver_memory",
    "collectives",
    "nonshared_scratchpad",
    "notifications",
    "dma_rings",
    "uncategorized",
];

/// `host_mem_category_counter_nodes_info_tbl`, `:118-127`.
const HOST_MEM_CATEGORIES: [&str; 8] = [
    "dma_buffers",
    "tensors",
    "constants",
    "application_memory",
    "driver_memory",
    "notifications",
    "dma_rings",
    "uncategorized",
];

/// `custom_counter_nodes_info_tbl`, `:131-138`, with the driver version each appeared in
/// (`nc_time_in_use` since 2.21, per the driver's release history).
const OTHER_INFO: [&str; 6] = [
    "model_load_count",
    "reset_req_count",
    "reset_fail_count",
    "inference_count",
    "flop_count",
    "nc_time_in_use",
];

/// The chip generations the driver supports, with what its hardware layer sets for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chip {
    /// `v1/neuron_dhal_v1.c:54-57`; `V1_NC_PER_DEVICE 4` (`v1/address_map.h:77`).
    Inferentia,
    /// `v2/neuron_dhal_v2.c:110-113`; `V2_NC_PER_DEVICE 2`.
    Inferentia2,
    /// `v2/neuron_dhal_v2.c:98-101`.
    Trainium1,
    /// `v3/neuron_dhal_v3.c:223-226`; 8 physical cores (`v3/address_map.h:46-53`).
    Trainium2,
}

impl Chip {
    /// (device arch_type, core arch_type, instance_type, device_name): `"ND"`/`"NC"` + the hardware
    /// layer's suffix (`:242-250`).
    fn names(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            Chip::Inferentia => ("NDv1", "NCv1", "Inf1", "Inferentia"),
            Chip::Inferentia2 => ("NDv3", "NCv2", "Inf2", "Inferentia2"),
            Chip::Trainium1 => ("NDv2", "NCv2", "Trn1", "Trainium1"),
            Chip::Trainium2 => ("NDv3", "NCv3", "Trn2", "Trainium2"),
        }
    }

    pub fn physical_cores(self) -> u32 {
        match self {
            Chip::Inferentia => 4,
            Chip::Inferentia2 | Chip::Trainium1 => 2,
            Chip::Trainium2 => 8,
        }
    }
}

/// An EC2 instance shape: its chip and device count.
#[derive(Clone, Copy, Debug)]
pub struct Instance {
    pub ec2_type: &'static str,
    pub chip: Chip,
    pub devices: u32,
}

/// inf1.24xlarge: 16 Inferentia devices.
pub const INF1_24XLARGE: Instance = Instance {
    ec2_type: "inf1.24xlarge",
    chip: Chip::Inferentia,
    devices: 16,
};
/// inf2.xlarge: 1 Inferentia2 device.
pub const INF2_XLARGE: Instance = Instance {
    ec2_type: "inf2.xlarge",
    chip: Chip::Inferentia2,
    devices: 1,
};
/// inf2.48xlarge: 12 Inferentia2 devices.
pub const INF2_48XLARGE: Instance = Instance {
    ec2_type: "inf2.48xlarge",
    chip: Chip::Inferentia2,
    devices: 12,
};
/// trn1.32xlarge: 16 Trainium devices.
pub const TRN1_32XLARGE: Instance = Instance {
    ec2_type: "trn1.32xlarge",
    chip: Chip::Trainium1,
    devices: 16,
};
/// trn2.48xlarge: 16 Trainium2 devices.
pub const TRN2_48XLARGE: Instance = Instance {
    ec2_type: "trn2.48xlarge",
    chip: Chip::Trainium2,
    devices: 16,
};

/// Driver releases whose sysfs trees differ (release history per tag: 2.14 added
/// `stats/hardware`; 2.21 power and `nc_time_in_use`; 2.23 `mem_ecc_repairable_uncorrected` and
/// `tensor_engine/pe_cntrs`; 2.23 to 2.25.4 are identical).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Driver {
    V2_14,
    V2_25,
}

/// A Neuron sysfs tree in a folder of its own, as the driver writes it.
pub struct NeuronTree {
    pub dir: tempfile::TempDir,
    pub class: tempfile::TempDir,
    pub instance: Instance,
    pub driver: Driver,
}

/// A directory in memory where the machine has one (`/dev/shm`): a trn2.48xlarge tree is 20,000
/// files, which a disk-backed /tmp takes seconds to write and delete.
fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// Writes one sysfs attribute, its folders made.
pub fn write(path: &Path, value: impl ToString) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, value.to_string()).unwrap();
}

/// A counter node: a directory with `total` and `present` (`COUNTER_ATTR_INFO_TBL`; counters have
/// been directories since sysfs appeared in 2.7.15). `"%llu\n"` (`:290`).
fn counter(dir: &Path, total: u64) {
    write(&dir.join("total"), format!("{total}\n"));
    write(&dir.join("present"), "0\n");
}

/// A memory node: `total` (current use), `present` (last change) and `peak` (`MEM_USAGE_COUNTER_ATTR_INFO_TBL`).
fn memory(dir: &Path, total: u64, peak: u64) {
    write(&dir.join("total"), format!("{total}\n"));
    write(&dir.join("present"), "0\n");
    write(&dir.join("peak"), format!("{peak}\n"));
}

/// `pe_cntrs`: header and four row groups (`pe_row_grp_count = 4`, `v2/neuron_dhal_v2.c:1777`,
/// `v3/neuron_dhal_v3.c:2171`), `"%d,%llu,%llu,%llu\n"` (`vc/neuron_dhal_vc.c:101,123`). Each row
/// gets a quarter of the given cycles.
pub fn pe_cntrs(matmul: u64, weight_load: u64, idle: u64) -> String {
    let mut text = String::from("xrow_grp,mm_active,wl_active,idle\n");
    for group in 0..4 {
        text.push_str(&format!(
            "{group},{},{},{}\n",
            matmul / 4,
            weight_load / 4,
            idle / 4
        ));
    }
    text
}

impl NeuronTree {
    /// The tree driver 2.25 writes on `instance`.
    pub fn new(instance: Instance) -> NeuronTree {
        NeuronTree::with_driver(instance, Driver::V2_25)
    }

    /// The tree `driver` writes on `instance`.
    pub fn with_driver(instance: Instance, driver: Driver) -> NeuronTree {
        let tree = NeuronTree {
            dir: scratch_dir(),
            class: scratch_dir(),
            instance,
            driver,
        };
        let chip = instance.chip;
        let (nd_arch, nc_arch, family, device_name) = chip.names();
        let v2_or_later = chip != Chip::Inferentia;
        for d in 0..instance.devices {
            let dev = tree.device(d);
            // info/architecture (`root_arch_node_attrs_info_tbl`, `:141-145`), "%s\n".
            write(
                &dev.join("info/architecture/arch_type"),
                format!("{nd_arch}\n"),
            );
            write(
                &dev.join("info/architecture/instance_type"),
                format!("{family}\n"),
            );
            write(
                &dev.join("info/architecture/device_name"),
                format!("{device_name}\n"),
            );
            write(&dev.join("info/notify_delay"), "-1\n");
            if v2_or_later {
                // `root_info_node_attrs_info_tbl_v2/_v3`; "%016llx\n" (`:373`).
                write(
                    &dev.join("info/serial_number"),
                    format!("{:016x}\n", 0x5e71_a100_0000_0000u64 + u64::from(d)),
                );
            }
            // Root-only (0400, `neuron_cdev.c:3002,3037`): here for shape; the agent never reads them.
            write(
                &dev.join("core_count"),
                format!("{}\n", chip.physical_cores()),
            );
            for category in HOST_MEM_CATEGORIES {
                memory(
                    &dev.join(format!("stats/memory_usage/host_mem/{category}")),
                    1_000_000 + u64::from(d),
                    2_000_000,
                );
            }
            // ECC: plain files, "%u\n" (`:345-363`); none on Inf1 (`v1/neuron_dhal_v1.c:662-669`).
            if v2_or_later {
                write(&dev.join("stats/hardware/sram_ecc_uncorrected"), "0\n");
                write(&dev.join("stats/hardware/mem_ecc_uncorrected"), "0\n");
                if driver >= Driver::V2_25 {
                    write(
                        &dev.join("stats/hardware/mem_ecc_repairable_uncorrected"),
                        "0\n",
                    );
                }
            }
            if driver >= Driver::V2_25 {
                // `neuron_power.c:410-414`; Inf1 firmware gives no samples.
                let line = if v2_or_later {
                    "POWER_STATUS_VALID,1796000000,10.00,62.50,40.25\n"
                } else {
                    "POWER_STATUS_NO_DATA,1796000000,0.00,0.00,0.00\n"
                };
                write(&dev.join("stats/power/utilization"), line);
            }
            for c in 0..chip.physical_cores() {
                tree.write_core(d, c, nc_arch, v2_or_later);
            }
        }
        // Outside a 4-node UltraServer a Trn2 node id reads -1 (`v3/neuron_pelect.c:1258-1261`);
        // other chips have no node id and the attribute reads empty (`neuron_cdev.c:3162-3167`).
        let node_id = if chip == Chip::Trainium2 { "-1\n" } else { "" };
        write(&tree.class_root().join("node_id_4"), node_id);
        tree
    }

    /// `nsysfsmetric_init_and_add_nc_default_nodes`, `:640-738`.
    fn write_core(&self, d: u32, c: u32, nc_arch: &str, v2_or_later: bool) {
        let core = self.device(d).join(format!("neuron_core{c}"));
        write(
            &core.join("info/architecture/arch_type"),
            format!("{nc_arch}\n"),
        );
        let stats = core.join("stats");
        for status in DRIVER_STATUS_NAMES {
            counter(
                &stats.join(format!("status/{status}")),
                if status == "success" {
                    1000 + u64::from(c)
                } else {
                    0
                },
            );
        }
        // Per-core aggregates next to the categories (`:678-689`).
        memory(&stats.join("memory_usage/host_mem"), 4096, 8192);
        memory(&stats.join("memory_usage/device_mem"), 11 << 28, 12 << 28);
        for category in DEVICE_MEM_CATEGORIES {
            memory(
                &stats.join(format!("memory_usage/device_mem/{category}")),
                1 << 28,
                3 << 28,
            );
        }
        for name in OTHER_INFO {
            if name == "nc_time_in_use" && self.driver < Driver::V2_25 {
                continue;
            }
            let value = match name {
                "model_load_count" => 2,
                "inference_count" => 1000 + u64::from(c),
                "flop_count" => 4_000_000_000,
                "nc_time_in_use" => 5_000_000,
                _ => 0,
            };
            counter(&stats.join(format!("other_info/{name}")), value);
        }
        if v2_or_later && self.driver >= Driver::V2_25 {
            write(
                &stats.join("tensor_engine/pe_cntrs"),
                pe_cntrs(0, 0, 4_000_000),
            );
        }
    }

    /// `/sys/devices/virtual/neuron_device`.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `/sys/class/neuron_device`, where the driver's class attributes (`node_id_4`) live.
    pub fn class_root(&self) -> &Path {
        self.class.path()
    }

    /// The PCI devices directory the kernel would show for this instance's Neuron devices
    /// (`neuron.pci_devices`), made on the first call: one `0000:bb:00.0` entry per device with
    /// vendor 0x1d0f and the chip's device id as the driver's `neuron_device.h` (7c0d02c) names it
    /// (INF1 0x7064, INF2 0x7264, TRN1 0x7164, TRN2 0x7364), `vendor`/`device` as "0x%04x\n" and
    /// `class` as "0x%06x\n" (linux `drivers/pci/pci-sysfs.c`); plus an ENA NIC, which is none.
    pub fn pci_devices(&self) -> PathBuf {
        let root = self.class.path().join("pci-devices");
        if root.exists() {
            return root;
        }
        let device_id = match self.instance.chip {
            Chip::Inferentia => "0x7064",
            Chip::Inferentia2 => "0x7264",
            Chip::Trainium1 => "0x7164",
            Chip::Trainium2 => "0x7364",
        };
        let entry = |bdf: String, device: &str| {
            let dir = root.join(bdf);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, value) in [
                ("vendor", "0x1d0f"),
                ("device", device),
                ("class", "0x088000"),
            ] {
                std::fs::write(dir.join(file), format!("{value}\n")).unwrap();
            }
        };
        for i in 0..self.instance.devices {
            entry(format!("0000:{:02x}:00.0", 0x10 + i), device_id);
        }
        entry("0000:00:05.0".into(), "0xec20");
        root
    }

    pub fn device(&self, d: u32) -> PathBuf {
        self.root().join(format!("neuron{d}"))
    }

    pub fn core_stats(&self, d: u32, c: u32) -> PathBuf {
        self.device(d).join(format!("neuron_core{c}/stats"))
    }

    /// The live tensor-engine counters of a physical core.
    pub fn set_cycles(&self, d: u32, c: u32, matmul: u64, weight_load: u64, idle: u64) {
        write(
            &self.core_stats(d, c).join("tensor_engine/pe_cntrs"),
            pe_cntrs(matmul, weight_load, idle),
        );
    }
}
