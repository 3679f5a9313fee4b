//! Framebuffer memory (nvmlDeviceGetMemoryInfo_v2), a GPU's and a MIG device's: bytes under the
//! agent's names, whole MiB under DCGM's.

use prometheus::proto::MetricType;

use super::{Group, Series, MIB};
use crate::gpu::MemoryReading;

pub(super) const SERIES: Group = Group {
    ours: &[
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
    ],
    dcgm: &[
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
    ],
};

pub(super) fn collect(memory: &MemoryReading, series: &mut Series) {
    series.gauge("mlnode_gpu_memory_free_bytes", memory.free as f64);
    series.gauge("mlnode_gpu_memory_used_bytes", memory.used as f64);
    series.gauge("mlnode_gpu_memory_total_bytes", memory.total as f64);
    if let Some(reserved) = memory.reserved {
        series.gauge("mlnode_gpu_memory_reserved_bytes", reserved as f64);
    }
    dcgm_framebuffer(memory.used, memory.free, memory.reserved, series);
}

/// DCGM's framebuffer fields, which dcgm-exporter writes for a GPU and a MIG device alike (told
/// apart by `GPU_I_ID`); DCGM reports whole MiB, truncated.
pub(super) fn dcgm_framebuffer(used: u64, free: u64, reserved: Option<u64>, series: &mut Series) {
    series.dcgm_gauge("DCGM_FI_DEV_FB_FREE", (free / MIB) as f64);
    series.dcgm_gauge("DCGM_FI_DEV_FB_USED", (used / MIB) as f64);
    if let Some(reserved) = reserved {
        series.dcgm_gauge("DCGM_FI_DEV_FB_RESERVED", (reserved / MIB) as f64);
    }
}
