//! The readiness loop's decisions as a pure function of what the controller has seen and when:
//! whether the node must be read first, whether the conditions are written (a change, or the
//! heartbeat, counted from the node's own heartbeat time when the agent starts, so that a restart
//! writes nothing the node already shows), where the startup taint should be, and how long to wait
//! before the next round (the interval, or a jittered doubling back-off after an API error). `controller.rs` only talks to the API
//! server; every rule here is tested on made-up instants.

use std::time::{Duration, Instant};

use super::settings::TaintMode;
use crate::api::Backoff;

pub struct Planner {
    interval: Duration,
    heartbeat: Duration,
    /// None: no startup taint is configured.
    taint_mode: Option<TaintMode>,
    /// The node's copy of our conditions is known (read or written since the last error).
    node_known: bool,
    last_write: Option<Instant>,
    /// Whether the node had our taint when last seen; None: not seen since the last error.
    taint_present: Option<bool>,
    taint_removed_once: bool,
    backoff: Backoff,
}

impl Planner {
    pub fn new(interval: Duration, heartbeat: Duration, taint_mode: Option<TaintMode>) -> Planner {
        Planner {
            interval,
            heartbeat,
            taint_mode,
            node_known: false,
            last_write: None,
            taint_present: None,
            taint_removed_once: false,
            backoff: Backoff::default(),
        }
    }

    /// The node must be read before the round can decide: after start, after an error, or while
    /// the taint's presence is unknown.
    pub fn needs_read(&self) -> bool {
        !self.node_known || (self.taint_mode.is_some() && self.taint_present.is_none())
    }

    /// The node as read or as a write answered it: our conditions and whether it has our taint.
    pub fn saw_node(&mut self, taint_present: Option<bool>) {
        self.node_known = true;
        self.taint_present = taint_present;
    }

    /// Whether the conditions are written this round: a gate changed, or the heartbeat is due.
    pub fn write_conditions(&self, changed: bool, now: Instant) -> bool {
        changed || self.last_write.is_none_or(|at| now >= at + self.heartbeat)
    }

    pub fn wrote_conditions(&mut self, now: Instant) {
        self.last_write = Some(now);
    }

    /// At the first read of the node: our conditions are all there and their oldest heartbeat
    /// was `age` ago. The next heartbeat is due a heartbeat after that one, not at start: a
    /// restarted agent (a rollout) writes only what changed.
    pub fn node_heartbeat(&mut self, age: Duration, now: Instant) {
        if self.last_write.is_none() {
            self.last_write = Some(now.checked_sub(age).unwrap_or(now));
        }
    }

    /// Where the taint should be, when that is not where it was last seen. Bootstrap-only: off
    /// once, the first time every gate passes, never back. Continuous: on exactly while a gate
    /// fails.
    pub fn taint_wanted(&self, all_ok: bool) -> Option<bool> {
        let want = match self.taint_mode? {
            TaintMode::BootstrapOnly if self.taint_removed_once || !all_ok => return None,
            TaintMode::BootstrapOnly => false,
            TaintMode::Continuous => !all_ok,
        };
        (self.taint_present != Some(want)).then_some(want)
    }

    pub fn taint_set(&mut self, present: bool) {
        self.taint_present = Some(present);
        if !present {
            self.taint_removed_once = true;
        }
    }

