//! Optional input: AWS's neuron-monitor report stream (one JSON object per line on its stdout,
//! format in aws-neuron-sdk `tools/neuron-sys-tools/neuron-monitor-user-guide.rst`), read from a FIFO
//! a sidecar writes (`neuron-monitor > /run/neuron-monitor/report`), for the runtime data sysfs
//! cannot give: live execution counts per outcome and error class, latency percentiles, and each
//! runtime's vCPU and memory use. Exported under neuron-monitor-prometheus's names.
//!
//! [`Runtimes`] folds reports into plain state on an injected clock; [`read`] is the thin task that
//! reads lines and hands them over.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prometheus::proto::MetricType;
use serde::Deserialize;

use mlnode_core::metrics::family::{with_label, Families, FamilySpec, Labels};
use mlnode_core::shared::Shared;

/// The families only the report feeds (`process_execution_stats`, `process_neuron_runtime_vcpu_usage`
/// of neuron-monitor-prometheus.py); `neuron_runtime_memory_used_bytes` is in
/// [`super::monitor_names::FAMILIES`] and gets its `runtime_tag` from here.
pub const FAMILIES: [FamilySpec; 4] = [
    (
        "execution_status_total",
        "Execution status total",
        MetricType::COUNTER,
    ),
    (
        "execution_errors_total",
        "Execution errors total",
        MetricType::COUNTER,
    ),
    (
        "execution_latency_seconds",
        "Execution latency in seconds",
        MetricType::GAUGE,
    ),
    (
        "neuron_runtime_vcpu_usage_ratio",
        "Runtime vCPU utilization ratio",
        MetricType::GAUGE,
    ),
];

