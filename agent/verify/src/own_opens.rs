//! The verifier's own opens of files, kept so that whoever watches the same files with inotify can
//! tell the agent's reads from everyone else's exactly, with no new privilege: inotify's IN_OPEN
//! names no process, but each open of a regular file raises exactly one (an `O_PATH` look raises
//! none), so an open this process announced before making it is one IN_OPEN to take back, and any
//! other IN_OPEN of that file is another process's. Files are named by device and inode, which is
//! what an event's path resolves to whichever link (a Hugging Face snapshot's, a blob's) was
//! opened. Process-wide, as the opens are: every `Root` of the process announces into it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A file by device and inode.
pub type FileId = (u64, u64);

/// An announced open nobody took back within this long is forgotten: nothing watches that file (a
/// `verify` command, a cache whose watch failed), and the ledger must not grow for it.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(60);

/// Announced opens kept before the forgotten ones are first swept.
const SWEEP_ABOVE: usize = 4096;

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger {
    pending: None,
    count: 0,
    sweep_at: SWEEP_ABOVE,
});

/// Announced opens not yet taken back, oldest first, per file.
struct Ledger {
    pending: Option<HashMap<FileId, VecDeque<Instant>>>,
    count: usize,
    /// The count at which the next sweep runs: twice what a sweep left, so that a verification
    /// opening more files than that within a minute (nothing claims a `verify` command's
    /// announcements) sweeps now and then, not at every open.
    sweep_at: usize,
}

impl Ledger {
    fn expect(&mut self, file: FileId, now: Instant) {
        let pending = self.pending.get_or_insert_with(HashMap::new);
        if self.count >= self.sweep_at {
            pending.retain(|_, opens| {
                opens.retain(|at| now.saturating_duration_since(*at) < FORGOTTEN_AFTER);
                !opens.is_empty()
            });
            self.count = pending.values().map(VecDeque::len).sum();
            self.sweep_at = SWEEP_ABOVE.max(2 * self.count);
        }
        pending.entry(file).or_default().push_back(now);
        self.count += 1;
    }

    fn take_back(&mut self, file: FileId, newest: bool) -> bool {
        let Some(opens) = self.pending.as_mut().and_then(|p| p.get_mut(&file)) else {
            return false;
        };
        let taken = match newest {
            true => opens.pop_back(),
            false => opens.pop_front(),
        };
        if opens.is_empty() {
            self.pending.as_mut().map(|p| p.remove(&file));
        }
        self.count -= usize::from(taken.is_some());
        taken.is_some()
    }
}

fn ledger() -> std::sync::MutexGuard<'static, Ledger> {
    LEDGER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Announces an open of `file` this process is about to make: before the open, so that its
/// IN_OPEN can never be read before it is announced.
pub fn expect(file: FileId) {
    ledger().expect(file, Instant::now());
}

/// The announced open of `file` did not happen (it failed, or found another file there).
pub fn cancel(file: FileId) {
    ledger().take_back(file, true);
}

/// An IN_OPEN of `file` was seen: true when it was this process's own (announced and not yet
/// taken back), which it then is.
pub fn claim(file: FileId) -> bool {
    ledger().take_back(file, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each announced open is taken back once, by one claim; a cancelled one by none. Files are
    /// made-up inode numbers no real file of the test process shares.
    #[test]
    fn each_own_open_is_claimed_once_and_others_are_not() {
        let shard = (u64::MAX, 1);
        expect(shard);
        expect(shard);
        assert!(claim(shard));
        assert!(claim(shard));
        assert!(!claim(shard), "a third open is another process's");
        expect(shard);
        cancel(shard);
        assert!(!claim(shard), "a cancelled open raises no event");
        assert!(!claim((u64::MAX, 2)), "never announced");
    }

    #[test]
    fn opens_nobody_claims_are_forgotten() {
        let mut ledger = Ledger {
            pending: None,
            count: 0,
            sweep_at: SWEEP_ABOVE,
        };
        let t0 = Instant::now();
        for inode in 0..SWEEP_ABOVE as u64 {
            ledger.expect((7, inode), t0);
        }
        ledger.expect((7, u64::MAX), t0 + FORGOTTEN_AFTER);
        assert_eq!(ledger.count, 1, "the old ones swept");
        // Announcements all fresh: a sweep keeps them, and the next waits for twice as many.
        for inode in 0..SWEEP_ABOVE as u64 {
            ledger.expect((8, inode), t0 + FORGOTTEN_AFTER);
        }
        assert_eq!(ledger.sweep_at, 2 * SWEEP_ABOVE);
        assert!(!ledger.take_back((7, 0), false));
        assert!(ledger.take_back((7, u64::MAX), false));
    }
}
