//! The monitor's decisions as a pure function of what happened and when: when to (re)watch, when
//! collected work is due (debounce), when a full rescan is due, what an open or a write of a
//! weight file records, and whether a verification has stalled. The task in `mod.rs` only turns
//! file events, timers and finished verifications into [`Input`]s (an open told the agent's own or
//! another's by the verifier's announcements) and performs the [`Action`]s; every rule here is
//! tested on made-up instants, no clock involved.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::events::Work;
use mlnode_core::loads::FileId;

/// The loop's timing rules.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Quiet time after the last file event before the work it named starts.
    pub debounce: Duration,
    pub full_rescan_interval: Duration,
    /// The full rescan interval while the model cannot be watched: its files' changes are only
    /// found by looking, so it looks more often.
    pub unwatched_rescan_interval: Duration,
    /// A watch set-up that failed (ROOT missing, the watch limit) is retried this often.
    pub watch_retry: Duration,
    /// A manifest that could not be used is tried again this often.
    pub manifest_retry: Duration,
}

/// What the next verification must look at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Todo {
    /// Every file, and the extras.
    pub full: bool,
    /// Read the manifest again first.
    pub reload: bool,
    /// List the extras again.
    pub listing: bool,
    pub files: HashSet<String>,
}

impl Todo {
    fn add(&mut self, work: Work) {
        match work {
            Work::Full => self.full = true,
            Work::ReloadManifest => self.reload = true,
            Work::Listing => self.listing = true,
            Work::Files(files) | Work::Access(files) => self.files.extend(files),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Todo::default()
    }
}

#[derive(Debug)]
pub enum Input {
    /// Time passed: a tick, or the instant [`Planner::next_wake`] named.
    Wake,
    /// The watch asked for by [`Action::Watch`] is set up (true) or could not be (false).
    Watched(bool),
    /// ROOT is no longer the directory the watch was set on (replaced by a rename).
    RootReplaced,
    /// Work routed from file events.
    Work(Work),
    /// A weight file of the model was opened: by the agent itself (`own`: an open its verifier
    /// announced, `mlnode_verify::own_opens`), or by another process.
    WeightFileOpened { own: bool, file: FileId },
    /// Another process wrote a weight file of the model (a download, a repair); `completed`: it
    /// closed it after writing, and this is its size.
    WeightFileWritten {
        file: FileId,
        completed: Option<u64>,
    },
    /// The verification asked for ended.
    Finished(Outcome),
    /// Every file was last hashed this long ago (by a previous agent of this boot, whose record a
    /// restart trusted): the next full rescan is due a rescan interval after that hash, not after
    /// the restart.
    LastFullHash(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not started: a restarted agent spreads the full hash it cannot skip over this delay
    /// (`verify.restart_jitter`), so that a rollout's agents do not all read at once.
    Deferred(Duration),
    /// A verdict, either way: the model's state is known.
    Report,
    /// It could not run (ROOT unreadable): the next run must look at everything.
    Failed,
    /// The manifest could not be read or trusted: it is read again after `manifest_retry`.
    NoManifest,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Set up the file watch (again), then say [`Input::Watched`].
    Watch,
    /// Start a verification, then say [`Input::Finished`].
    Verify(Todo),
    /// Another process opened a weight file (a server loading the model, unless a write of the
    /// file follows): record it for the startup phases and the priority.
    RecordLoad(FileId),
    /// Another process wrote a weight file: its open was the writer's, and the write is part of a
    /// download (completed: closed, at this size).
    RecordWrite {
        file: FileId,
        completed: Option<u64>,
    },
}

#[derive(Debug, PartialEq, Eq)]
enum Watch {
    /// Never asked for: the first set-up finds nothing that a verification would not.
    Never,
    Asked {
        before: bool,
    },
    Watching,
    /// The last attempt failed at this instant.
    Failed {
        at: Instant,
    },
}

pub struct Planner {
    timing: Timing,
    todo: Todo,
    /// The last file event: work from events waits for `debounce` of quiet after it. None: the
    /// work is scheduled (start, rescan, retry) and due at once.
    last_event: Option<Instant>,
    verifying: bool,
    watch: Watch,
    next_rescan: Instant,
    /// The last verification could not run: the next one starts from the manifest, whole.
    unverified: bool,
    manifest_retry_at: Option<Instant>,
    /// A deferred verification waits until then.
    not_before: Option<Instant>,
}

impl Planner {
    /// At start: everything is to do, the manifest to read.
    pub fn new(timing: Timing, now: Instant) -> Planner {
        Planner {
            timing,
            todo: Todo {
                full: true,
                reload: true,
                ..Todo::default()
            },
            last_event: None,
            verifying: false,
            watch: Watch::Never,
            next_rescan: now + timing.full_rescan_interval,
            unverified: true,
            manifest_retry_at: None,
            not_before: None,
        }
    }

