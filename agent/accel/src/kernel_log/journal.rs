//! The reader: the node's systemd journal, read-only, through libsystemd's sd-journal API loaded
//! at run time ([`super::libsystemd`]; no journalctl, no `/dev/kmsg`). This boot's kernel entries
//! (`_TRANSPORT=kernel`, `_BOOT_ID` of this boot) from its start, then each new one as journald
//! appends it. One thread of its own, never awaited: `/metrics` and SIGTERM do not wait on a
//! journal read. A journal that is missing or unreadable is retried, said once, and never stops the
//! agent; without the library, the source is off and says why.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::facts::LogFacts;
use super::files::{self, FileChecks, Settle, Unreadable};
use super::libsystemd::{Change, Journal, Libsystemd};
use super::parse::{KernelEvent, Parser};
use super::settings::KernelLogSettings;
use mlnode_core::shared::Shared;

/// Entries applied to the facts at once during the lookback: one update (and one wake-up of the
/// verdicts) per batch, not per line of a long history.
const LOOKBACK_BATCH: usize = 1024;

/// At most this many threads read the history's archived files at start: the lookback is a burst
/// of a second or so; more would take cores from inference for little.
const HISTORY_THREADS: usize = 4;

/// `mlnode_kernel_log_*`, and the series of the faults only the kernel log shows.
#[derive(Clone)]
pub struct KernelLogMetrics {
    up: IntGauge,
    entries: IntCounter,
    bad: IntCounter,
    lag: Gauge,
    unreadable_files: IntGaugeVec,
    fallen_off_bus: IntGaugeVec,
    sxids: IntCounterVec,
    neuron_errors: IntCounterVec,
}

impl KernelLogMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<KernelLogMetrics> {
        let metrics = KernelLogMetrics {
            up: IntGauge::new("mlnode_kernel_log_up", "1 while the node's journal is being read (this boot's kernel entries), 0 while it cannot be: libsystemd missing, the journal missing, unreadable, or not mounted.")?,
            entries: IntCounter::new("mlnode_kernel_log_entries_read_total", "This boot's kernel entries read from the journal, the lookback included.")?,
            bad: IntCounter::new("mlnode_kernel_log_bad_entries_total", "Journal entries that could not be read (corrupt, truncated, a payload that does not decompress) and were skipped.")?,
            lag: Gauge::new("mlnode_kernel_log_lag_seconds", "How long after journald stored it the newest kernel entry was read (its __REALTIME_TIMESTAMP to now); during the lookback, the age of the history being read.")?,
            unreadable_files: IntGaugeVec::new(
                Opts::new("mlnode_kernel_log_unreadable_files", "Journal files the loaded libsystemd cannot open, left out of the reading, by reason: unsupported_format (an incompatible header flag it does not know: a newer systemd wrote the file), permission_denied, unreadable (damaged or cut short). Each is named once in the log."),
                &["reason"],
            )?,
            fallen_off_bus: IntGaugeVec::new(
                Opts::new("mlnode_gpu_fallen_off_bus", "1 for a GPU the NVIDIA driver logged as fallen off the bus on this boot (RESTART_BM); pci_bus_id as NVML writes it, to join with the GPU's series."),
                &["pci_bus_id"],
            )?,
            sxids: IntCounterVec::new(
                Opts::new("mlnode_nvswitch_sxid_errors_total", "NVSwitch SXid lines in this boot's kernel log, by SXid."),
                &["sxid"],
            )?,
            neuron_errors: IntCounterVec::new(
                Opts::new("mlnode_neuron_hardware_errors_total", "NEURON_HW_ERR lines in this boot's kernel log, by class (error_type) and the device they name."),
                &["error_type", "neuron_device_index"],
            )?,
        };
        registry.register(Box::new(metrics.up.clone()))?;
        registry.register(Box::new(metrics.entries.clone()))?;
        registry.register(Box::new(metrics.bad.clone()))?;
        registry.register(Box::new(metrics.lag.clone()))?;
        registry.register(Box::new(metrics.unreadable_files.clone()))?;
        registry.register(Box::new(metrics.fallen_off_bus.clone()))?;
        registry.register(Box::new(metrics.sxids.clone()))?;
        registry.register(Box::new(metrics.neuron_errors.clone()))?;
        Ok(metrics)
    }

    /// How many files are left out, by reason (each reason's series present, 0 when none is).
    pub fn unreadable<'a>(&self, files: impl Iterator<Item = &'a Unreadable> + Clone) {
        for reason in Unreadable::REASONS {
            let count = files.clone().filter(|u| u.reason() == reason).count();
            self.unreadable_files
                .with_label_values(&[reason])
                .set(count as i64);
        }
    }

    /// The series an event adds to.
    pub fn count(&self, event: &KernelEvent) {
        match event {
            KernelEvent::FallenOffBus { gpu } => self
                .fallen_off_bus
                .with_label_values(&[&gpu.nvml_bus_id()])
                .set(1),
            KernelEvent::Sxid { sxid, .. } => {
                self.sxids.with_label_values(&[&sxid.to_string()]).inc()
            }
            KernelEvent::NeuronHardwareError { class, device, .. } => {
                let device = device.map(|d| d.to_string()).unwrap_or_default();
                self.neuron_errors
                    .with_label_values(&[class, &device])
                    .inc()
            }
            KernelEvent::Xid { .. } => {}
        }
    }
}

