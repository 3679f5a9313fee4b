//! Every GPU series the collector can write, as (name, help, type): the agent's own `mlnode_gpu_*`
//! and, with `nvml.dcgm_names`, dcgm-exporter's `DCGM_*` with its names, units and help texts. The
//! descriptions a scrape is checked against; the values are built in `collector.rs`.

use prometheus::proto::MetricType;

use mlnode_core::metrics::family::FamilySpec;

/// (name, help, type) of every family this collector can produce.
pub const FAMILIES: [FamilySpec; 61] = [
    ("mlnode_gpu_pod_memory_used_bytes", "Framebuffer memory the processes of one container hold on the GPU or MIG device (nvml.process_attribution), by the container their cgroup names; empty pod labels for processes no pod owns.", MetricType::GAUGE),
    ("mlnode_gpu_pod_sm_utilization_ratio", "Fraction of the GPU's SMs one container's processes used since the previous sample (nvmlDeviceGetProcessUtilization, nvml.process_attribution); absent on MIG devices, where NVML gives none.", MetricType::GAUGE),
    ("mlnode_gpu_process_attribution_errors_total", "Per-process readings that failed, by reason: NVML refused the process list or their utilisation (processes_no_permission without hostPID, utilization_not_supported), a process exited before its cgroup was read, a cgroup of no known form. Their series are absent.", MetricType::COUNTER),
    ("mlnode_gpu_info", "One per GPU NVML lists, always 1: its labels, and minor_number (the N of /dev/nvidiaN), cuda_compute_capability and cuda_driver_version where NVML gives them.", MetricType::GAUGE),
    ("mlnode_gpu_pci_devices", "NVIDIA GPUs (display and 3D controllers of vendor 0x10de) the kernel lists on the PCI bus, physical functions only; compare with mlnode_gpu_count, NVML's.", MetricType::GAUGE),
    ("mlnode_gpu_pci_virtual_functions", "SR-IOV virtual functions of the NVIDIA GPUs on the PCI bus (entries with a physfn link): slices of the GPUs in mlnode_gpu_pci_devices, not more GPUs.", MetricType::GAUGE),
    ("mlnode_gpu_pci_passthrough", "1 for each NVIDIA GPU on the PCI bus bound to vfio-pci, handed whole to a VM: not for the host's NVML to list.", MetricType::GAUGE),
    ("mlnode_gpu_fabric_state", "The GPU's NVLink fabric registration with Fabric Manager (nvmlGpuFabricState_t): 1 not started, 2 in progress, 3 completed; absent without a fabric (no NVSwitch).", MetricType::GAUGE),
    ("mlnode_gpu_fabric_healthy", "1 when the GPU's fabric registration completed with success (CUDA can use it), else 0; absent without a fabric.", MetricType::GAUGE),
    ("mlnode_gpu_fabric_health", "1 while a fabric health check of nvml.h's healthMask is bad (degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery), 0 while good; absent where the driver reports none.", MetricType::GAUGE),
    ("mlnode_gpu_recovery_action", "The driver's GPU recovery action (NVML field 230, R565 drivers and later): 1 for the action it asks for now, 0 for the others; absent where the driver gives none.", MetricType::GAUGE),
    ("mlnode_gpu_nvml_released", "1 while the agent holds no NVML handle so that a GPU the driver asked to reset can be (nvml.release_timeout at most), else 0; the GPUs' series are absent meanwhile.", MetricType::GAUGE),
    ("mlnode_gpu_nvml_reattaches_total", "Times NVML was taken back after a release, by how: reset (the GPU left the driver and came back), annotation_removed (mlnode.dev/release-gpus removed), mig_config_done (the MIG manager's nvidia.com/mig.config.state left pending), timeout (nvml.release_timeout passed first).", MetricType::COUNTER),
    ("mlnode_gpu_nvml_reinits_total", "Times NVML was initialised again because the GPUs bound to the driver changed (one unbound for a reset or given to vfio, or bound again).", MetricType::COUNTER),
    ("mlnode_gpu_thermal_margin_celsius", "How far below a thermal limit the GPU is (nvml.h's T.Limit field values; negative: past it): shutdown, slowdown (software slowdown), memory_max and gpu_max (throttled below base clock for the memory's or the GPU's temperature); absent where the driver gives none.", MetricType::GAUGE),
    ("mlnode_gpu_nvlink_link_active", "1 while the NVLink link is active, else 0 (nvmlDeviceGetNvLinkState), per link NVML counts (NVML_FI_DEV_NVLINK_LINK_COUNT); absent on GPUs without NVLink.", MetricType::GAUGE),
    ("mlnode_gpu_nvlink_errors_total", "NVLink errors over every link since the driver loaded, per counter (crc_flit, crc_data, replay, recovery; nvml.h's *_ERROR_COUNT_TOTAL field values); absent where the driver does not count one.", MetricType::COUNTER),
    ("mlnode_gpu_nvlink_bytes_total", "NVLink data bytes over every link since the driver loaded, per direction (tx, rx).", MetricType::COUNTER),
    ("mlnode_gpu_mig_xid_errors_total", "Critical XID errors NVML placed in a MIG GPU instance since the agent started, per instance and XID (also counted in mlnode_gpu_xid_errors_total).", MetricType::COUNTER),
    ("mlnode_gpu_mig_mode", "1 while Multi-Instance GPU mode is on, else 0; absent on GPUs without MIG. A MIG GPU reports no GPU-wide utilisation, and its memory only to a holder of the mig/monitor capability.", MetricType::GAUGE),
    ("mlnode_gpu_mig_instance_info", "A MIG device (GPU instance and compute instance) of the GPU, with its MIG UUID; always 1.", MetricType::GAUGE),
    ("mlnode_gpu_mig_memory_used_bytes", "Memory used in the MIG instance.", MetricType::GAUGE),
    ("mlnode_gpu_mig_graphics_engine_active_ratio", "Fraction of time any compute or graphics engine of the MIG GPU instance was active (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_mig_sm_active_ratio", "Fraction of time the MIG GPU instance's SMs had at least one warp assigned (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_mig_tensor_pipe_active_ratio", "Fraction of time the MIG GPU instance's SMs ran any tensor operation (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_mig_dram_active_ratio", "Fraction of the theoretical DRAM bandwidth used by the MIG GPU instance (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_mig_memory_free_bytes", "Memory free in the MIG instance.", MetricType::GAUGE),
    ("mlnode_gpu_mig_memory_total_bytes", "Memory of the MIG instance.", MetricType::GAUGE),
    ("mlnode_gpu_readings_age_seconds", "Time since the NVML sampler last finished reading every GPU; past five sample intervals (at least 3 s) the readings are dropped as not current.", MetricType::GAUGE),
    ("mlnode_gpu_memory_copy_utilization_ratio", "Fraction of the last sample period the memory controller was busy.", MetricType::GAUGE),
    ("mlnode_gpu_encoder_utilization_ratio", "Fraction of the last sample period the video encoder was busy.", MetricType::GAUGE),
    ("mlnode_gpu_decoder_utilization_ratio", "Fraction of the last sample period the video decoder was busy.", MetricType::GAUGE),
    ("mlnode_gpu_pcie_replays_total", "PCIe replays (retries after link errors) since the driver loaded.", MetricType::COUNTER),
    ("mlnode_gpu_remapped_rows_total", "HBM rows remapped to spares, per cause (correctable, uncorrectable ECC errors).", MetricType::COUNTER),
    ("mlnode_gpu_row_remap_pending", "1 while a row remapping waits for the next GPU reset, else 0.", MetricType::GAUGE),
    ("mlnode_gpu_row_remap_failed", "1 when a row remapping has failed (no spare row left), else 0.", MetricType::GAUGE),
    ("mlnode_gpu_memory_temperature_celsius", "HBM temperature.", MetricType::GAUGE),
    ("mlnode_gpu_pcie_bytes_per_second", "PCIe throughput over NVML's last 20 ms sample, per direction (tx, rx).", MetricType::GAUGE),
    ("mlnode_gpu_graphics_engine_active_ratio", "Fraction of time any compute or graphics engine was active (GPM, Hopper and later).", MetricType::GAUGE),
    ("mlnode_gpu_sm_active_ratio", "Fraction of time the SMs had at least one warp assigned, averaged over SMs (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_tensor_pipe_active_ratio", "Fraction of time the SMs ran any tensor operation (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_dram_active_ratio", "Fraction of the theoretical DRAM bandwidth used (GPM).", MetricType::GAUGE),
    ("mlnode_gpu_xid_info", "The most recent critical XID error and NVIDIA's description of it; always 1.", MetricType::GAUGE),
    (
        "mlnode_gpu_memory_free_bytes",
        "Framebuffer memory free.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_memory_used_bytes",
        "Framebuffer memory used.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_memory_reserved_bytes",
        "Framebuffer memory reserved by the driver and firmware.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_memory_total_bytes",
        "Framebuffer memory installed.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_clock_event_reason_active",
        "1 while the clock event (throttle) reason holds, else 0.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_clock_event_reason_seconds_total",
        "Time the clock event reason was seen holding, sampled.",
        MetricType::COUNTER,
    ),
    (
        "mlnode_gpu_xid_errors_total",
        "XID errors per XID, with NVIDIA's catalog's immediate action for it: those NVML reported since the agent started or, with the kernel log read, this boot's, each once whichever source saw it.",
        MetricType::COUNTER,
    ),
    (
        "mlnode_gpu_last_xid",
        "The most recent critical XID error since the agent started.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_sm_clock_hertz",
        "SM clock frequency.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_memory_clock_hertz",
        "Memory clock frequency.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_temperature_celsius",
        "GPU temperature.",
        MetricType::GAUGE,
    ),
    ("mlnode_gpu_power_watts", "Power draw.", MetricType::GAUGE),
    (
        "mlnode_gpu_power_limit_watts",
        "The power limit the driver enforces (nvmlDeviceGetEnforcedPowerLimit: the lowest of the limits set and the board's), the ceiling power draw is held under.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_utilization_ratio",
        "Fraction of the last sample period in which a kernel ran on the GPU.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_energy_joules_total",
        "Energy consumed since the driver was loaded.",
        MetricType::COUNTER,
    ),
    (
        "mlnode_gpu_lost",
        "1 when NVML reports the GPU fell off the bus, else 0.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_failure",
        "1 while NVML cannot read the GPU, with why (lost, reset_required, irq_issue, no_permission, unknown); absent while it can. Its readings are then absent, not stale.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_gpu_count",
        "GPUs NVML reports on the node.",
        MetricType::GAUGE,
    ),
];

/// dcgm-exporter's names, units and help texts (its default counters), for nodes without it.
pub const DCGM_FAMILIES: [FamilySpec; 30] = [
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", MetricType::GAUGE),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", MetricType::COUNTER),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", MetricType::GAUGE),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", MetricType::GAUGE),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", MetricType::GAUGE),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", MetricType::COUNTER),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", MetricType::COUNTER),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.", MetricType::COUNTER),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors.", MetricType::COUNTER),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", MetricType::COUNTER),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.", MetricType::COUNTER),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", MetricType::GAUGE),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", MetricType::GAUGE),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", MetricType::GAUGE),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", MetricType::GAUGE),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", MetricType::GAUGE),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", MetricType::GAUGE),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", MetricType::GAUGE),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Frame buffer memory free (in MiB).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Frame buffer memory used (in MiB).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "Frame buffer memory reserved (in MiB).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        MetricType::GAUGE,
    ),
    // dcgm-exporter declares it a counter (etc/default-counters.csv) though a windowed count
    // falls; a gauge says what it is, and PromQL written for dcgm-exporter reads it the same.
    (
        "DCGM_EXP_XID_ERRORS_COUNT",
        "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw (in W).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        MetricType::GAUGE,
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        MetricType::COUNTER,
    ),
];
