//! The reader: the node's systemd journal, read-only, through `sdjournal` (pure Rust: no
//! libsystemd, no journalctl, no `/dev/kmsg`). This boot's kernel entries (`_TRANSPORT=kernel`,
//! `_BOOT_ID` of this boot) from its start, then each new one as journald appends it. One thread
//! of its own, never awaited: `/metrics` and SIGTERM do not wait on a journal read. A journal
//! that is missing, unreadable or rotated away is retried, said once, and never stops the agent.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use sdjournal::{Cursor, EntryRef, Journal, JournalConfig};

use super::facts::LogFacts;
use super::parse::{KernelEvent, Parser};
use super::settings::KernelLogSettings;
use mlnode_core::shared::Shared;

/// Entries applied to the facts at once during the lookback: one update (and one wake-up of the
/// verdicts) per batch, not per line of a long history.
const LOOKBACK_BATCH: usize = 1024;

/// `mlnode_kernel_log_*`, and the series of the faults only the kernel log shows.
#[derive(Clone)]
pub struct KernelLogMetrics {
    up: IntGauge,
    entries: IntCounter,
    bad: IntCounter,
    lag: Gauge,
    fallen_off_bus: IntGaugeVec,
    sxids: IntCounterVec,
    neuron_errors: IntCounterVec,
}

impl KernelLogMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<KernelLogMetrics> {
        let metrics = KernelLogMetrics {
            up: IntGauge::new("mlnode_kernel_log_up", "1 while the node's journal is being read (this boot's kernel entries), 0 while it cannot be: missing, unreadable, or not mounted.")?,
            entries: IntCounter::new("mlnode_kernel_log_entries_read_total", "This boot's kernel entries read from the journal, the lookback included.")?,
            bad: IntCounter::new("mlnode_kernel_log_bad_entries_total", "Journal entries that could not be read (corrupt, truncated, a payload that does not decompress) and were skipped.")?,
            lag: Gauge::new("mlnode_kernel_log_lag_seconds", "How long after journald stored it the newest kernel entry was read (its __REALTIME_TIMESTAMP to now); during the lookback, the age of the history being read.")?,
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
        registry.register(Box::new(metrics.fallen_off_bus.clone()))?;
        registry.register(Box::new(metrics.sxids.clone()))?;
        registry.register(Box::new(metrics.neuron_errors.clone()))?;
        Ok(metrics)
    }

