//! What a GPU must recover from, and how: NVML's failures reading it, its XID errors (NVML's and,
//! with `kernel_log.enabled`, the kernel log's), the driver's recovery action and HBM row
//! remapping.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::health::RECOVERY_ACTIONS;
use crate::gpu::state::{GpuEntry, GpuFailure};
use crate::gpu::xid::{self, xid_message};
use crate::gpu::GpuReading;
use crate::kernel_log::facts::LogFacts;
use crate::kernel_log::parse::PciAddress;
use mlnode_core::metrics::family::{with_label, Families, Labels};

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_lost", "1 when NVML reports the GPU fell off the bus, else 0.", MetricType::GAUGE),
        ("mlnode_gpu_failure", "1 while NVML cannot read the GPU, with why (lost, reset_required, irq_issue, no_permission, unknown); absent while it can. Its readings are then absent, not stale.", MetricType::GAUGE),
        ("mlnode_gpu_xid_errors_total", "XID errors per XID, with NVIDIA's catalog's immediate action for it: those NVML reported since the agent started or, with the kernel log read, this boot's, each once whichever source saw it.", MetricType::COUNTER),
        ("mlnode_gpu_last_xid", "The most recent critical XID error since the agent started.", MetricType::GAUGE),
        ("mlnode_gpu_xid_info", "The most recent critical XID error and NVIDIA's description of it; always 1.", MetricType::GAUGE),
        ("mlnode_gpu_recovery_action", "The driver's GPU recovery action (NVML field 230, R565 drivers and later): 1 for the action it asks for now, 0 for the others; absent where the driver gives none.", MetricType::GAUGE),
        ("mlnode_gpu_remapped_rows_total", "HBM rows remapped to spares, per cause (correctable, uncorrectable ECC errors).", MetricType::COUNTER),
        ("mlnode_gpu_row_remap_pending", "1 while a row remapping waits for the next GPU reset, else 0.", MetricType::GAUGE),
        ("mlnode_gpu_row_remap_failed", "1 when a row remapping has failed (no spare row left), else 0.", MetricType::GAUGE),
    ],
    dcgm: &[
        ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", MetricType::GAUGE),
        // dcgm-exporter declares it a counter (etc/default-counters.csv) though a windowed count
        // falls; a gauge says what it is, and PromQL written for dcgm-exporter reads it the same.
        ("DCGM_EXP_XID_ERRORS_COUNT", "Count of XID Errors within user-specified time window (see xid-count-window-size param).", MetricType::GAUGE),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", MetricType::COUNTER),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", MetricType::COUNTER),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", MetricType::GAUGE),
    ],
};

/// The kernel log as the XID counts see it.
pub(super) enum XidLog<'a> {
    Off,
    /// Its history is still being read.
    Reading,
    Read(&'a LogFacts),
}

/// Whether NVML can read the GPU, and why not.
pub(super) fn collect_failure(entry: &GpuEntry, series: &mut Series) {
    let lost = entry.failure == Some(GpuFailure::Lost);
    series.gauge("mlnode_gpu_lost", f64::from(u8::from(lost)));
    if let Some(failure) = entry.failure {
        series.gauge_by("mlnode_gpu_failure", ("reason", failure.as_str()), 1.0);
    }
}

/// Counters live on even while a GPU is lost: an XID just before it fell off is the clue.
/// `known`: whether a source watches this GPU's XIDs, so that none heard means none happened.
pub(super) fn collect_xids(
    entry: &GpuEntry,
    address: Option<PciAddress>,
    log: &XidLog,
    known: bool,
    series: &mut Series,
) {
    let counts = match (log, address) {
        (XidLog::Off, _) | (XidLog::Read(_), None) => Some(Cow::Borrowed(&entry.xids)),
        (XidLog::Read(log), Some(address)) => Some(Cow::Owned(xid::boot_counts(
            &entry.xids,
            log.xids_of(&address),
        ))),
        (XidLog::Reading, _) => None,
    };
    for (xid, count) in counts.iter().flat_map(|c| c.iter()) {
        series.out.counter(
            "mlnode_gpu_xid_errors_total",
            &xid_labels(series.labels, *xid),
            *count as f64,
        );
    }
    if let Some(xid) = entry.last_xid {
        series.gauge("mlnode_gpu_last_xid", xid as f64);
        let mut info = with_label(series.labels, "xid", &xid.to_string());
        info.push(("message", xid_message(xid).to_string()));
        series.out.gauge("mlnode_gpu_xid_info", &info, 1.0);
    }
    if series.dcgm_names
        && entry.failure != Some(GpuFailure::Lost)
        && (known || entry.last_xid.is_some())
    {
        // dcgm-exporter labels the value with err_code and NVIDIA's text for it
        // (internal/pkg/collector/gpu_collector.go:324-331).
        let xid = entry.last_xid.unwrap_or(0);
        let mut with_err = with_label(series.labels, "err_code", &xid.to_string());
        with_err.push(("err_msg", xid_message(xid).to_string()));
        series
            .out
            .gauge("DCGM_FI_DEV_XID_ERRORS", &with_err, xid as f64);
    }
}