/// A report older than this is a stopped neuron-monitor (its default period is 5 s): its runtimes'
/// gauges are no longer exported as if current.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// A line longer than this is not a report (a trn2.48xlarge report with every group is ~100 KiB).
pub const MAX_LINE: usize = 16 << 20;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Report {
    neuron_runtime_data: Option<Vec<RuntimeEntry>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RuntimeEntry {
    /// A string in the guide's example; accepted as a number too.
    neuron_runtime_tag: serde_json::Value,
    pid: u64,
    error: String,
    report: RuntimeReport,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RuntimeReport {
    execution_stats: Option<ExecutionStats>,
    memory_used: Option<MemoryUsed>,
    neuron_runtime_vcpu_usage: Option<VcpuUsage>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ExecutionStats {
    error: String,
    /// Counts for the captured period, per class.
    error_summary: BTreeMap<String, u64>,
    /// Counts for the captured period, per outcome.
    execution_summary: BTreeMap<String, u64>,
    latency_stats: LatencyStats,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LatencyStats {
    /// `null` when nothing ran in the period.
    total_latency: Option<BTreeMap<String, f64>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct MemoryUsed {
    error: String,
    neuron_runtime_used_bytes: UsedBytes,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UsedBytes {
    host: u64,
    neuron_device: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct VcpuUsage {
    error: String,
    /// Percent.
    vcpu_usage: UserSystem,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UserSystem {
    user: f64,
    system: f64,
}

/// One runtime's state: counters summed over reports, gauges as last reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Runtime {
    pub executions: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    pub latency: BTreeMap<String, f64>,
    /// (user, system) as fractions.
    pub vcpu: Option<(f64, f64)>,
    /// (host, neuron_device) bytes.
    pub memory: Option<(u64, u64)>,
}

/// The runtimes of the latest report, by `neuron_runtime_tag`.
#[derive(Default)]
pub struct Runtimes {
    by_tag: BTreeMap<String, Runtime>,
    last_report: Option<Instant>,
    rejected: u64,
}

pub type SharedRuntimes = Shared<Runtimes>;

impl Runtimes {
    /// Folds one line of neuron-monitor's output. A line that is not a report is counted and
    /// changes nothing; a runtime or metric group with an `error` is skipped, as the exporter does;
    /// a runtime absent from the report has ended and is dropped.
    pub fn apply(&mut self, line: &str, now: Instant) -> Result<(), String> {
        let report: Report = match serde_json::from_str(line) {
            Ok(report) => report,
            Err(e) => {
                self.rejected += 1;
                return Err(format!("not a neuron-monitor report: {e}"));
            }
        };
        let mut seen = BTreeMap::new();
        for entry in report.neuron_runtime_data.unwrap_or_default() {
            if !entry.error.is_empty() {
                continue;
            }
            let tag = match &entry.neuron_runtime_tag {
                serde_json::Value::String(tag) if !tag.is_empty() => tag.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                _ => entry.pid.to_string(),
            };
            let mut runtime = self.by_tag.remove(&tag).unwrap_or_default();
            let report = entry.report;
            if let Some(stats) = report.execution_stats.filter(|s| s.error.is_empty()) {
                for (outcome, n) in stats.execution_summary {
                    *runtime.executions.entry(outcome).or_default() += n;
                }
                for (class, n) in stats.error_summary {
                    *runtime.errors.entry(class).or_default() += n;
                }
                if let Some(latency) = stats.latency_stats.total_latency {
                    runtime.latency = latency;
                }
            }
            if let Some(memory) = report.memory_used.filter(|m| m.error.is_empty()) {
                let used = memory.neuron_runtime_used_bytes;
                runtime.memory = Some((used.host, used.neuron_device));
            }
            if let Some(vcpu) = report
                .neuron_runtime_vcpu_usage
                .filter(|v| v.error.is_empty())
            {
                let percent = |p: f64| (p / 100.0).clamp(0.0, 1.0);
                runtime.vcpu = Some((
                    percent(vcpu.vcpu_usage.user),
                    percent(vcpu.vcpu_usage.system),
                ));
            }
            seen.insert(tag, runtime);
        }
        self.by_tag = seen;
        self.last_report = Some(now);
        Ok(())
    }

    /// The runtimes to export at `now`: none once the last report is [`STALE_AFTER`] old.
    pub fn current(&self, now: Instant) -> Option<&BTreeMap<String, Runtime>> {
        let last = self.last_report?;
        (now.saturating_duration_since(last) <= STALE_AFTER).then_some(&self.by_tag)
    }

    /// Lines that were not reports, since the start.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }
}

/// The series of each runtime, labelled as neuron-monitor-prometheus labels them.
pub fn render(runtimes: &BTreeMap<String, Runtime>, instance: &Labels, out: &mut Families) {
    for (tag, runtime) in runtimes {
        let labels = with_label(instance, "runtime_tag", tag);
        for (outcome, n) in &runtime.executions {
            out.counter(
                "execution_status_total",
                &with_label(&labels, "status_type", outcome),
                *n as f64,
            );
        }
        for (class, n) in &runtime.errors {
            out.counter(
                "execution_errors_total",
                &with_label(&labels, "error_type", class),
                *n as f64,
            );
        }
        for (percentile, seconds) in &runtime.latency {
            out.gauge(
                "execution_latency_seconds",
                &with_label(&labels, "percentile", percentile),
                *seconds,
            );
        }
        if let Some(usage) = runtime.vcpu {
            super::monitor_names::usage_gauges(
                out,
                "neuron_runtime_vcpu_usage_ratio",
                &labels,
                usage,
            );
        }
        if let Some((host, device)) = runtime.memory {
            for (location, bytes) in [("host", host), ("neuron_device", device)] {
                out.gauge(
                    "neuron_runtime_memory_used_bytes",
                    &with_label(&labels, "memory_location", location),
                    bytes as f64,
                );
            }
        }
    }
}

/// Makes `path` a FIFO if nothing is there yet (mode 0660: the sidecar runs as the agent's user or
/// group); an existing path must be one.
pub fn prepare(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_fifo() => Ok(()),
        Ok(_) => Err(format!(
            "neuron.monitor_input: {} is not a FIFO; remove it, or point the setting at a FIFO (mkfifo) that neuron-monitor writes to",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o660)).map_err(
                |e| format!("neuron.monitor_input: cannot create the FIFO {}: {e}", path.display()),
            )
        }
        Err(e) => Err(format!("neuron.monitor_input: {}: {e}", path.display())),
    }
}

/// Reads reports from the FIFO at `path` until `shutdown`. Opened read-write, so the FIFO stays
/// open while the writer restarts (a reader alone would see end-of-file whenever it has none).
pub async fn read(
    path: PathBuf,
    runtimes: SharedRuntimes,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use futures_util::StreamExt;
    let receiver = match tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
    {
        Ok(receiver) => receiver,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot open the neuron-monitor FIFO: no runtime series");
            return;
        }
    };
    let codec = tokio_util::codec::LinesCodec::new_with_max_length(MAX_LINE);
    let mut lines = tokio_util::codec::FramedRead::new(receiver, codec);
    let mut warned = false;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = lines.next() => next,
        };
        let result = match next {
            None => return,
            Some(Ok(line)) => runtimes.update(|runtimes| runtimes.apply(&line, Instant::now())),
            // Too long: the codec skips to the next newline and goes on.
            Some(Err(e)) => Err(format!("unreadable line: {e}")),
        };
        if let Err(reason) = result {
            if !warned {
                tracing::warn!(path = %path.display(), %reason, "skipping what neuron-monitor wrote (said once; mlnode_neuron_monitor_input_rejected_lines_total counts them)");
                warned = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user guide's report (tests/fixtures/neuron-monitor/report.json, see SOURCES) for
    /// runtime `tag`, with `completed` executions in the period and one hardware error.
    fn report(tag: &str, completed: u64) -> String {
        let mut report: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/neuron-monitor/report.json"
        ))
        .unwrap();
        let runtime = &mut report["neuron_runtime_data"][0];
        runtime["neuron_runtime_tag"] = tag.into();
        let stats = &mut runtime["report"]["execution_stats"];
        stats["execution_summary"]["completed"] = completed.into();
        stats["error_summary"]["hardware"] = 1.into();
        report.to_string()
    }

    #[test]
    fn reports_fold_into_counters_and_current_gauges() {
        let start = Instant::now();
        let mut runtimes = Runtimes::default();
        assert_eq!(runtimes.current(start), None, "nothing read yet");
        runtimes.apply(&report("my_app_1", 123), start).unwrap();
        runtimes
            .apply(&report("my_app_1", 7), start + Duration::from_secs(5))
            .unwrap();
        let now = start + Duration::from_secs(6);
        let app = &runtimes.current(now).unwrap()["my_app_1"];
        assert_eq!(app.executions["completed"], 130, "per-period counts add up");
        assert_eq!(app.errors["hardware"], 2);
        assert_eq!(app.latency["p99"], 0.01100012);
        assert_eq!(app.vcpu, Some((0.4201, 0.1234)));
        assert_eq!(app.memory, Some((6997643264, 12519788544)));
    }

    #[test]
    fn ended_runtimes_errors_garbage_and_a_silent_monitor() {
        let start = Instant::now();
        let mut runtimes = Runtimes::default();
        runtimes.apply(&report("a", 1), start).unwrap();
        // The next report has only runtime "b", whose execution_stats failed.
        let mut next: serde_json::Value = serde_json::from_str(&report("b", 5)).unwrap();
        next["neuron_runtime_data"][0]["report"]["execution_stats"]["error"] = "timeout".into();
        runtimes.apply(&next.to_string(), start).unwrap();
        let current = runtimes.current(start).unwrap();
        assert!(!current.contains_key("a"), "a ended");
        assert!(
            current["b"].executions.is_empty(),
            "a group with an error is skipped"
        );
        assert!(current["b"].memory.is_some());
        // A runtime with an error is left out whole.
        let mut failed: serde_json::Value = serde_json::from_str(&report("c", 1)).unwrap();
        failed["neuron_runtime_data"][0]["error"] = "cannot connect".into();
        runtimes.apply(&failed.to_string(), start).unwrap();
        assert!(runtimes.current(start).unwrap().is_empty());
        assert!(runtimes
            .apply("{\"neuron_runtime_data\": 7", start)
            .is_err());
        assert_eq!(runtimes.rejected(), 1);
        assert!(
            runtimes.current(start + STALE_AFTER).is_some(),
            "still current at the limit"
        );
        assert_eq!(
            runtimes.current(start + STALE_AFTER + Duration::from_secs(1)),
            None,
            "a monitor that stopped writing"
        );
    }
}