    /// The series an event adds to.
    pub fn count(&self, event: &KernelEvent) {
        match event {
            KernelEvent::FallenOffBus { gpu } => self
                .fallen_off_bus
                .with_label_values(&[&format!(
                    "{:08X}:{:02X}:{:02X}.0",
                    gpu.domain, gpu.bus, gpu.device
                )])
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
                position: None,
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
    /// The last entry read, of any transport: the follower reads what comes after it, and after an
    /// error the reader resumes there, never reading an entry twice nor skipping one that is
    /// still there.
    position: Option<Position>,
}

impl Reader {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn run(&mut self) {
        let mut said = String::new();
        while !self.stopped() {
            let trouble = match read_boot_id(&self.settings.boot_id_file) {
                Ok(boot) => match self.follow(&boot) {
                    Ok(()) => return,
                    Err(trouble) => trouble,
                },
                Err(trouble) => trouble,
            };
            self.metrics.up.set(0);
            // No history to wait for: the verdicts go on without it.
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
            std::thread::sleep(self.settings.poll_interval.get().min(wait));
        }
    }

    /// The lookback (or, after an error, the catch-up after the last entry read), then the live
    /// tail until stopped. Err says why reading stopped.
    fn follow(&mut self, boot: &str) -> Result<(), String> {
        let (journal, dirs) = open(
            &self.settings.journal_dirs,
            self.settings.poll_interval.get(),
        )?;
        let started = Instant::now();
        let after = self.position.as_ref().map(|p| p.cursor.clone());
        let query = kernel_entries(&journal, boot, after);
        let mut batch = Vec::new();
        let mut read = 0u64;
        for item in query
            .iter()
            .map_err(|e| format!("cannot read the journal: {e}"))?
        {
            match item {
                Ok(entry) => {
                    read += 1;
                    batch.extend(self.entry(&entry));
                }
                Err(e) => self.bad(&e),
            }
            if batch.len() >= LOOKBACK_BATCH {
                self.apply(std::mem::take(&mut batch));
            }
            if self.stopped() {
                return Ok(());
            }
        }
        self.apply(batch);
        self.facts.update(|facts| facts.history_read = true);
        self.metrics.up.set(1);
        tracing::info!(dirs = ?dirs, entries = read, seconds = started.elapsed().as_secs_f64(), "read this boot's kernel log; following it");
        // What the lookback's snapshot holds ends at its last entry, of any transport: the
        // follower reads what comes after it.
        if let Some(last) = last_entry(&journal) {
            self.position = Some(last);
        }
        drop(journal);
        let boot = boot_id_bytes(boot)?;
        // One live engine at a time; rebuilt after an error of its own, from where it stopped.
        loop {
            match self.follow_live(&boot) {
                Ok(Followed::Stopped) => return Ok(()),
                Ok(Followed::FilesChanged) => continue,
                Err(trouble) => {
                    // A journal that cannot be opened at all is the run loop's to say and wait for.
                    open(
                        &self.settings.journal_dirs,
                        self.settings.poll_interval.get(),
                    )?;
                    tracing::debug!(error = %trouble, "the journal's follower stopped; starting another");
                    self.pause(self.settings.poll_interval.get());
                }
            }
        }
    }

    /// Follows the journal with sdjournal's live engine until stopped (Ok) or until the engine
    /// fails (Err). Every entry of any transport is seen, so that `position` is the last one read.
    ///
    /// The live engine starts each file it discovers at the file's end as it finds it, after a
    /// rescan that takes seconds on a large journal; the entries appended meanwhile (the first of
    /// a file journald just rotated to) it never delivers (sdjournal 0.1.15; fixed in 0.1.19, which
    /// needs Rust 1.96). So whenever the set of files changes, and at the start, the reader reads
    /// what comes after `position` itself, from a snapshot taken after the engine's, and a change
    /// ends this engine (`FilesChanged`) so that a new one starts on the new set; the engines'
    /// copies of what the reader read are passed over by their place in the journal's order.
    fn follow_live(&mut self, boot: &[u8; 16]) -> Result<Followed, String> {
        let dirs = self.settings.journal_dirs.clone();
        let (journal, _) = open(&dirs, self.settings.poll_interval.get())?;
        let mut live = journal
            .live()
            .map_err(|e| format!("cannot follow the journal: {e}"))?;
        let subscription = live
            .subscribe(live.filter())
            .map_err(|e| format!("cannot follow the journal: {e}"))?;
        drop(journal);
        let files = journal_files(&dirs);
        // The engine may have found a file the set above does not have yet: read after it twice.
        let mut catch_up = 2u8;
        while !self.stopped() {
            if catch_up > 0 {
                catch_up -= 1;
                self.catch_up(boot);
            }
            // A new set of files (a rotation, a vacuum): a new engine and a catch-up of the
            // reader's, rather than the engine's own rescan of every entry after its last one
            // (3.5 s of CPU on a 2 GiB journal).
            if journal_files(&dirs) != files {
                return Ok(Followed::FilesChanged);
            }
            live.poll_once()
                .map_err(|e| format!("cannot follow the journal: {e}"))?;
            let mut batch = Vec::new();
            loop {
                match subscription.try_recv() {
                    Ok(Ok(entry)) => batch.extend(self.followed(&entry, boot)),
                    Ok(Err(e)) => self.bad(&e),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        return Err("the journal's follower stopped".into())
                    }
                }
            }
            self.apply(batch);
            // Entries that arrive meanwhile are read together at the next poll: the follower
            // reopens a file once per wake-up, not once per line (a burst costs one read).
            self.pause(self.settings.poll_interval.get());
        }
        Ok(Followed::Stopped)
    }

    /// Reads what the journal holds after `position`, from a snapshot of it taken now.
    fn catch_up(&mut self, boot: &[u8; 16]) {
        let Ok((journal, _)) = open(
            &self.settings.journal_dirs,
            self.settings.poll_interval.get(),
        ) else {
            return; // Nothing to read; the live engine says why if it matters.
        };
        let mut query = journal.query();
        if let Some(after) = &self.position {
            // The entries are in the order of their wall-clock time: what follows is found
            // by a seek in each file, not a walk from its start.
            query
                .since_realtime(after.realtime_usec)
                .after_cursor(after.cursor.clone());
        }
        let Ok(entries) = query.iter() else { return };
        let mut batch = Vec::new();
        // An entry that cannot be read here is one being written as the snapshot was taken:
        // the live engine delivers it. A damaged one it reports.
        for entry in entries.flatten() {
            batch.extend(self.followed(&entry, boot));
            if batch.len() >= LOOKBACK_BATCH {
                self.apply(std::mem::take(&mut batch));
            }
        }
        self.apply(batch);
    }

    /// An entry the follower reads: passed over if it is not after `position` (read already),
    /// else the new position, and read as a kernel entry if it is one of this boot's.
    fn followed(&mut self, entry: &EntryRef, boot: &[u8; 16]) -> Option<(KernelEvent, Instant)> {
        let at = Position::of(entry)?;
        if self.position.as_ref().is_some_and(|p| p.key() >= at.key()) {
            return None;
        }
        self.position = Some(at);
        if entry.boot_id() != *boot || entry.get("_TRANSPORT") != Some(b"kernel".as_slice()) {
            return None;
        }
        self.metrics.lag.set(age(entry.realtime_usec()));
        self.entry(entry)
    }

    /// One kernel entry: counted and parsed.
    fn entry(&mut self, entry: &EntryRef) -> Option<(KernelEvent, Instant)> {
        self.metrics.entries.inc();
        let event = event_of(&mut self.parser, entry)?;
        self.metrics.count(&event.0);
        Some(event)
    }

    fn apply(&self, events: Vec<(KernelEvent, Instant)>) {
        if events.is_empty() {
            return;
        }
        self.facts.update(|facts| {
            for (event, at) in events {
                facts.apply(event, at);
            }
        });
    }

    fn bad(&self, error: &sdjournal::SdJournalError) {
        self.metrics.bad.inc();
        tracing::debug!(error = %error, "skipped a journal entry that cannot be read");
    }
}

/// Why a live engine's following ended without an error.
enum Followed {
    Stopped,
    /// The set of journal files changed: a new engine follows them.
    FilesChanged,
}

/// A place in the journal: an entry, and its key in sdjournal's order (wall-clock time, then
/// sequence number).
struct Position {
    cursor: Cursor,
    realtime_usec: u64,
    seqnum: u64,
}

impl Position {
    fn of(entry: &EntryRef) -> Option<Position> {
        Some(Position {
            cursor: entry.cursor().ok()?,
            realtime_usec: entry.realtime_usec(),
            seqnum: entry.seqnum(),
        })
    }

