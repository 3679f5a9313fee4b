//! NVIDIA GPUs through NVML: framebuffer, clock event reasons, XID errors, clocks, power,
//! temperature, utilisation; labelled as dcgm-exporter labels them.
//!
//! [`nvml`] talks to the driver (the only side effect), [`state`] keeps what was read as plain data
//! (and is tested without a GPU), [`collector`] turns that state into series at scrape time.

pub mod attribution;
pub mod collector;
pub mod health;
mod nvml;
pub mod release;
pub mod settings;
pub mod state;
mod virtual_gpus;
pub mod xid;

/// NVML's clock event (formerly "throttle") reasons: bit and series label, as nvml.h defines them.
pub const CLOCK_EVENT_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// What identifies a GPU in its labels. Kept from the last good read, so a GPU that falls off the
/// bus is still named by its UUID and PCI address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuIdentity {
    pub index: u32,
    pub uuid: String,
    /// As dcgm-exporter writes it: `00000000:07:00.0`.
    pub pci_bus_id: String,
    pub model_name: String,
    /// The N of `/dev/nvidiaN`, which need not be `index` (NVML orders GPUs by PCI address, the
    /// driver numbers its device files in probe order).
    pub minor_number: Option<u32>,
    /// CUDA compute capability (major, minor): 9.0 on Hopper, 10.0 on Blackwell.
    pub compute_capability: Option<(i32, i32)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReading {
    pub total: u64,
    pub used: u64,
    pub free: u64,
    /// Only from NVML's v2 memory call (driver R510+); absent on older drivers.
    pub reserved: Option<u64>,
}

/// One sample of one GPU. A field the GPU or driver does not support is None, and its series is
/// absent: a 0 would claim a reading that was never made.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    pub memory: Option<MemoryReading>,
    pub clock_event_reasons: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    /// `nvmlDeviceGetEnforcedPowerLimit`, milliwatts.
    pub power_limit_mw: Option<u32>,
    pub utilization_gpu_pct: Option<u32>,
    pub energy_mj: Option<u64>,
    /// Percent of the last sample period the memory controller was busy (NVML's "memory"
    /// utilisation, DCGM's MEM_COPY_UTIL).
    pub memory_copy_util_pct: Option<u32>,
    pub encoder_util_pct: Option<u32>,
    pub decoder_util_pct: Option<u32>,
    /// PCIe replays since the driver loaded.
    pub pcie_replays: Option<u32>,
    pub remapped_rows: Option<RemappedRows>,
    /// HBM temperature (`NVML_FI_DEV_MEMORY_TEMP`).
    pub memory_temp_c: Option<u32>,
    /// (transmitted, received) over NVML's last 20 ms PCIe sample.
    pub pcie_bytes_per_second: Option<(u64, u64)>,
    /// NVLink data bytes (transmitted, received) over every link since the driver loaded.
    pub nvlink_bytes: Option<(u64, u64)>,
    /// The GPU's NVLink links and their error counts; None on a GPU without NVLink.
    pub nvlink: Option<NvLinkReading>,
    /// How far below each thermal limit the GPU is, °C, in [`THERMAL_LIMITS`] order (nvml.h's
    /// T.Limit field values; negative: past it); None where the driver does not give one.
    pub thermal_margins: [Option<i64>; 4],
    /// GPU Performance Monitoring ratios between two samples (Hopper and later).
    pub gpm: Option<GpmReading>,
    /// Whether MIG is on (None: the GPU has no MIG).
    pub mig_mode: Option<bool>,
    /// The MIG devices of a MIG-enabled GPU.
    pub mig: Vec<MigInstance>,
    /// NVML's GPU recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, field 230; R565 drivers
    /// and later): 0 none, else what the driver asks for (see [`health::RECOVERY_ACTIONS`]). None:
    /// the driver gives none, and NVIDIA's XID catalog decides alone.
    pub recovery_action: Option<u32>,
    /// NVLink fabric registration (NVSwitch systems, Hopper and later); None where there is no
    /// fabric (NOT_SUPPORTED, or the state NOT_SUPPORTED).
    pub fabric: Option<FabricReading>,
    /// The processes on the GPU (`nvml.process_attribution`); None when not read, or NVML refused.
    pub processes: Option<Vec<GpuProcess>>,
    /// Why some of the per-process reading failed this time (each counted, said once).
    pub attribution_trouble: Vec<&'static str>,
}

impl GpuReading {
    /// Why per-process reading failed this time: NVML's refusals, then each process whose owner
    /// cannot be told.
    pub fn attribution_errors(&self) -> impl Iterator<Item = &'static str> + '_ {
        let owners = self
            .processes
            .iter()
            .chain(self.mig.iter().flat_map(|m| m.processes.iter()))
            .flatten()
            .filter_map(|p| p.owner.as_ref().err().copied());
        self.attribution_trouble.iter().copied().chain(owners)
    }
}

