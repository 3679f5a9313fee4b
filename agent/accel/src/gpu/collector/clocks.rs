//! Clocks and clock event (throttle) reasons: the SM and memory clocks, which reasons hold now
//! (nvmlDeviceGetCurrentClocksEventReasons' mask) and for how long each was seen holding.

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::state::GpuEntry;
use crate::gpu::{GpuReading, CLOCK_EVENT_REASONS};

pub(super) const SERIES: Group = Group {
    ours: &[
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
            "mlnode_gpu_clock_event_reason_active",
            "1 while the clock event (throttle) reason holds, else 0.",
            MetricType::GAUGE,
        ),
        (
            "mlnode_gpu_clock_event_reason_seconds_total",
            "Time the clock event reason was seen holding, sampled.",
            MetricType::COUNTER,
        ),
    ],
    dcgm: &[
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
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
            MetricType::GAUGE,
        ),
    ],
};

pub(super) fn collect(reading: &GpuReading, series: &mut Series) {
    if let Some(mask) = reading.clock_event_reasons {
        for (bit, reason) in CLOCK_EVENT_REASONS {
            series.gauge_by(
                "mlnode_gpu_clock_event_reason_active",
                ("reason", reason),
                f64::from(u8::from(mask & bit != 0)),
            );
        }
        series.dcgm_gauge("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", mask as f64);
    }
    for (ours, dcgm, mhz) in [
        (
            "mlnode_gpu_sm_clock_hertz",
            "DCGM_FI_DEV_SM_CLOCK",
            reading.sm_clock_mhz,
        ),
        (
            "mlnode_gpu_memory_clock_hertz",
            "DCGM_FI_DEV_MEM_CLOCK",
            reading.mem_clock_mhz,
        ),
    ] {
        if let Some(mhz) = mhz {
            series.gauge(ours, f64::from(mhz) * 1e6);
            series.dcgm_gauge(dcgm, f64::from(mhz));
        }
    }
}

/// Written with the GPU's other counters, also while its readings are not (a stalled sampler, a
/// lost GPU): a count of what was seen, not a reading; for a GPU whose driver reports reasons.
pub(super) fn collect_reason_seconds(entry: &GpuEntry, series: &mut Series) {
    if entry
        .reading
        .as_ref()
        .is_some_and(|r| r.clock_event_reasons.is_some())
    {
        for (seconds, (_, reason)) in entry.reason_seconds.iter().zip(CLOCK_EVENT_REASONS) {
            series.counter_by(
                "mlnode_gpu_clock_event_reason_seconds_total",
                ("reason", reason),
                *seconds,
            );
        }
    }
}