    fn key(&self) -> (u64, u64) {
        (self.realtime_usec, self.seqnum)
    }
}

/// The journal's last entry, of any transport (None when it has none that can be read).
fn last_entry(journal: &Journal) -> Option<Position> {
    let mut query = journal.query();
    query.seek_tail().limit(1);
    query.iter().ok()?.flatten().find_map(|e| Position::of(&e))
}

/// A boot id as `_BOOT_ID` writes it (32 hex digits), as the entry header holds it.
fn boot_id_bytes(boot: &str) -> Result<[u8; 16], String> {
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = boot
            .get(2 * i..2 * i + 2)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .ok_or_else(|| format!("{boot:?} is not a boot id"))?;
    }
    Ok(id)
}

/// The journal files in `dirs` and their machine-id directories, by name: what changes when
/// journald creates, rotates or deletes one (not when it appends).
fn journal_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending: Vec<PathBuf> = dirs.to_vec();
    let mut depth = 0;
    while !pending.is_empty() && depth < 2 {
        for dir in std::mem::take(&mut pending) {
            let Ok(listing) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in listing.flatten() {
                let path = entry.path();
                match entry.file_type() {
                    Ok(kind) if kind.is_dir() => pending.push(path),
                    Ok(kind) if kind.is_file() => files.push(path),
                    _ => {}
                }
            }
        }
        depth += 1;
    }
    files.retain(|f| f.extension().is_some_and(|e| e == "journal"));
    files.sort();
    files
}