/// A process NVML lists on a GPU or a MIG device (compute or graphics), and whose it is.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    /// Framebuffer bytes it holds; None where NVML cannot tell (`NVML_VALUE_NOT_AVAILABLE`).
    pub memory_bytes: Option<u64>,
    /// Its SM use over the interval since the previous read, 0-1: the mean of the samples
    /// `nvmlDeviceGetProcessUtilization` gives for it since the last one seen; 0 with none (NVML
    /// lists only processes that used the SMs). None: no per-process utilisation here (a MIG
    /// device, or NVML refused).
    pub sm_ratio: Option<f64>,
    /// Whose it is, from its cgroup; Err says why that cannot be told.
    pub owner: Result<CgroupOwner, &'static str>,
}

/// NVLink's error counters summed over a GPU's links: (the nvml.h field value, the
/// `mlnode_gpu_nvlink_errors_total` label, dcgm-exporter's series, which its
/// etc/default-counters.csv lists commented out). The fields are those of the pre-Blackwell
/// generations (nvml.h: NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL);
/// a driver that lacks one answers NOT_SUPPORTED in its slot, and its series is absent.
pub const NVLINK_ERROR_COUNTERS: [(u32, &str, &str); 4] = [
    (
        38,
        "crc_flit",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    ),
    (
        45,
        "crc_data",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    ),
    (52, "replay", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    (
        59,
        "recovery",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ),
];

/// nvml.h's T.Limit field values: (field, the `limit` label). Each is the distance in °C to the
/// temperature past which the GPU shuts down, slows down (software slowdown), or is throttled
/// below base clock for its memory's or its own temperature; `nvidia-smi -q`'s "T.Limit Temp".
pub const THERMAL_LIMITS: [(u32, &str); 4] = [
    (193, "shutdown"),
    (194, "slowdown"),
    (195, "memory_max"),
    (196, "gpu_max"),
];

/// Where `recovery` sits in [`NVLINK_ERROR_COUNTERS`]: a link that had to be retrained, the
/// counter the health verdict watches.
pub const NVLINK_RECOVERY: usize = 3;

/// A GPU's NVLink links (nvml.h: `NVML_FI_DEV_NVLINK_LINK_COUNT` says how many,
/// `nvmlDeviceGetNvLinkState` whether each is active) and its error counts since the driver
/// loaded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NvLinkReading {
    /// (link, active) for each link whose state NVML gives.
    pub links: Vec<(u32, bool)>,
    /// In [`NVLINK_ERROR_COUNTERS`] order; None where the driver does not count it.
    pub errors: [Option<u64>; 4],
}

/// `nvmlGpuFabricInfo_t`/`_v2_t`/`_v3_t` (nvml.h): the GPU's registration with Fabric Manager.
/// CUDA fails on the GPU until `state` is COMPLETED with `status` SUCCESS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricReading {
    /// `nvmlGpuFabricState_t`: NOT_SUPPORTED 0, NOT_STARTED 1, IN_PROGRESS 2, COMPLETED 3.
    pub state: u8,
    /// An `nvmlReturn_t`, meaningful only once the state is COMPLETED.
    pub status: u32,
    /// `healthMask` (v2 and later; None from the v1 call).
    pub health_mask: Option<u32>,
}

impl FabricReading {
    pub const NOT_STARTED: u8 = 1;
    pub const IN_PROGRESS: u8 = 2;
    pub const COMPLETED: u8 = 3;

    /// Registered and usable for CUDA.
    pub fn is_ready(&self) -> bool {
        self.state == Self::COMPLETED && self.status == 0
    }

    /// `NVML_GPU_FABRIC_HEALTH_GET(mask, field)`: `(mask >> shift) & width`, for the health checks
    /// nvml.h defines with 1 as the bad value (degraded bandwidth, route recovery in progress,
    /// route unhealthy, access-timeout recovery in progress): the check's name and whether it is
    /// bad, for each the driver reports (0 in a field: not supported).
    pub fn health_checks(&self) -> Vec<(&'static str, bool)> {
        const CHECKS: [(&str, u32); 4] = [
            ("degraded_bandwidth", 0),
            ("route_recovery", 2),
            ("route_unhealthy", 4),
            ("access_timeout_recovery", 6),
        ];
        let Some(mask) = self.health_mask else {
            return Vec::new();
        };
        CHECKS
            .iter()
            .filter_map(|&(name, shift)| match (mask >> shift) & 0x3 {
                0 => None,
                value => Some((name, value == 1)),
            })
            .collect()
    }
}