/// Starts the reader thread; it runs until `stop` is set (and is never joined).
pub fn spawn(
    settings: KernelLogSettings,
    facts: Shared<LogFacts>,
    metrics: KernelLogMetrics,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("kernel-log".into())
        .spawn(move || {
            let mut reader = Reader {
                settings,
                facts,
                metrics,
                stop,
                parser: Parser::default(),
                files: FileChecks::default(),
                after: None,
            };
            reader.run()
        })
        .map(drop)
}

struct Reader {
    settings: KernelLogSettings,
    facts: Shared<LogFacts>,
    metrics: KernelLogMetrics,
    stop: Arc<AtomicBool>,
    parser: Parser,
    files: FileChecks,
    /// The cursor of the last kernel entry read: a journal opened again (the files changed, or
    /// after an error) resumes after it, never reading an entry twice nor skipping one.
    after: Option<CString>,
}

/// Why following one set of files ended without an error.
enum Followed {
    Stopped,
    /// journald created, rotated or deleted a file: the journal is opened again on the new set.
    FilesChanged,
}

impl Reader {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn run(&mut self) {
        let library = match Libsystemd::load(&self.settings.library) {
            Ok(library) => library,
            Err(why) => {
                // No history to wait for: the verdicts go on without it.
                self.metrics.up.set(0);
                self.facts.update(|facts| facts.history_read = true);
                tracing::warn!("{why}; faults only the kernel log shows are not seen");
                return;
            }
        };
        let mut said = String::new();
        while !self.stopped() {
            let trouble = match read_boot_id(&self.settings.boot_id_file) {
                Ok(boot) => match self.follow(&library, &boot) {
                    Ok(()) => return,
                    Err(trouble) => trouble,
                },
                Err(trouble) => trouble,
            };
            self.metrics.up.set(0);
            self.facts.update(|facts| facts.history_read = true);
            if trouble != said {
                tracing::warn!(error = %trouble, dirs = ?self.settings.journal_dirs, "cannot read the node's kernel log; faults only it shows are not seen (retrying)");
                said = trouble;
            }
            self.pause(self.settings.poll_interval.get() * 5);
        }
    }

    /// Waits up to `wait`, seeing a stop within a poll interval.
    fn pause(&self, wait: Duration) {
        let until = Instant::now() + wait;
        while !self.stopped() && Instant::now() < until {
            std::thread::sleep(
                self.settings
                    .poll_interval
                    .get()
                    .min(until - Instant::now()),
            );
        }
    }

