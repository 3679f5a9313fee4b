//! Live NeuronCore utilisation from the tensor engine's hardware cycle counters
//! (`stats/tensor_engine/pe_cntrs`), the one per-core busy signal sysfs updates while a runtime
//! runs: the execution counters and `nc_time_in_use` only move when a runtime process exits
//! (`neuron_ds.c:155-164`).
//!
//! Utilisation over the interval between two reads = busy cycles (matmul + weight load) / all
//! cycles (busy + idle), summed over the physical cores of a logical core. Pure: the collector
//! feeds it readings, it keeps the previous ones.

use std::collections::HashMap;

use super::cores::LogicalCore;
use super::sysfs::PeCycles;

#[derive(Default)]
pub struct Utilization {
    /// Last reading per (device, physical core).
    last: HashMap<(u32, u32), PeCycles>,
    /// Last ratio per global logical core, kept while no cycle has elapsed.
    ratio: HashMap<u32, f64>,
}

impl Utilization {
    /// The logical core's utilisation since the previous call, given this read's cycles of each
    /// physical core of `device`. None on the first read, when a physical core has no counters,
    /// or when a counter went backwards (a driver reload): the reading becomes the new baseline.
    pub fn observe(
        &mut self,
        device: u32,
        core: &LogicalCore,
        cycles_of: impl Fn(u32) -> Option<PeCycles>,
    ) -> Option<f64> {
        let mut busy = 0u128;
        let mut all = 0u128;
        let mut complete = true;
        for &physical in &core.physical {
            let Some(now) = cycles_of(physical) else {
                complete = false;
                continue;
            };
            match self.last.insert((device, physical), now) {
                Some(before) => match delta(before, now) {
                    Some((b, a)) => {
                        busy += b;
                        all += a;
                    }
                    None => complete = false,
                },
                None => complete = false,
            }
        }
        if !complete {
            self.ratio.remove(&core.global);
            return None;
        }
        if all == 0 {
            return self.ratio.get(&core.global).copied();
        }
        let ratio = (busy as f64 / all as f64).clamp(0.0, 1.0);
        self.ratio.insert(core.global, ratio);
        Some(ratio)
    }
}

/// (busy, all) cycles between two readings; None when any counter went backwards.
fn delta(before: PeCycles, now: PeCycles) -> Option<(u128, u128)> {
    let matmul = now.matmul.checked_sub(before.matmul)?;
    let weight_load = now.weight_load.checked_sub(before.weight_load)?;
    let idle = now.idle.checked_sub(before.idle)?;
    let busy = u128::from(matmul) + u128::from(weight_load);
    Some((busy, busy + u128::from(idle)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycles(matmul: u64, weight_load: u64, idle: u64) -> PeCycles {
        PeCycles {
            matmul,
            weight_load,
            idle,
        }
    }

    #[test]
    fn a_logical_core_sums_its_physical_cores_between_reads() {
        let mut u = Utilization::default();
        let pair = LogicalCore {
            global: 0,
            physical: vec![4, 5],
        };
        let first = [(4, cycles(0, 0, 0)), (5, cycles(100, 0, 100))];
        let at = |readings: [(u32, PeCycles); 2]| {
            move |p: u32| readings.iter().find(|r| r.0 == p).map(|r| r.1)
        };
        assert_eq!(u.observe(0, &pair, at(first)), None, "no interval yet");
        // Core 4: 60 busy of 100; core 5: 0 busy of 100 → 60 of 200.
        let second = [(4, cycles(50, 10, 40)), (5, cycles(100, 0, 200))];
        assert_eq!(u.observe(0, &pair, at(second)), Some(0.3));
        assert_eq!(
            u.observe(0, &pair, at(second)),
            Some(0.3),
            "no cycle elapsed: the last ratio stands"
        );
        // A driver reload zeroes the counters: no ratio, new baseline.
        let reloaded = [(4, cycles(1, 0, 1)), (5, cycles(0, 0, 2))];
        assert_eq!(u.observe(0, &pair, at(reloaded)), None);
        let after = [(4, cycles(101, 0, 1)), (5, cycles(0, 0, 102))];
        assert_eq!(u.observe(0, &pair, at(after)), Some(0.5));
        // A core without counters (driver before 2.23) has no utilisation.
        assert_eq!(u.observe(0, &pair, |_| None), None);
    }
}
