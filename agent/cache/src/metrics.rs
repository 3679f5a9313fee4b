//! The model-cache series: `mlnode_model_cache_*`. Updated by [`super::monitor`] after each
//! verification; documented in docs/metrics.md.

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::priority::Priority;
use super::report::{FileStatus, Report};
use super::state::VerifiedBy;

/// Verification takes from milliseconds (a config file) to an hour (a cold 400 GB cache).
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyKind {
    Full,
    Incremental,
}

impl VerifyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VerifyKind::Full => "full",
            VerifyKind::Incremental => "incremental",
        }
    }
}

/// The `result` label of `mlnode_model_cache_restart_records_total`.
pub const RESTART_RECORD_RESULTS: [&str; 5] =
    ["trusted", "partial", "unusable", "malformed", "none"];

pub struct CacheMetrics {
    verified: IntGaugeVec,
    files: IntGaugeVec,
    bytes: IntGaugeVec,
    hashed_bytes: IntCounterVec,
    duration: HistogramVec,
    last_verified: GaugeVec,
    watch_overflows: IntCounterVec,
    watched: IntGaugeVec,
    weight_opens: IntCounterVec,
    priority: IntGaugeVec,
    throttled: CounterVec,
    max_read_rate: IntGauge,
    verified_by: IntGaugeVec,
    last_full_hash: GaugeVec,
    restart_records: IntCounterVec,
    /// The revision label each model's `verified` series carries now, to drop it when it changes.
    revisions: Mutex<HashMap<String, String>>,
}

impl CacheMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<CacheMetrics> {
        let metrics = CacheMetrics {
            verified: IntGaugeVec::new(
                Opts::new("mlnode_model_cache_verified", "1 when every file of the model's manifest is ok, else 0."),
                &["model_name", "revision"],
            )?,
            files: IntGaugeVec::new(
                Opts::new("mlnode_model_cache_files", "Files of the model cache per verification status."),
                &["model_name", "status"],
            )?,
            bytes: IntGaugeVec::new(
                Opts::new("mlnode_model_cache_bytes", "Expected size of the model's files, in bytes."),
                &["model_name"],
            )?,
            hashed_bytes: IntCounterVec::new(
                Opts::new("mlnode_model_cache_hashed_bytes_total", "Bytes read and hashed while verifying the model."),
                &["model_name"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new("mlnode_model_cache_verify_duration_seconds", "Time one verification of the model took.")
                    .buckets(DURATION_BUCKETS.to_vec()),
                &["model_name", "kind"],
            )?,
            last_verified: GaugeVec::new(
                Opts::new(
                    "mlnode_model_cache_last_verified_timestamp_seconds",
                    "Unix time at which a verification last found the model cache verified.",
                ),
                &["model_name"],
            )?,
            watch_overflows: IntCounterVec::new(
                Opts::new(
                    "mlnode_model_cache_watch_overflows_total",
                    "File-watch queue overflows and watch-limit errors, each forcing a full rescan.",
                ),
                &["model_name"],
            )?,
            watched: IntGaugeVec::new(
                Opts::new(
                    "mlnode_model_cache_watched",
                    "1 while the model's files are watched for changes (continuous verification), 0 while they cannot be (the kernel's inotify limits, ROOT missing) and only rescans find changes.",
                ),
                &["model_name"],
            )?,
            weight_opens: IntCounterVec::new(
                Opts::new(
                    "mlnode_model_cache_weight_opens_total",
                    "Opens of the model's weight files by other processes (a server loading the model), as the file watch reports them; the agent's own reads are not counted.",
                ),
                &["model_name"],
            )?,
            priority: IntGaugeVec::new(
                Opts::new(
                    "mlnode_model_cache_verify_priority",
                    "1 for the CPU and I/O priority the model's latest verification runs at (normal: the node is held for this agent, or no pod holds an accelerator; idle: the kernel's idle classes, whenever nothing says no pod serves), 0 for the other.",
                ),
                &["model_name", "priority"],
            )?,
            throttled: CounterVec::new(
                Opts::new(
                    "mlnode_model_cache_verify_throttled_seconds_total",
                    "Time the model's hashing threads waited for verify.max_bytes_per_second, summed over threads.",
                ),
                &["model_name"],
            )?,
            max_read_rate: IntGauge::with_opts(Opts::new(
                "mlnode_model_cache_verify_max_bytes_per_second",
                "verify.max_bytes_per_second: the most bytes per second all verifications together read. Absent when there is no limit.",
            ))?,
            verified_by: IntGaugeVec::new(
                Opts::new(
                    "mlnode_model_cache_verified_by",
                    "1 for how the model's current verdict of verified came about, 0 for the other: hash (this agent hashed every file) or unchanged_since (a previous agent of this boot hashed them, and every file is as it was then, or was hashed again; verify.trust_unchanged_after_restart).",
                ),
                &["model_name", "verified_by"],
            )?,
            last_full_hash: GaugeVec::new(
                Opts::new(
                    "mlnode_model_cache_last_full_hash_timestamp_seconds",
                    "Unix time at which every file of the model was last hashed and found ok, by this agent or, across a restart, by a previous agent of this boot.",
                ),
                &["model_name"],
            )?,
            restart_records: IntCounterVec::new(
                Opts::new(
                    "mlnode_model_cache_restart_records_total",
                    "What a start found of the record a previous agent of this boot left for the model: trusted (every file as recorded: nothing hashed), partial (the changed groups of files hashed again), unusable (another manifest or other settings: hashed), malformed (not of the form this agent writes: ignored, hashed), none (no record: another boot, the first start, or no API server).",
                ),
                &["model_name", "result"],
            )?,
            revisions: Mutex::new(HashMap::new()),
        };
        registry.register(Box::new(metrics.verified.clone()))?;
        registry.register(Box::new(metrics.files.clone()))?;
        registry.register(Box::new(metrics.bytes.clone()))?;
        registry.register(Box::new(metrics.hashed_bytes.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.last_verified.clone()))?;
        registry.register(Box::new(metrics.watch_overflows.clone()))?;
        registry.register(Box::new(metrics.watched.clone()))?;
        registry.register(Box::new(metrics.weight_opens.clone()))?;
        registry.register(Box::new(metrics.priority.clone()))?;
        registry.register(Box::new(metrics.throttled.clone()))?;
        registry.register(Box::new(metrics.verified_by.clone()))?;
        registry.register(Box::new(metrics.last_full_hash.clone()))?;
        registry.register(Box::new(metrics.restart_records.clone()))?;
        Ok(metrics)
    }