    /// This boot's kernel entries after the last one read (at first, its whole history), then the
    /// new ones as journald appends them, until stopped. Err says why reading stopped.
    fn follow(&mut self, library: &Arc<Libsystemd>, boot: &str) -> Result<(), String> {
        let mut history = true;
        loop {
            let listed = files::list(&self.settings.journal_dirs)?;
            let readable = self.readable(library, &listed);
            if readable.is_empty() {
                // Nothing to follow: not up, and looked for again as a missing journal is.
                return Err(match listed.len() {
                    0 => format!(
                        "{:?} hold no journal file: journald keeps none there (Storage=none or volatile, with /run/log/journal not mounted) or another directory is mounted",
                        self.settings.journal_dirs
                    ),
                    n => format!(
                        "none of the {n} journal files can be opened (mlnode_kernel_log_unreadable_files says why)"
                    ),
                });
            }
            let started = Instant::now();
            // Nothing read yet: the archived files, which journald never writes again, are read
            // on threads of their own; the others here, where following goes on.
            let (archived, live) = match self.after {
                None => files::split_archived(&readable),
                Some(_) => (Vec::new(), readable.clone()),
            };
            let (facts, metrics, stop) = (&self.facts, &self.metrics, &self.stop);
            let before = read_in_parallel(
                library,
                &archived,
                boot,
                &|| stop.load(Ordering::Relaxed),
                &|events| take(facts, metrics, events),
            )?;
            self.count(&before);
            let mut entries = KernelEntries::open(library, &live, boot, self.after.as_deref())?;
            let read = self.read(&mut entries)?;
            if self.after.is_none() {
                self.after = before.last.map(|(_, cursor)| cursor);
            }
            if history {
                history = false;
                self.facts.update(|facts| facts.history_read = true);
                tracing::info!(
                    files = readable.len(),
                    entries = before.entries + read,
                    seconds = started.elapsed().as_secs_f64(),
                    "read this boot's kernel log; following it"
                );
            }
            self.metrics.up.set(1);
            match self.follow_files(library, &mut entries, &listed, &readable)? {
                Followed::Stopped => return Ok(()),
                Followed::FilesChanged => continue,
            }
        }
    }

    /// Follows one set of files until it changes or the reader is stopped: woken by inotify on
    /// their directories at most once per poll interval, so that a burst is read in one go.
    fn follow_files(
        &mut self,
        library: &Arc<Libsystemd>,
        entries: &mut KernelEntries,
        listed: &[files::Listed],
        readable: &[PathBuf],
    ) -> Result<Followed, String> {
        let interval = self.settings.poll_interval.get();
        let mut read_at = Instant::now();
        loop {
            if self.stopped() {
                return Ok(Followed::Stopped);
            }
            let change = entries.wait(interval)?;
            // A file created or deleted, or one that could not be opened and can now.
            let now_listed = files::list(&self.settings.journal_dirs)?;
            if now_listed != listed || self.readable(library, &now_listed) != readable {
                return Ok(Followed::FilesChanged);
            }
            if change == Change::Nothing {
                continue;
            }
            self.pause((read_at + interval).saturating_duration_since(Instant::now()));
            self.read(entries)?;
            read_at = Instant::now();
        }
    }

    /// The files to open, and those newly found unreadable counted and said.
    fn readable(&mut self, library: &Arc<Libsystemd>, listed: &[files::Listed]) -> Vec<PathBuf> {
        let (readable, settled) = self.files.readable(library, listed, Settle::Twice);
        for unreadable in &settled {
            tracing::warn!("{}", unreadable.describe(&library.name));
        }
        self.metrics.unreadable(self.files.unreadable());
        readable
    }

    /// Reads `entries` to their current end, into the facts and the series.
    fn read(&mut self, entries: &mut KernelEntries) -> Result<u64, String> {
        let (facts, metrics, stop) = (&self.facts, &self.metrics, &self.stop);
        let tally = read_to_end(
            entries,
            &mut self.parser,
            &|| stop.load(Ordering::Relaxed),
            &|events| take(facts, metrics, events),
        )?;
        self.count(&tally);
        if let Some((_, cursor)) = tally.last {
            self.after = Some(cursor);
        }
        Ok(tally.entries)
    }

    fn count(&self, tally: &Tally) {
        self.metrics.entries.inc_by(tally.entries);
        self.metrics.bad.inc_by(tally.bad);
        if let Some((realtime_usec, _)) = tally.last {
            self.metrics.lag.set(age(realtime_usec));
        }
    }
}

/// Events read, into the series and the facts.
fn take(facts: &Shared<LogFacts>, metrics: &KernelLogMetrics, events: Vec<(KernelEvent, Instant)>) {
    for (event, _) in &events {
        metrics.count(event);
    }
    facts.update(|facts| {
        for (event, at) in events {
            facts.apply(event, at);
        }
    });
}