    pub fn on(&mut self, input: Input, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        match input {
            Input::Wake => {}
            Input::Watched(true) => {
                // Whatever happened while nothing (or the old ROOT) was watched is only found by
                // looking.
                if self.watch == (Watch::Asked { before: true }) {
                    self.todo.full = true;
                }
                self.watch = Watch::Watching;
            }
            Input::Watched(false) => {
                self.watch = Watch::Failed { at: now };
                self.next_rescan = self.next_rescan.min(now + self.rescan_interval());
            }
            Input::RootReplaced => {
                self.watch = Watch::Asked { before: true };
                actions.push(Action::Watch);
            }
            Input::Work(work) => {
                self.todo.add(work);
                self.last_event = Some(now);
            }
            Input::WeightFileOpened { own: false, file } => actions.push(Action::RecordLoad(file)),
            Input::WeightFileOpened { own: true, .. } => {}
            Input::WeightFileWritten { file, completed } => {
                actions.push(Action::RecordWrite { file, completed })
            }
            Input::Finished(outcome) => {
                self.verifying = false;
                self.unverified = outcome != Outcome::Report;
                match outcome {
                    Outcome::NoManifest => {
                        self.manifest_retry_at = Some(now + self.timing.manifest_retry)
                    }
                    Outcome::Deferred(delay) => {
                        self.todo.full = true;
                        self.not_before = Some(now + delay);
                    }
                    Outcome::Report | Outcome::Failed => {}
                }
            }
            Input::LastFullHash(ago) => {
                let due = now
                    .checked_sub(ago)
                    .map_or(now, |hashed| hashed + self.rescan_interval());
                self.next_rescan = due.max(now);
            }
        }
        let watch_due = match self.watch {
            Watch::Never => Some(false),
            Watch::Failed { at } if now >= at + self.timing.watch_retry => Some(true),
            _ => None,
        };
        if let Some(before) = watch_due {
            self.watch = Watch::Asked { before };
            actions.push(Action::Watch);
        }
        if now >= self.next_rescan {
            self.todo.full = true;
            self.last_event = None;
            self.next_rescan = now + self.rescan_interval();
        }
        if self.manifest_retry_at.is_some_and(|at| now >= at) {
            self.manifest_retry_at = None;
            self.todo.reload = true;
        }
        if !self.verifying && self.is_due(now) {
            let mut todo = std::mem::take(&mut self.todo);
            if self.unverified {
                todo.full = true;
                todo.reload = true;
            }
            self.last_event = None;
            self.verifying = true;
            self.not_before = None;
            actions.push(Action::Verify(todo));
        }
        actions
    }

    fn rescan_interval(&self) -> Duration {
        match self.watch {
            Watch::Failed { .. } => self
                .timing
                .unwatched_rescan_interval
                .min(self.timing.full_rescan_interval),
            _ => self.timing.full_rescan_interval,
        }
    }

    /// Collected work may start at once when scheduled, `debounce` after the last event otherwise.
    fn is_due(&self, now: Instant) -> bool {
        !self.todo.is_empty()
            && self.not_before.is_none_or(|at| now >= at)
            && self
                .last_event
                .is_none_or(|event| now >= event + self.timing.debounce)
    }

