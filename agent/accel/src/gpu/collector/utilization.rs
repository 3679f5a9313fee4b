//! How busy the GPU is: NVML's utilisation rates over the last sample period (GPU, memory copy,
//! encoder, decoder) and the GPM ratios of Hopper and later, a GPU's or a MIG GPU instance's.

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::{GpmReading, GpuReading};

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_utilization_ratio", "Fraction of the last sample period in which a kernel ran on the GPU.", MetricType::GAUGE),
        ("mlnode_gpu_memory_copy_utilization_ratio", "Fraction of the last sample period the memory controller was busy.", MetricType::GAUGE),
        ("mlnode_gpu_encoder_utilization_ratio", "Fraction of the last sample period the video encoder was busy.", MetricType::GAUGE),
        ("mlnode_gpu_decoder_utilization_ratio", "Fraction of the last sample period the video decoder was busy.", MetricType::GAUGE),
        ("mlnode_gpu_graphics_engine_active_ratio", "Fraction of time any compute or graphics engine was active (GPM, Hopper and later).", MetricType::GAUGE),
        ("mlnode_gpu_sm_active_ratio", "Fraction of time the SMs had at least one warp assigned, averaged over SMs (GPM).", MetricType::GAUGE),
        ("mlnode_gpu_tensor_pipe_active_ratio", "Fraction of time the SMs ran any tensor operation (GPM).", MetricType::GAUGE),
        ("mlnode_gpu_dram_active_ratio", "Fraction of the theoretical DRAM bandwidth used (GPM).", MetricType::GAUGE),
        ("mlnode_gpu_mig_graphics_engine_active_ratio", "Fraction of time any compute or graphics engine of the MIG GPU instance was active (GPM).", MetricType::GAUGE),
        ("mlnode_gpu_mig_sm_active_ratio", "Fraction of time the MIG GPU instance's SMs had at least one warp assigned (GPM).", MetricType::GAUGE),
        ("mlnode_gpu_mig_tensor_pipe_active_ratio", "Fraction of time the MIG GPU instance's SMs ran any tensor operation (GPM).", MetricType::GAUGE),
        ("mlnode_gpu_mig_dram_active_ratio", "Fraction of the theoretical DRAM bandwidth used by the MIG GPU instance (GPM).", MetricType::GAUGE),
    ],
    dcgm: &[
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", MetricType::GAUGE),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", MetricType::GAUGE),
        ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", MetricType::GAUGE),
        ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", MetricType::GAUGE),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", MetricType::GAUGE),
        ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", MetricType::GAUGE),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", MetricType::GAUGE),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", MetricType::GAUGE),
    ],
};

/// Whose GPM ratios: a GPU's, or one of its MIG GPU instances'.
#[derive(Clone, Copy)]
pub(super) enum GpmScope {
    Gpu,
    MigInstance,
}

/// NVML's percentages, as ratios under the agent's names and as percentages under DCGM's.
pub(super) fn collect(reading: &GpuReading, series: &mut Series) {
    for (ours, dcgm, percent) in [
        (
            "mlnode_gpu_utilization_ratio",
            "DCGM_FI_DEV_GPU_UTIL",
            reading.utilization_gpu_pct,
        ),
        (
            "mlnode_gpu_memory_copy_utilization_ratio",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            reading.memory_copy_util_pct,
        ),
        (
            "mlnode_gpu_encoder_utilization_ratio",
            "DCGM_FI_DEV_ENC_UTIL",
            reading.encoder_util_pct,
        ),
        (
            "mlnode_gpu_decoder_utilization_ratio",
            "DCGM_FI_DEV_DEC_UTIL",
            reading.decoder_util_pct,
        ),
    ] {
        if let Some(percent) = percent {
            series.gauge(ours, f64::from(percent) / 100.0);
            series.dcgm_gauge(dcgm, f64::from(percent));
        }
    }
    if let Some(gpm) = &reading.gpm {
        collect_gpm(gpm, GpmScope::Gpu, series);
    }
}

/// GPM ratios under their own names (per GPU, or `mlnode_gpu_mig_*` per GPU instance, so that
/// a sum over a GPU's series never adds the instances to the whole) and, with `dcgm_names`,
/// under DCGM's profiling names, which dcgm-exporter uses for both, told apart by `GPU_I_ID`.
pub(super) fn collect_gpm(gpm: &GpmReading, scope: GpmScope, series: &mut Series) {
    for (gpu, instance, dcgm, value) in [
        (
            "mlnode_gpu_graphics_engine_active_ratio",
            "mlnode_gpu_mig_graphics_engine_active_ratio",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            gpm.graphics_active,
        ),
        (
            "mlnode_gpu_sm_active_ratio",
            "mlnode_gpu_mig_sm_active_ratio",
            "DCGM_FI_PROF_SM_ACTIVE",
            gpm.sm_active,
        ),
        (
            "mlnode_gpu_tensor_pipe_active_ratio",
            "mlnode_gpu_mig_tensor_pipe_active_ratio",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            gpm.tensor_active,
        ),
        (
            "mlnode_gpu_dram_active_ratio",
            "mlnode_gpu_mig_dram_active_ratio",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            gpm.dram_active,
        ),
    ] {
        let Some(value) = value else { continue };
        let ours = match scope {
            GpmScope::Gpu => gpu,
            GpmScope::MigInstance => instance,
        };
        series.gauge(ours, value);
        series.dcgm_gauge(dcgm, value);
    }
}
