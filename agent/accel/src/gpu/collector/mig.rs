//! Multi-Instance GPU: whether a GPU is in MIG mode, and each MIG device's identity, memory, GPM
//! ratios and XIDs, labelled as dcgm-exporter labels them (`GPU_I_ID`, `GPU_I_PROFILE`).

use prometheus::proto::MetricType;

use super::utilization::{collect_gpm, GpmScope};
use super::{memory, Group, Series};
use crate::gpu::{GpuReading, MigInstance};
use mlnode_core::metrics::family::with_label;

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_mig_mode", "1 while Multi-Instance GPU mode is on, else 0; absent on GPUs without MIG. A MIG GPU reports no GPU-wide utilisation, and its memory only to a holder of the mig/monitor capability.", MetricType::GAUGE),
        ("mlnode_gpu_mig_instance_info", "A MIG device (GPU instance and compute instance) of the GPU, with its MIG UUID; always 1.", MetricType::GAUGE),
        ("mlnode_gpu_mig_memory_used_bytes", "Memory used in the MIG instance.", MetricType::GAUGE),
        ("mlnode_gpu_mig_memory_free_bytes", "Memory free in the MIG instance.", MetricType::GAUGE),
        ("mlnode_gpu_mig_memory_total_bytes", "Memory of the MIG instance.", MetricType::GAUGE),
        ("mlnode_gpu_mig_xid_errors_total", "Critical XID errors NVML placed in a MIG GPU instance since the agent started, per instance and XID (also counted in mlnode_gpu_xid_errors_total).", MetricType::COUNTER),
    ],
    // A MIG device's framebuffer and GPM ratios go under DCGM's GPU names (memory, utilization).
    dcgm: &[],
};

pub(super) fn collect_mode(reading: &GpuReading, series: &mut Series) {
    if let Some(on) = reading.mig_mode {
        series.gauge("mlnode_gpu_mig_mode", f64::from(u8::from(on)));
    }
}

/// One MIG device, under its own labels.
pub(super) fn collect_instance(instance: &MigInstance, series: &mut Series) {
    let mut info = with_label(series.labels, "mig_uuid", &instance.uuid);
    info.push((
        "compute_instance_id",
        instance.compute_instance_id.to_string(),
    ));
    series.out.gauge("mlnode_gpu_mig_instance_info", &info, 1.0);
    if let Some(m) = instance.memory {
        series.gauge("mlnode_gpu_mig_memory_used_bytes", m.used as f64);
        series.gauge("mlnode_gpu_mig_memory_free_bytes", m.free as f64);
        series.gauge("mlnode_gpu_mig_memory_total_bytes", m.total as f64);
        memory::dcgm_framebuffer(m.used, m.free, None, series);
    }
    if let Some(gpm) = &instance.gpm {
        collect_gpm(gpm, GpmScope::MigInstance, series);
    }
}

/// The XIDs NVML placed in one GPU instance, under that instance's labels.
pub(super) fn collect_xids(xid: u64, count: u64, series: &mut Series) {
    series.counter_by(
        "mlnode_gpu_mig_xid_errors_total",
        ("xid", &xid.to_string()),
        count as f64,
    );
}
