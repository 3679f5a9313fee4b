//! Generated Neuron sysfs trees, laid out as the Neuron Sysfs User Guide describes.

use std::path::{Path, PathBuf};

/// `neuron_sysfs_metrics.c:75-100`, in the driver's order.
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

pub struct NeuronTree {
    pub dir: tempfile::TempDir,
    pub devices: u32,
    pub cores: u32,
}

pub fn write(path: &Path, value: impl ToString) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, value.to_string()).unwrap();
}

impl NeuronTree {
    /// `devices` devices of `cores` NeuronCores, every node the user guide lists.
    pub fn new(instance_type: &str, devices: u32, cores: u32) -> NeuronTree {
        let tree = NeuronTree {
            dir: tempfile::tempdir().unwrap(),
            devices,
            cores,
        };
        for d in 0..devices {
            let dev = tree.device(d);
            write(&dev.join("info/architecture/arch_type"), "NCv2");
            write(&dev.join("info/architecture/instance_type"), instance_type);
            write(
                &dev.join("info/architecture/device_name"),
                if instance_type.starts_with("trn") {
                    "Trainium"
                } else {
                    "Inferentia2"
                },
            );
            // Root-only nodes, as the driver has them (mode 0400): the agent must not need them.
            write(&dev.join("core_count"), cores);
            write(&dev.join("stats/hardware/mem_ecc_uncorrected"), 0);
            write(
                &dev.join("stats/hardware/mem_ecc_repairable_uncorrected"),
                0,
            );
            write(&dev.join("stats/hardware/sram_ecc_uncorrected"), 0);
            write(
                &dev.join("stats/power/utilization"),
                "POWER_STATUS_VALID,1796000000,10.00,62.50,40.25",
            );
            for category in ["application_memory", "dma_rings", "driver_memory"] {
                write(
                    &dev.join(format!("stats/memory_usage/host_mem/{category}/total")),
                    1_000_000 + d,
                );
                write(
                    &dev.join(format!("stats/memory_usage/host_mem/{category}/present")),
                    0,
                );
                write(
                    &dev.join(format!("stats/memory_usage/host_mem/{category}/peak")),
                    2_000_000,
                );
            }
            for c in 0..cores {
                let core = dev.join(format!("neuron_core{c}/stats"));
                for category in ["constants", "model_code", "tensors", "runtime_memory"] {
                    write(
                        &core.join(format!("memory_usage/device_mem/{category}/total")),
                        1u64 << 30,
                    );
                    write(
                        &core.join(format!("memory_usage/device_mem/{category}/present")),
                        0,
                    );
                    write(
                        &core.join(format!("memory_usage/device_mem/{category}/peak")),
                        3u64 << 30,
                    );
                }
                // The status counters as the driver names them: aws-neuron-driver
                // neuron_sysfs_metrics.c:75-100 (2.14 to 2.25.4; 2.7.x had infer_* for the three
                // execute_* names). neuron-monitor's execution_summary names (completed, timed_out,
                // ...) were never written by a driver.
                for status in DRIVER_STATUS_NAMES {
                    write(
                        &core.join(format!("status/{status}/total")),
                        if status == "success" { 1000 + c } else { 0 },
                    );
                    write(&core.join(format!("status/{status}/present")), 0);
                }
                write(&core.join("other_info/model_load_count"), 2);
                write(&core.join("other_info/inference_count"), 1000 + c);
                write(&core.join("other_info/reset_req_count"), 0);
                write(&core.join("other_info/reset_fail_count"), 0);
                write(&core.join("other_info/nc_time_in_use"), 5_000_000);
            }
        }
        tree
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn device(&self, d: u32) -> PathBuf {
        self.dir.path().join(format!("neuron{d}"))
    }

    pub fn core_stats(&self, d: u32, c: u32) -> PathBuf {
        self.device(d).join(format!("neuron_core{c}/stats"))
    }
}
