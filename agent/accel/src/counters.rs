//! Keeps exported sysfs counters monotonic. A driver resets a counter when something writes to it
//! (the Neuron driver) or when it is reloaded (any); Prometheus would read a drop as a counter
//! reset anyway, but `rate()` over a window with a reset and a following rise is wrong by the
//! amount before it. So each counter is exported as `offset + raw`, the offset growing by the last
//! raw value at each reset, and the resets themselves are counted, per kind of path.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// The offset is wider than the raw value: a counter that resets near 2^64 must not wrap.
pub struct MonotonicCounters<K> {
    seen: HashMap<K, (u64, u128)>,
    resets: BTreeMap<&'static str, u64>,
}

impl<K> Default for MonotonicCounters<K> {
    fn default() -> Self {
        MonotonicCounters {
            seen: HashMap::new(),
            resets: BTreeMap::new(),
        }
    }
}

impl<K: Hash + Eq> MonotonicCounters<K> {
    /// The value to export for a raw reading of `key`, a counter of the kind of path `kind`.
    pub fn observe(&mut self, key: K, kind: &'static str, raw: u64) -> f64 {
        let (last, offset) = self.seen.entry(key).or_insert((raw, 0));
        if raw < *last {
            *offset = offset.saturating_add(u128::from(*last));
            *self.resets.entry(kind).or_default() += 1;
        }
        *last = raw;
        offset.saturating_add(u128::from(raw)) as f64
    }

    /// Resets seen so far, per kind of path.
    pub fn resets(&self) -> &BTreeMap<&'static str, u64> {
        &self.resets
    }
}

/// Sums the rises of values that are not counters (the firmware's ECC counts): a fall lowers the
/// baseline and is never counted, so a count that moves between kinds or is repaired adds nothing.
#[derive(Default)]
pub struct Rises<K: Ord> {
    seen: BTreeMap<K, (u64, u64)>,
}

impl<K: Ord> Rises<K> {
    /// The rises of `key` since it was first seen, after this reading.
    pub fn observe(&mut self, key: K, value: u64) -> u64 {
        let (last, rises) = self.seen.entry(key).or_insert((value, 0));
        *rises += value.saturating_sub(*last);
        *last = value;
        *rises
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_never_takes_the_counter_backwards_and_is_counted() {
        let mut counters = MonotonicCounters::default();
        let key = || (0, Some(1), "success".to_string());
        assert_eq!(counters.observe(key(), "status", 100), 100.0);
        assert_eq!(counters.observe(key(), "status", 150), 150.0);
        assert_eq!(counters.observe(key(), "status", 0), 150.0, "reset to 0");
        assert_eq!(counters.observe(key(), "status", 7), 157.0);
        assert_eq!(
            counters.observe((1, Some(1), "success".into()), "status", 5),
            5.0,
            "other keys unaffected"
        );
        assert_eq!(counters.resets()["status"], 1);
    }

    #[test]
    fn rises_count_only_what_went_up_after_the_first_reading() {
        let mut rises = Rises::default();
        assert_eq!(rises.observe(0, 5), 0, "history before the first reading");
        assert_eq!(rises.observe(0, 6), 1);
        assert_eq!(rises.observe(0, 2), 1, "a fall is no event");
        assert_eq!(rises.observe(0, 4), 3);
        assert_eq!(rises.observe(1, 0), 0, "keys are apart");
    }

    #[test]
    fn a_reset_from_the_top_of_the_range_does_not_wrap() {
        let mut counters = MonotonicCounters::default();
        let key = || (0, None::<u32>, "mem_ecc_corrected".to_string());
        assert_eq!(
            counters.observe(key(), "hardware", u64::MAX),
            u64::MAX as f64
        );
        let after = counters.observe(key(), "hardware", 10);
        assert!(after >= u64::MAX as f64, "went backwards to {after}");
        assert_eq!(after, u64::MAX as f64 + 10.0);
    }
}