/// One MIG device (a GPU instance with a compute instance), as dcgm-exporter labels it:
/// `GPU_I_ID`, `GPU_I_PROFILE`, and the parent GPU's labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MigInstance {
    /// `MIG-<uuid>`, the id the device plugin hands a pod.
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `1g.10gb`, from the MIG device's name (`<GPU name> MIG <profile>`).
    pub profile: String,
    pub memory: Option<MemoryReading>,
    /// The GPU instance's GPM ratios (`nvmlGpmMigSampleGet`), from the second read on.
    pub gpm: Option<GpmReading>,
    /// The processes on the MIG device (`nvml.process_attribution`), as on a GPU.
    pub processes: Option<Vec<GpuProcess>>,
}

/// `nvmlDeviceGetRemappedRows`: HBM rows remapped since manufacture, the standard memory health
/// signal on A100 and later.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for the next GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU has no spare rows left where it needed one.
    pub failed: bool,
}

/// NVML GPM metrics as fractions (0-1) of the interval between two samples; the analogues of
/// dcgm-exporter's `DCGM_FI_PROF_*` profiling fields.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmReading {
    pub graphics_active: Option<f64>,
    pub sm_active: Option<f64>,
    pub tensor_active: Option<f64>,
    pub dram_active: Option<f64>,
}

use std::sync::Arc;

use mlnode_core::assignments::SharedAssignments;
use mlnode_core::cgroup::CgroupOwner;
use mlnode_core::pods::PodNames;
use mlnode_core::settings::Toggle;
use mlnode_core::shared::Shared;
use settings::{NvmlSettings, PodLabels};

/// Five sampling rounds, at least 3 s: a round slower than that has a call hanging in the driver.
pub fn stall_after(sample_interval: std::time::Duration) -> std::time::Duration {
    (sample_interval * 5).max(std::time::Duration::from_secs(3))
}

/// The running GPU collector: its state (shared with the pod-resources poller) and its stop switch.
pub struct GpuRuntime {
    pub state: Shared<state::GpuState>,
    /// How many GPUs NVML listed at start.
    pub gpus: u32,
    stop: Arc<nvml::Stop>,
}

impl GpuRuntime {
    /// Opens NVML, starts the sampler and XID threads, and registers the collector. Err says why
    /// there is no GPU collector; the agent runs on without one.
    // Each argument is a different thing the collector shares with another part of the agent.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        settings: &NvmlSettings,
        assignments: SharedAssignments,
        pod_names: PodNames,
        resource_names: Vec<String>,
        registry: &prometheus::Registry,
        up: mlnode_core::metrics::AgentMetrics,
        kernel_log: Option<Shared<crate::kernel_log::facts::LogFacts>>,
        release_asked: Shared<release::NodeAsks>,
    ) -> Result<GpuRuntime, String> {
        if settings.enabled == Toggle::Off {
            return Err("disabled (nvml.enabled: false)".into());
        }
        let source = nvml::NvmlSource::open(&settings.library)?;
        let count = source.device_count()?;
        let state = Shared::new(state::GpuState {
            stall_after: stall_after(settings.sample_interval.get()),
            expected_gpus: settings.expected_gpus.map(|n| n.get()),
            xid_count_window: settings.xid_count_window.get(),
            nvlink_error_window: settings.nvlink_error_window.get(),
            ..state::GpuState::default()
        });
        let style = collector::LabelStyle {
            legacy_pod_labels: settings.pod_labels == PodLabels::Legacy,
        };
        let collector = collector::GpuCollector::new(
            state.clone(),
            assignments,
            pod_names,
            resource_names,
            style,
            settings.dcgm_names,
            kernel_log,
        )
        .map_err(|e| e.to_string())?;
        registry
            .register(Box::new(collector))
            .map_err(|e| e.to_string())?;
        let stop = Arc::new(nvml::Stop::default());
        nvml::spawn(
            source,
            nvml::Reopen {
                library: settings.library.clone(),
                asked: release_asked,
                release_for_reset: settings.release_for_reset,
                release_timeout: settings.release_timeout.get(),
            },
            state.clone(),
            settings.sample_interval.get(),
            settings.pci_devices.clone(),
            settings
                .process_attribution
                .then(|| settings.proc_root.clone()),
            stop.clone(),
            up,
        )
        .map_err(|e| format!("cannot start the NVML threads: {e}"))?;
        Ok(GpuRuntime {
            state,
            gpus: count,
            stop,
        })
    }

    pub fn stop(&self) {
        self.stop.stop();
    }
}