/// The journal in those of `dirs` that exist, and which those are. Err says why none can be read.
fn open(dirs: &[PathBuf], poll_interval: Duration) -> Result<(Journal, Vec<PathBuf>), String> {
    let present: Vec<PathBuf> = dirs.iter().filter(|d| d.is_dir()).cloned().collect();
    if present.is_empty() {
        return Err(format!(
            "none of {dirs:?} exists: mount the host's journal directories read-only (components/kernel-log)"
        ));
    }
    let config = JournalConfig {
        poll_interval,
        ..JournalConfig::default()
    };
    let journal = Journal::open_dirs_with_config(&present, config)
        .map_err(|e| format!("cannot open the journal in {present:?}: {e}"))?;
    Ok((journal, present))
}

/// `boot`'s kernel entries, after the entry at `after` when given.
fn kernel_entries(journal: &Journal, boot: &str, after: Option<Cursor>) -> sdjournal::JournalQuery {
    let mut query = journal.query();
    query
        .match_exact("_TRANSPORT", b"kernel")
        .match_exact("_BOOT_ID", boot.as_bytes());
    if let Some(cursor) = after {
        query.after_cursor(cursor);
    }
    query
}

/// What an entry's message says, and when it was logged on the agent's clock.
fn event_of(parser: &mut Parser, entry: &EntryRef) -> Option<(KernelEvent, Instant)> {
    let message = String::from_utf8_lossy(entry.get("MESSAGE")?);
    let event = parser.line(&message)?;
    Some((event, instant_of(entry.realtime_usec())))
}

/// One boot's kernel log, read once.
pub struct Scan {
    pub facts: LogFacts,
    pub entries: u64,
    pub bad_entries: u64,
    /// The directories that exist and were read.
    pub dirs: Vec<PathBuf>,
}

/// Reads `boot`'s kernel log in `dirs` once, as `serve` reads the history at start
/// (`mlnode-agent kernel-log`).
pub fn scan(dirs: &[PathBuf], boot: &str) -> Result<Scan, String> {
    let (journal, dirs) = open(dirs, Duration::from_secs(1))?;
    let mut parser = Parser::default();
    let mut scan = Scan {
        facts: LogFacts {
            history_read: true,
            ..LogFacts::default()
        },
        entries: 0,
        bad_entries: 0,
        dirs,
    };
    let query = kernel_entries(&journal, boot, None);
    for item in query
        .iter()
        .map_err(|e| format!("cannot read the journal: {e}"))?
    {
        match item {
            Ok(entry) => {
                scan.entries += 1;
                if let Some((event, at)) = event_of(&mut parser, &entry) {
                    scan.facts.apply(event, at);
                }
            }
            Err(_) => scan.bad_entries += 1,
        }
    }
    Ok(scan)
}

/// This boot's id as the journal writes `_BOOT_ID`: the kernel's UUID without its dashes.
pub fn read_boot_id(path: &Path) -> Result<String, String> {
    let text = mlnode_verify::files::read_bounded_text(path, 64)
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
    fn a_boot_id_is_compared_as_the_entry_header_holds_it() {
        let id = boot_id_bytes("6c1f3a2e8d4b4f7a9e210b5d7c9a1e33").unwrap();
        assert_eq!(id[0], 0x6c);
        assert_eq!(id[15], 0x33);
        assert!(boot_id_bytes("6c1f").is_err());
        assert!(boot_id_bytes("zz1f3a2e8d4b4f7a9e210b5d7c9a1e33").is_err());
    }

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