/// `files`' kernel entries of `boot`, on up to as many threads as the agent may use (its CPU
/// quota counted, at most [`HISTORY_THREADS`]), each a journal over its share of the files. For
/// files no writer changes: the order in which they are read is no order of the journal's.
fn read_in_parallel(
    library: &Arc<Libsystemd>,
    files: &[PathBuf],
    boot: &str,
    stopped: &(dyn Fn() -> bool + Sync),
    apply: &(dyn Fn(Vec<(KernelEvent, Instant)>) + Sync),
) -> Result<Tally, String> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, HISTORY_THREADS)
        .min(files.len());
    let shares: Vec<Vec<PathBuf>> = (0..threads)
        .map(|t| files.iter().skip(t).step_by(threads).cloned().collect())
        .collect();
    let read = |share: &[PathBuf]| -> Result<Tally, String> {
        let mut entries = KernelEntries::open(library, share, boot, None)?;
        read_to_end(&mut entries, &mut Parser::default(), stopped, apply)
    };
    let read_shares: Vec<Result<Tally, String>> = std::thread::scope(|scope| {
        let running: Vec<_> = shares
            .iter()
            .map(|share| scope.spawn(move || read(share)))
            .collect();
        running
            .into_iter()
            .map(|thread| {
                thread.join().unwrap_or_else(|_| {
                    Err("a thread reading the journal's history panicked".into())
                })
            })
            .collect()
    });
    let mut all = Tally::default();
    for share in read_shares {
        let share = share?;
        all.entries += share.entries;
        all.bad += share.bad;
        if share.last.as_ref().map(|l| l.0) > all.last.as_ref().map(|l| l.0) {
            all.last = share.last;
        }
    }
    Ok(all)
}

/// What one read to the end found.
#[derive(Default)]
struct Tally {
    entries: u64,
    /// Entries whose message could not be read (damaged, or a payload that does not decompress).
    bad: u64,
    /// The last entry read: its `__REALTIME_TIMESTAMP`, and its cursor, taken as it is read (at
    /// the end libsystemd may have dropped a damaged file, and with it its current entry). Of
    /// entries read in parallel, the newest.
    last: Option<(u64, CString)>,
}

/// Reads `entries` to their end (or until `stopped`), handing the events parsed to `apply` in
/// batches of [`LOOKBACK_BATCH`]: one update of the facts per batch, not per line.
fn read_to_end(
    entries: &mut KernelEntries,
    parser: &mut Parser,
    stopped: &dyn Fn() -> bool,
    apply: &dyn Fn(Vec<(KernelEvent, Instant)>),
) -> Result<Tally, String> {
    let mut tally = Tally::default();
    let mut batch = Vec::new();
    while let Some(entry) = entries.next_entry()? {
        tally.entries += 1;
        tally.last = Some((entry.realtime_usec, entry.cursor));
        match entry.message {
            Ok(Some(message)) => {
                if let Some(event) = parser.message(message) {
                    batch.push((event, instant_of(entry.realtime_usec)));
                }
            }
            Ok(None) => {}
            Err(_) => tally.bad += 1,
        }
        if batch.len() >= LOOKBACK_BATCH {
            apply(std::mem::take(&mut batch));
        }
        if stopped() {
            break;
        }
    }
    if !batch.is_empty() {
        apply(batch);
    }
    Ok(tally)
}

/// This boot's kernel entries (`_TRANSPORT=kernel`, `_BOOT_ID`) in a set of journal files: the
/// library follows only the entries both matches select, and the reader takes only each one's
/// `MESSAGE` and time.
struct KernelEntries {
    journal: Journal,
    /// Where the reader resumes: the first entry after the seek is passed over if it is this one.
    resume: Option<CString>,
}

/// One entry, as read.
struct KernelEntry<'a> {
    realtime_usec: u64,
    cursor: CString,
    message: Result<Option<&'a [u8]>, nix::errno::Errno>,
}

impl KernelEntries {
    fn open(
        library: &Arc<Libsystemd>,
        files: &[PathBuf],
        boot: &str,
        after: Option<&CStr>,
    ) -> Result<KernelEntries, String> {
        let failed = |what: &str, e: nix::errno::Errno| {
            format!("cannot {what} the journal ({} files): {e}", files.len())
        };
        let mut journal = library.open_files(files).map_err(|e| failed("open", e))?;
        journal
            .add_match(b"_TRANSPORT=kernel")
            .and_then(|()| journal.add_match(format!("_BOOT_ID={boot}").as_bytes()))
            .map_err(|e| failed("filter", e))?;
        match after {
            Some(cursor) => journal.seek_cursor(cursor),
            None => journal.seek_head(),
        }
        .map_err(|e| failed("seek in", e))?;
        Ok(KernelEntries {
            journal,
            resume: after.map(CStr::to_owned),
        })
    }

