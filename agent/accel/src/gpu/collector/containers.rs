//! Who uses a GPU (`nvml.process_attribution`): each container's framebuffer and SM use, by the
//! pod its processes' cgroup names, and the per-process readings that failed.

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::attribution::ContainerUse;
use crate::gpu::state::GpuState;
use mlnode_core::metrics::family::Families;

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_pod_memory_used_bytes", "Framebuffer memory the processes of one container hold on the GPU or MIG device (nvml.process_attribution), by the container their cgroup names; empty pod labels for processes no pod owns.", MetricType::GAUGE),
        ("mlnode_gpu_pod_sm_utilization_ratio", "Fraction of the GPU's SMs one container's processes used since the previous sample (nvmlDeviceGetProcessUtilization, nvml.process_attribution); absent on MIG devices, where NVML gives none.", MetricType::GAUGE),
        ("mlnode_gpu_process_attribution_errors_total", "Per-process readings that failed, by reason: NVML refused the process list or their utilisation (processes_no_permission without hostPID, utilization_not_supported), a process exited before its cgroup was read, a cgroup of no known form. Their series are absent.", MetricType::COUNTER),
    ],
    dcgm: &[],
};

/// One container's use of a GPU or MIG device: the device's own labels (`series`', never its
/// first holder's), the container's (`pod_labels`: the names the label style gives pod,
/// namespace and container), its pod's UID and, on a shared device, its replica.
pub(super) fn collect_use(
    rows: &[ContainerUse],
    pod_labels: [&'static str; 3],
    series: &mut Series,
) {
    for row in rows {
        let mut labels = series.labels.to_vec();
        labels.push((pod_labels[0], row.pod.clone()));
        labels.push((pod_labels[1], row.namespace.clone()));
        labels.push((pod_labels[2], row.container.clone()));
        labels.push(("pod_uid", row.pod_uid.clone()));
        if let Some(vgpu) = &row.vgpu {
            labels.push(("vgpu", vgpu.clone()));
        }
        if let Some(bytes) = row.memory_bytes {
            series
                .out
                .gauge("mlnode_gpu_pod_memory_used_bytes", &labels, bytes as f64);
        }
        if let Some(ratio) = row.sm_ratio {
            series
                .out
                .gauge("mlnode_gpu_pod_sm_utilization_ratio", &labels, ratio);
        }
    }
}

pub(super) fn collect_errors(state: &GpuState, out: &mut Families) {
    for (reason, count) in &state.attribution_errors {
        out.counter(
            "mlnode_gpu_process_attribution_errors_total",
            &[("reason", reason.to_string())],
            *count as f64,
        );
    }
}