/// `DCGM_EXP_XID_ERRORS_COUNT` as dcgm-exporter writes it (internal/pkg/collector/expcollector.go):
/// one series per XID seen in the window, labelled `xid` and `window_size_in_ms`; a GPU without any
/// has one series of 0 without `xid`.
pub(super) fn collect_xid_window(
    entry: &GpuEntry,
    (now, window): (Instant, Duration),
    known: bool,
    series: &mut Series,
) {
    if !series.dcgm_names {
        return;
    }
    let labels = with_label(
        series.labels,
        "window_size_in_ms",
        &window.as_millis().to_string(),
    );
    let counts = entry.xids_within(now, window);
    if counts.is_empty() && known {
        series.out.gauge("DCGM_EXP_XID_ERRORS_COUNT", &labels, 0.0);
    }
    for (xid, count) in counts {
        series.out.gauge(
            "DCGM_EXP_XID_ERRORS_COUNT",
            &with_label(&labels, "xid", &xid.to_string()),
            count as f64,
        );
    }
}

/// The XIDs the kernel log has for a GPU NVML does not list (lost before the agent started, or
/// never found): counted under its address alone, which is all the log names.
pub(super) fn collect_unlisted_xids(log: &LogFacts, listed: &[PciAddress], out: &mut Families) {
    for ((address, xid), logged) in &log.xids {
        if listed.iter().any(|l| l.same_slot(address)) {
            continue;
        }
        out.counter(
            "mlnode_gpu_xid_errors_total",
            &xid_labels(&[("pci_bus_id", address.nvml_bus_id())], *xid),
            logged.count as f64,
        );
    }
}

fn xid_labels(labels: &[(&'static str, String)], xid: u64) -> Labels {
    let mut xid_labels = with_label(labels, "xid", &xid.to_string());
    xid_labels.push(("immediate_action", xid::immediate_action(xid).to_string()));
    xid_labels
}

/// The driver's recovery action and the HBM's row remapping, from a reading.
pub(super) fn collect(reading: &GpuReading, series: &mut Series) {
    if let Some(action) = reading.recovery_action {
        let known = RECOVERY_ACTIONS.iter().any(|(v, ..)| *v == action);
        for (value, label, ..) in RECOVERY_ACTIONS {
            series.gauge_by(
                "mlnode_gpu_recovery_action",
                ("action", label),
                f64::from(u8::from(value == action)),
            );
        }
        if !known {
            series.gauge_by("mlnode_gpu_recovery_action", ("action", "unknown"), 1.0);
        }
    }
    if let Some(rows) = reading.remapped_rows {
        for (cause, count, dcgm) in [
            (
                "correctable",
                rows.correctable,
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            ),
            (
                "uncorrectable",
                rows.uncorrectable,
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            ),
        ] {
            series.counter_by(
                "mlnode_gpu_remapped_rows_total",
                ("cause", cause),
                f64::from(count),
            );
            series.dcgm_counter(dcgm, f64::from(count));
        }
        let flag = |b: bool| f64::from(u8::from(b));
        series.gauge("mlnode_gpu_row_remap_pending", flag(rows.pending));
        series.gauge("mlnode_gpu_row_remap_failed", flag(rows.failed));
        series.dcgm_gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", flag(rows.failed));
    }
}