    /// The next entry, None at the end (for now: journald may append more).
    fn next_entry(&mut self) -> Result<Option<KernelEntry<'_>>, String> {
        let failed = |e| format!("cannot read the journal: {e}");
        loop {
            if !self.journal.advance().map_err(failed)? {
                return Ok(None);
            }
            match self.resume.take() {
                Some(cursor) if self.journal.test_cursor(&cursor).map_err(failed)? => continue,
                _ => break,
            }
        }
        let realtime_usec = self.journal.realtime_usec().map_err(failed)?;
        let cursor = self.journal.cursor().map_err(failed)?;
        Ok(Some(KernelEntry {
            realtime_usec,
            cursor,
            message: self.journal.data(c"MESSAGE"),
        }))
    }

    fn wait(&mut self, timeout: Duration) -> Result<Change, String> {
        self.journal
            .wait(timeout)
            .map_err(|e| format!("cannot follow the journal: {e}"))
    }
}

/// One boot's kernel log, read once.
pub struct Scan {
    pub facts: LogFacts,
    pub entries: u64,
    pub bad_entries: u64,
    /// The journal files read.
    pub files: Vec<PathBuf>,
    /// The files the library cannot open, left out.
    pub unreadable: Vec<Unreadable>,
}

/// Reads `boot`'s kernel log in `dirs` once through `library`, as `serve` reads the history at
/// start (`mlnode-agent kernel-log`).
pub fn scan(library: &Path, dirs: &[PathBuf], boot: &str) -> Result<Scan, String> {
    let library = Libsystemd::load(library)?;
    let listed = files::list(dirs)?;
    let (files, unreadable) = FileChecks::default().readable(&library, &listed, Settle::Now);
    let facts = std::sync::Mutex::new(LogFacts {
        history_read: true,
        ..LogFacts::default()
    });
    let tally = read_in_parallel(&library, &files, boot, &|| false, &|events| {
        let mut facts = facts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (event, at) in events {
            facts.apply(event, at);
        }
    })?;
    let facts = facts
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Ok(Scan {
        facts,
        entries: tally.entries,
        bad_entries: tally.bad,
        files,
        unreadable,
    })
}

/// This boot's id as the journal writes `_BOOT_ID`: the kernel's UUID without its dashes.
pub fn read_boot_id(path: &Path) -> Result<String, String> {
    let text = mlnode_files::read_bounded_text(path, 64)
        .map_err(|e| format!("cannot read the boot id from {}: {e}", path.display()))?;
    let id: String = text.trim().chars().filter(|c| *c != '-').collect();
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{} does not hold a boot id: {text:?}",
            path.display()
        ));
    }
    Ok(id.to_ascii_lowercase())
}

fn wall_usec() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn age(realtime_usec: u64) -> f64 {
    wall_usec().saturating_sub(realtime_usec) as f64 / 1e6
}

/// An entry's wall-clock time on the agent's monotonic clock: as long ago as the wall says
/// (never in the future; a history older than the monotonic clock's origin is its origin).
fn instant_of(realtime_usec: u64) -> Instant {
    let ago = Duration::from_micros(wall_usec().saturating_sub(realtime_usec));
    let now = Instant::now();
    now.checked_sub(ago).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_id_is_the_kernels_uuid_without_dashes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        std::fs::write(&path, "6C1F3A2E-8d4b-4f7a-9e21-0b5d7c9a1e33\n").unwrap();
        assert_eq!(
            read_boot_id(&path).unwrap(),
            "6c1f3a2e8d4b4f7a9e210b5d7c9a1e33"
        );
        std::fs::write(&path, "not a boot id\n").unwrap();
        assert!(read_boot_id(&path)
            .unwrap_err()
            .contains("does not hold a boot id"));
        assert!(read_boot_id(&dir.path().join("missing")).is_err());
    }
}