    fn set_verified(&self, model: &str, revision: &str, verified: bool) {
        let mut revisions = self.revisions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = revisions.insert(model.to_string(), revision.to_string()) {
            if old != revision {
                let _ = self.verified.remove_label_values(&[model, &old]);
            }
        }
        self.verified
            .with_label_values(&[model, revision])
            .set(i64::from(verified));
    }

    fn set_counts(&self, model: &str, counts: impl Fn(FileStatus) -> usize) {
        for status in FileStatus::ALL {
            self.files
                .with_label_values(&[model, status.as_str()])
                .set(counts(status) as i64);
        }
    }

    /// Before the first verification finishes: not verified, every file `in_progress`.
    pub fn starting(&self, model: &str, revision: Option<&str>, manifest_files: usize) {
        self.set_verified(model, revision.unwrap_or(""), false);
        self.set_counts(model, |status| {
            if status == FileStatus::InProgress {
                manifest_files
            } else {
                0
            }
        });
        self.hashed_bytes.with_label_values(&[model]).inc_by(0);
        self.watch_overflows.with_label_values(&[model]).inc_by(0);
        self.weight_opens.with_label_values(&[model]).inc_by(0);
        for result in RESTART_RECORD_RESULTS {
            self.restart_records
                .with_label_values(&[model, result])
                .inc_by(0);
        }
    }

    /// What a start found of the model's restart record (one of [`RESTART_RECORD_RESULTS`]).
    pub fn restart_record(&self, model: &str, result: &str) {
        self.restart_records
            .with_label_values(&[model, result])
            .inc();
    }

    /// How the model's verdict of verified came about, and when every file was last hashed.
    pub fn verified_by(&self, model: &str, by: VerifiedBy, last_full_hash: Option<u64>) {
        for kind in [VerifiedBy::Hash, VerifiedBy::UnchangedSince(0)] {
            self.verified_by
                .with_label_values(&[model, kind.as_str()])
                .set(i64::from(kind.as_str() == by.as_str()));
        }
        if let Some(at) = last_full_hash {
            self.last_full_hash
                .with_label_values(&[model])
                .set(at as f64);
        }
    }

    /// The model cannot be verified at all (its manifest is unreadable, its root gone): no file is
    /// known to be in any state any more, so every count drops to 0 rather than keep the last ones.
    pub fn unverifiable(&self, model: &str) {
        let revision = self
            .revisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
            .cloned();
        self.set_verified(model, revision.as_deref().unwrap_or(""), false);
        self.set_counts(model, |_| 0);
    }

    /// After a verification: `report` is the model's whole current state, `hashed` what this
    /// run read.
    pub fn observe(
        &self,
        model: &str,
        report: &Report,
        kind: VerifyKind,
        hashed: u64,
        seconds: f64,
    ) {
        self.set_verified(
            model,
            report.revision.as_deref().unwrap_or(""),
            report.is_verified(),
        );
        let counts = report.counts();
        self.set_counts(model, |status| {
            counts
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, n)| *n)
        });
        self.bytes
            .with_label_values(&[model])
            .set(report.expected_bytes as i64);
        self.hashed_bytes.with_label_values(&[model]).inc_by(hashed);
        self.duration
            .with_label_values(&[model, kind.as_str()])
            .observe(seconds);
        if report.is_verified() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.last_verified.with_label_values(&[model]).set(now);
        }
    }

    pub fn priority(&self, model: &str, now: Priority) {
        for priority in Priority::ALL {
            self.priority
                .with_label_values(&[model, priority.as_str()])
                .set(i64::from(priority == now));
        }
    }

    /// Exports the read rate limit; only called when one is set, so that no limit shows as no
    /// series rather than as a limit of 0.
    pub fn max_bytes_per_second(&self, registry: &Registry, rate: u64) -> prometheus::Result<()> {
        self.max_read_rate
            .set(i64::try_from(rate).unwrap_or(i64::MAX));
        registry.register(Box::new(self.max_read_rate.clone()))
    }

    pub fn throttled(&self, model: &str, waited: std::time::Duration) {
        if !waited.is_zero() {
            self.throttled
                .with_label_values(&[model])
                .inc_by(waited.as_secs_f64());
        }
    }

    pub fn weight_opened(&self, model: &str) {
        self.weight_opens.with_label_values(&[model]).inc();
    }

    pub fn watch_overflow(&self, model: &str) {
        self.watch_overflows.with_label_values(&[model]).inc();
    }

    pub fn watched(&self, model: &str, watched: bool) {
        self.watched
            .with_label_values(&[model])
            .set(i64::from(watched));
    }
}