    /// The wait before the next round: the interval after a round that synced; after an error,
    /// the [`Backoff`]'s (`draw` in [0, 1) places it within its step), and the node is read again
    /// (it may have moved on).
    pub fn round_done(&mut self, synced: bool, draw: f64) -> Duration {
        if synced {
            self.backoff.succeeded();
            return self.interval;
        }
        self.node_known = false;
        self.backoff.failed(draw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(10);
    const HEARTBEAT: Duration = Duration::from_secs(300);

    #[test]
    fn the_node_is_read_at_start_after_an_error_and_while_the_taint_is_unknown() {
        let mut planner = Planner::new(INTERVAL, HEARTBEAT, Some(TaintMode::BootstrapOnly));
        assert!(planner.needs_read());
        planner.saw_node(None);
        assert!(planner.needs_read(), "taint presence unknown");
        planner.saw_node(Some(true));
        assert!(!planner.needs_read());
        planner.round_done(false, 0.0);
        assert!(planner.needs_read(), "after an error");
        let mut untainted = Planner::new(INTERVAL, HEARTBEAT, None);
        untainted.saw_node(None);
        assert!(!untainted.needs_read(), "no taint to know about");
    }

    #[test]
    fn conditions_are_written_on_a_change_or_when_the_heartbeat_is_due() {
        let t0 = Instant::now();
        let mut planner = Planner::new(INTERVAL, HEARTBEAT, None);
        assert!(planner.write_conditions(false, t0), "never written");
        planner.wrote_conditions(t0);
        assert!(!planner.write_conditions(false, t0 + INTERVAL));
        assert!(planner.write_conditions(true, t0 + INTERVAL));
        assert!(!planner.write_conditions(false, t0 + HEARTBEAT - Duration::from_millis(1)));
        assert!(planner.write_conditions(false, t0 + HEARTBEAT));
    }

    #[test]
    fn bootstrap_only_takes_the_taint_off_once_and_never_puts_it_back() {
        let mut planner = Planner::new(INTERVAL, HEARTBEAT, Some(TaintMode::BootstrapOnly));
        planner.saw_node(Some(true));
        assert_eq!(planner.taint_wanted(false), None, "held while a gate fails");
        assert_eq!(planner.taint_wanted(true), Some(false));
        planner.taint_set(false);
        assert_eq!(planner.taint_wanted(true), None);
        assert_eq!(
            planner.taint_wanted(false),
            None,
            "a later failure: never back"
        );
        // Someone puts it back: bootstrap-only leaves it.
        planner.saw_node(Some(true));
        assert_eq!(planner.taint_wanted(true), None);
    }

    #[test]
    fn continuous_mode_holds_the_taint_exactly_while_a_gate_fails() {
        let mut planner = Planner::new(INTERVAL, HEARTBEAT, Some(TaintMode::Continuous));
        planner.saw_node(Some(true));
        assert_eq!(planner.taint_wanted(false), None, "already there");
        assert_eq!(planner.taint_wanted(true), Some(false));
        planner.taint_set(false);
        assert_eq!(planner.taint_wanted(false), Some(true));
        planner.taint_set(true);
        // Removed by someone else while a gate fails: put back.
        planner.saw_node(Some(false));
        assert_eq!(planner.taint_wanted(false), Some(true));
        assert_eq!(
            Planner::new(INTERVAL, HEARTBEAT, None).taint_wanted(false),
            None,
            "no taint configured"
        );
    }

    #[test]
    fn errors_back_off_doubling_to_a_minute_and_a_sync_resets_it() {
        let mut planner = Planner::new(INTERVAL, HEARTBEAT, None);
        let waits: Vec<u64> = (0..8)
            .map(|_| planner.round_done(false, 0.0).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(planner.round_done(true, 0.0), INTERVAL);
        assert_eq!(
            planner.round_done(false, 0.5),
            Duration::from_millis(750),
            "jittered within its step"
        );
    }

    #[test]
    fn a_restart_writes_nothing_before_the_nodes_own_heartbeat_is_due() {
        let t0 = Instant::now() + HEARTBEAT;
        let mut planner = Planner::new(INTERVAL, HEARTBEAT, None);
        planner.node_heartbeat(Duration::from_secs(200), t0);
        assert!(!planner.write_conditions(false, t0));
        assert!(!planner.write_conditions(false, t0 + Duration::from_secs(99)));
        assert!(planner.write_conditions(false, t0 + Duration::from_secs(100)));
        assert!(planner.write_conditions(true, t0), "a change: at once");
        let mut stale = Planner::new(INTERVAL, HEARTBEAT, None);
        stale.node_heartbeat(HEARTBEAT * 3, t0);
        assert!(stale.write_conditions(false, t0), "older than a heartbeat");
    }
}
