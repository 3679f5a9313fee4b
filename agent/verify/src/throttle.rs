//! `verify.max_bytes_per_second`: one read rate shared by every hashing thread of every model, for
//! caches on network file systems (EFS, FSx, NFS) where a full re-read costs money and bandwidth.
//!
//! Each read books its bytes on one schedule (the generic cell rate algorithm): the schedule's end
//! moves on by `bytes / rate` per read, a reader that finds the end more than [`SLACK`] ahead of
//! the clock sleeps until it is within it. Time nobody read in is not saved up, so after an idle
//! hour the next verification still starts at the rate, not with an hour's burst.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far reads may run ahead of the rate before a reader sleeps: enough that a 64 KiB read at
/// 100 MiB/s (0.6 ms) does not sleep each time, short enough that no burst matters to a filer.
pub const SLACK: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub struct Throttle {
    bytes_per_second: u64,
    /// When everything booked so far has been read at the rate.
    booked_until: Mutex<Option<Instant>>,
}

impl Throttle {
    /// `bytes_per_second` is at least 1 (config bounds it to 1 MiB/s and more).
    pub fn new(bytes_per_second: u64) -> Throttle {
        Throttle {
            bytes_per_second: bytes_per_second.max(1),
            booked_until: Mutex::new(None),
        }
    }

    /// Books `bytes` just read at `now`; returns how long the reader must wait before reading on.
    pub fn book(&self, bytes: u64, now: Instant) -> Duration {
        let mut booked = self.booked_until.lock().unwrap_or_else(|p| p.into_inner());
        let from = booked.map_or(now, |until| until.max(now));
        let until = from + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
        *booked = Some(until);
        until.saturating_duration_since(now + SLACK)
    }

    /// Books `bytes` and sleeps as long as that asks; returns the time slept.
    pub fn pace(&self, bytes: u64) -> Duration {
        let wait = self.book(bytes, Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const READ: u64 = 64 << 10;

    /// Readers that each read, then wait what the throttle says, on a clock that only moves when
    /// they wait; returns how long `total` bytes took.
    fn read_on_virtual_time(throttle: &Throttle, readers: usize, total: u64) -> Duration {
        let start = Instant::now();
        let mut clocks = vec![start; readers];
        let mut read = 0;
        let mut reader = 0;
        while read < total {
            let wait = throttle.book(READ, clocks[reader]);
            clocks[reader] += wait;
            read += READ;
            reader = (reader + 1) % readers;
        }
        clocks.iter().max().unwrap().duration_since(start)
    }

    #[test]
    fn readers_together_keep_to_the_rate_within_the_slack() {
        for readers in [1, 2, 8] {
            let throttle = Throttle::new(10 * MIB);
            let took = read_on_virtual_time(&throttle, readers, 100 * MIB);
            let at_rate = Duration::from_secs(10);
            assert!(
                took + SLACK + Duration::from_millis(10) >= at_rate
                    && took <= at_rate + Duration::from_millis(1),
                "{readers} readers: 100 MiB at 10 MiB/s took {took:?}"
            );
        }
    }

    #[test]
    fn reads_within_the_slack_do_not_wait() {
        let throttle = Throttle::new(100 * MIB);
        let now = Instant::now();
        // 50 ms at 100 MiB/s is 5 MiB: 80 reads of 64 KiB.
        let waits: Vec<Duration> = (0..80).map(|_| throttle.book(READ, now)).collect();
        assert!(waits.iter().all(Duration::is_zero), "{waits:?}");
        assert!(!throttle.book(READ, now).is_zero(), "the 81st read waits");
    }

    #[test]
    fn idle_time_is_not_saved_up_for_a_burst() {
        let throttle = Throttle::new(10 * MIB);
        let start = Instant::now();
        read_on_virtual_time(&throttle, 1, 10 * MIB);
        let an_hour_later = start + Duration::from_secs(3600);
        let mut free = 0;
        while throttle.book(READ, an_hour_later).is_zero() {
            free += READ;
        }
        // Only the slack's worth (0.5 MiB at 10 MiB/s), and the read that crossed it.
        assert!(free <= MIB / 2, "{free} bytes read without waiting");
    }
}