    /// The next instant at which time alone changes a decision: the task sleeps until then.
    pub fn next_wake(&self) -> Instant {
        let mut wake = self.next_rescan;
        if let Watch::Failed { at } = self.watch {
            wake = wake.min(at + self.timing.watch_retry);
        }
        for at in [self.manifest_retry_at, self.not_before]
            .into_iter()
            .flatten()
        {
            wake = wake.min(at);
        }
        if let (false, false, Some(event)) = (self.verifying, self.todo.is_empty(), self.last_event)
        {
            wake = wake.min(event + self.timing.debounce);
        }
        wake
    }
}

/// Whether a verification under way still makes progress: a stall is its hashed bytes unchanged
/// for longer than the stall timeout (a hung NFS server, a dying disk).
pub struct Progress {
    bytes: u64,
    since: Instant,
}

impl Progress {
    pub fn new(now: Instant) -> Progress {
        Progress {
            bytes: 0,
            since: now,
        }
    }

    /// Records the bytes hashed so far at `now`; true when they have not moved for over `timeout`.
    pub fn stalled(&mut self, bytes: u64, now: Instant, timeout: Duration) -> bool {
        if bytes != self.bytes {
            self.bytes = bytes;
            self.since = now;
        }
        now.saturating_duration_since(self.since) > timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        debounce: Duration::from_millis(500),
        full_rescan_interval: Duration::from_secs(24 * 3600),
        unwatched_rescan_interval: Duration::from_secs(900),
        watch_retry: Duration::from_secs(30),
        manifest_retry: Duration::from_secs(5),
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn files(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn verify(full: bool, reload: bool, names: &[&str]) -> Action {
        Action::Verify(Todo {
            full,
            reload,
            listing: false,
            files: files(names),
        })
    }

    /// A planner past its start: watching, first verification done.
    fn settled(t0: Instant) -> Planner {
        let mut planner = Planner::new(TIMING, t0);
        planner.on(Input::Wake, t0);
        planner.on(Input::Watched(true), t0);
        planner.on(Input::Finished(Outcome::Report), t0 + ms(100));
        planner
    }

    #[test]
    fn at_start_it_watches_and_verifies_everything_from_the_manifest() {
        let t0 = Instant::now();
        let mut planner = Planner::new(TIMING, t0);
        assert_eq!(
            planner.on(Input::Wake, t0),
            [Action::Watch, verify(true, true, &[])]
        );
        assert_eq!(planner.on(Input::Watched(true), t0), [], "no second look");
        assert_eq!(planner.on(Input::Finished(Outcome::Report), t0), []);
        assert_eq!(planner.on(Input::Wake, t0 + TIMING.watch_retry), []);
    }

    #[test]
    fn event_work_waits_for_a_quiet_debounce_and_is_merged() {
        let t0 = Instant::now();
        let mut planner = settled(t0);
        let t = t0 + Duration::from_secs(10);
        assert_eq!(planner.on(Input::Work(Work::Files(files(&["a"]))), t), []);
        assert_eq!(planner.next_wake(), t + TIMING.debounce);
        // A second event restarts the quiet time.
        let t2 = t + ms(300);
        assert_eq!(planner.on(Input::Work(Work::Files(files(&["b"]))), t2), []);
        assert_eq!(planner.on(Input::Wake, t + TIMING.debounce), []);
        assert_eq!(planner.next_wake(), t2 + TIMING.debounce);
        assert_eq!(
            planner.on(Input::Wake, t2 + TIMING.debounce),
            [verify(false, false, &["a", "b"])]
        );
    }

    #[test]
    fn work_that_arrives_during_a_verification_starts_after_it() {
        let t0 = Instant::now();
        let mut planner = settled(t0);
        let t = t0 + Duration::from_secs(10);
        planner.on(Input::Work(Work::Files(files(&["a"]))), t);
        assert_eq!(planner.on(Input::Wake, t + TIMING.debounce).len(), 1);
        planner.on(Input::Work(Work::Listing), t + ms(600));
        assert_eq!(planner.on(Input::Wake, t + ms(5000)), [], "one at a time");
        assert_eq!(
            planner.on(Input::Finished(Outcome::Report), t + ms(6000)),
            [Action::Verify(Todo {
                listing: true,
                ..Todo::default()
            })],
            "its debounce ran out meanwhile"
        );
    }

    #[test]
    fn a_full_rescan_comes_every_interval_without_debounce() {
        let t0 = Instant::now();
        let mut planner = settled(t0);
        let due = t0 + TIMING.full_rescan_interval;
        assert_eq!(planner.next_wake(), due);
        assert_eq!(planner.on(Input::Wake, due - ms(1)), []);
        assert_eq!(planner.on(Input::Wake, due), [verify(true, false, &[])]);
        planner.on(Input::Finished(Outcome::Report), due + ms(10));
        assert_eq!(planner.next_wake(), due + TIMING.full_rescan_interval);
    }

    #[test]
    fn a_failed_watch_is_retried_and_its_return_looks_at_everything() {
        let t0 = Instant::now();
        let mut planner = Planner::new(TIMING, t0);
        planner.on(Input::Wake, t0);
        planner.on(Input::Watched(false), t0);
        planner.on(Input::Finished(Outcome::Report), t0 + ms(10));
        assert_eq!(planner.next_wake(), t0 + TIMING.watch_retry);
        assert_eq!(planner.on(Input::Wake, t0 + TIMING.watch_retry - ms(1)), []);
        assert_eq!(
            planner.on(Input::Wake, t0 + TIMING.watch_retry),
            [Action::Watch]
        );
        assert_eq!(
            planner.on(Input::Watched(true), t0 + TIMING.watch_retry),
            [verify(true, false, &[])]
        );
    }

    /// A model that cannot be watched (the kernel's limits) is not continuously verified: until
    /// a retry succeeds it is rescanned on the short interval, and back on the long one after.
    #[test]
    fn an_unwatched_model_is_rescanned_often() {
        let t0 = Instant::now();
        let mut planner = Planner::new(TIMING, t0);
        planner.on(Input::Wake, t0);
        planner.on(Input::Watched(false), t0);
        planner.on(Input::Finished(Outcome::Report), t0 + ms(10));
        let mut at = t0;
        for _ in 0..3 {
            let due = at + TIMING.unwatched_rescan_interval;
            // Every watch retry on the way fails too.
            while planner.next_wake() < due {
                let retry = planner.next_wake();
                assert_eq!(planner.on(Input::Wake, retry), [Action::Watch]);
                planner.on(Input::Watched(false), retry);
            }
            assert_eq!(planner.next_wake(), due);
            // A retry may fall due at the same instant.
            let actions = planner.on(Input::Wake, due);
            assert!(actions.contains(&verify(true, false, &[])), "{actions:?}");
            if actions.contains(&Action::Watch) {
                planner.on(Input::Watched(false), due);
            }
            planner.on(Input::Finished(Outcome::Report), due);
            at = due;
        }
        let retry = planner.next_wake();
        assert_eq!(planner.on(Input::Wake, retry), [Action::Watch]);
        planner.on(Input::Watched(true), retry);
        planner.on(Input::Finished(Outcome::Report), retry);
        let rescan = at + TIMING.unwatched_rescan_interval;
        assert_eq!(planner.on(Input::Wake, rescan), [verify(true, false, &[])]);
        planner.on(Input::Finished(Outcome::Report), rescan);
        assert_eq!(planner.next_wake(), rescan + TIMING.full_rescan_interval);
    }

    #[test]
    fn a_replaced_root_is_watched_again_and_looked_at_whole() {
        let t0 = Instant::now();
        let mut planner = settled(t0);
        let t = t0 + Duration::from_secs(60);
        assert_eq!(planner.on(Input::RootReplaced, t), [Action::Watch]);
        assert_eq!(
            planner.on(Input::Watched(true), t),
            [verify(true, false, &[])]
        );
    }

    /// The agent's own opens are no loads whenever they come (during a verification or after
    /// it, however late inotify says so); another process's are, at once after a verification
    /// ends too; a write is said as one.
    #[test]
    fn only_other_processes_opens_are_loads() {
        let t0 = Instant::now();
        let mut planner = Planner::new(TIMING, t0);
        planner.on(Input::Wake, t0);
        let shard = (1, 7);
        let open = |own| Input::WeightFileOpened { own, file: shard };
        assert_eq!(planner.on(open(true), t0 + ms(50)), [], "hashing");
        assert_eq!(
            planner.on(open(false), t0 + ms(60)),
            [Action::RecordLoad(shard)],
            "a server reading while the agent verifies"
        );
        let done = t0 + ms(100);
        planner.on(Input::Finished(Outcome::Report), done);
        assert_eq!(planner.on(open(true), done + ms(500)), [], "its late echo");
        assert_eq!(
            planner.on(open(false), done + ms(10)),
            [Action::RecordLoad(shard)],
            "10 ms after the verification"
        );
        assert_eq!(
            planner.on(
                Input::WeightFileWritten {
                    file: shard,
                    completed: Some(300)
                },
                done + ms(20)
            ),
            [Action::RecordWrite {
                file: shard,
                completed: Some(300)
            }]
        );
    }

    #[test]
    fn an_unusable_manifest_is_read_again_on_its_retry() {
        let t0 = Instant::now();
        let mut planner = Planner::new(TIMING, t0);
        planner.on(Input::Wake, t0);
        planner.on(Input::Finished(Outcome::NoManifest), t0);
        assert_eq!(planner.next_wake(), t0 + TIMING.manifest_retry);
        assert_eq!(planner.on(Input::Wake, t0 + ms(4999)), []);
        assert_eq!(
            planner.on(Input::Wake, t0 + TIMING.manifest_retry),
            [verify(true, true, &[])]
        );
    }

    #[test]
    fn a_verification_stalls_when_its_bytes_stop_moving_for_the_timeout() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(300);
        let mut progress = Progress::new(t0);
        assert!(
            !progress.stalled(0, t0 + timeout, timeout),
            "exactly the timeout"
        );
        assert!(progress.stalled(0, t0 + timeout + ms(1), timeout));
        assert!(
            !progress.stalled(64 << 10, t0 + timeout + ms(2), timeout),
            "moved again"
        );
        let later = t0 + timeout + ms(2) + timeout;
        assert!(!progress.stalled(64 << 10, later, timeout));
        assert!(progress.stalled(64 << 10, later + ms(1), timeout));
    }

    #[test]
    fn after_a_run_that_could_not_verify_the_next_one_is_whole() {
        let t0 = Instant::now();
        let mut planner = settled(t0);
        planner.on(Input::Work(Work::Files(files(&["a"]))), t0 + ms(200));
        planner.on(Input::Wake, t0 + ms(700));
        planner.on(Input::Finished(Outcome::Failed), t0 + ms(800));
        assert_eq!(
            planner.next_wake(),
            t0 + TIMING.full_rescan_interval,
            "no retry loop"
        );
        planner.on(Input::Work(Work::Files(files(&["b"]))), t0 + ms(900));
        assert_eq!(
            planner.on(Input::Wake, t0 + ms(1400)),
            [verify(true, true, &["b"])]
        );
    }

    #[test]
    fn a_deferred_first_verification_starts_whole_once_its_delay_passed() {
        let t0 = Instant::now();
        let mut planner = Planner::new(TIMING, t0);
        assert_eq!(
            planner.on(Input::Wake, t0),
            [Action::Watch, verify(true, true, &[])]
        );
        planner.on(Input::Watched(true), t0);
        assert_eq!(
            planner.on(Input::Finished(Outcome::Deferred(ms(20_000))), t0 + ms(5)),
            []
        );
        assert_eq!(planner.next_wake(), t0 + ms(20_005));
        // Events meanwhile are folded into the full verification, not started on their own.
        planner.on(Input::Work(Work::Files(files(&["a"]))), t0 + ms(100));
        assert_eq!(planner.on(Input::Wake, t0 + ms(10_000)), []);
        assert_eq!(
            planner.on(Input::Wake, t0 + ms(20_005)),
            [verify(true, true, &["a"])]
        );
    }

    #[test]
    fn a_trusted_restart_rescans_an_interval_after_the_recorded_hash() {
        let t0 = Instant::now();
        let mut planner = settled(t0);
        let hours = |n: u64| Duration::from_secs(n * 3600);
        planner.on(Input::LastFullHash(hours(20)), t0);
        assert_eq!(planner.next_wake(), t0 + hours(4));
        assert_eq!(planner.on(Input::Wake, t0 + hours(4) - ms(1)), []);
        assert_eq!(
            planner.on(Input::Wake, t0 + hours(4)),
            [verify(true, false, &[])]
        );
        // A record older than the interval: the rescan is due at once.
        let mut planner = settled(t0);
        assert_eq!(
            planner.on(Input::LastFullHash(hours(30)), t0),
            [verify(true, false, &[])]
        );
    }
}
