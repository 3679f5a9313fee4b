//! Power and thermals: draw, the enforced limit, energy, the GPU's and the HBM's temperatures and
//! the margins below the driver's thermal limits.

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::{GpuReading, THERMAL_LIMITS};

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_temperature_celsius", "GPU temperature.", MetricType::GAUGE),
        ("mlnode_gpu_memory_temperature_celsius", "HBM temperature.", MetricType::GAUGE),
        ("mlnode_gpu_thermal_margin_celsius", "How far below a thermal limit the GPU is (nvml.h's T.Limit field values; negative: past it): shutdown, slowdown (software slowdown), memory_max and gpu_max (throttled below base clock for the memory's or the GPU's temperature); absent where the driver gives none.", MetricType::GAUGE),
        ("mlnode_gpu_power_watts", "Power draw.", MetricType::GAUGE),
        ("mlnode_gpu_power_limit_watts", "The power limit the driver enforces (nvmlDeviceGetEnforcedPowerLimit: the lowest of the limits set and the board's), the ceiling power draw is held under.", MetricType::GAUGE),
        ("mlnode_gpu_energy_joules_total", "Energy consumed since the driver was loaded.", MetricType::COUNTER),
    ],
    dcgm: &[
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", MetricType::GAUGE),
        ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", MetricType::GAUGE),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", MetricType::GAUGE),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", MetricType::COUNTER),
    ],
};

pub(super) fn collect(reading: &GpuReading, series: &mut Series) {
    for (ours, dcgm, celsius) in [
        (
            "mlnode_gpu_temperature_celsius",
            "DCGM_FI_DEV_GPU_TEMP",
            reading.temperature_c,
        ),
        (
            "mlnode_gpu_memory_temperature_celsius",
            "DCGM_FI_DEV_MEMORY_TEMP",
            reading.memory_temp_c,
        ),
    ] {
        if let Some(celsius) = celsius {
            series.gauge(ours, f64::from(celsius));
            series.dcgm_gauge(dcgm, f64::from(celsius));
        }
    }
    for ((_, limit), margin) in THERMAL_LIMITS.iter().zip(reading.thermal_margins) {
        if let Some(margin) = margin {
            series.gauge_by(
                "mlnode_gpu_thermal_margin_celsius",
                ("limit", limit),
                margin as f64,
            );
        }
    }
    if let Some(milliwatts) = reading.power_mw {
        let watts = f64::from(milliwatts) / 1000.0;
        series.gauge("mlnode_gpu_power_watts", watts);
        series.dcgm_gauge("DCGM_FI_DEV_POWER_USAGE", watts);
    }
    if let Some(limit) = reading.power_limit_mw {
        series.gauge("mlnode_gpu_power_limit_watts", f64::from(limit) / 1000.0);
    }
    if let Some(millijoules) = reading.energy_mj {
        series.counter(
            "mlnode_gpu_energy_joules_total",
            millijoules as f64 / 1000.0,
        );
        series.dcgm_counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", millijoules as f64);
    }
}
