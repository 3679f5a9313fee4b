//! What the kernel log has said on this boot, kept as the facts the verdicts need: the last time
//! each GPU logged each XID, each GPU that fell off the bus, each Neuron device's hardware-error
//! classes. Bounded by the node's devices and the drivers' codes, not by the log's length: a line
//! seen a million times is one entry with a count.

use std::collections::BTreeMap;
use std::time::Instant;

use super::parse::{KernelEvent, PciAddress};

/// More distinct keys than any node has devices times codes: a log full of made-up numbers stops
/// adding entries here (and is counted as such) instead of growing the agent.
pub const MAX_KEYS: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// When it was last logged, on the agent's clock (before the agent started, for a line of
    /// the boot's history).
    pub last: Instant,
    pub count: u64,
    /// Of `count`, the lines logged before the agent started ([`LogFacts::agent_started`]): those
    /// no NVML event of this agent's can have delivered.
    pub before_start: u64,
    /// The process the driver named in its latest line, if any.
    pub process: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFacts {
    /// By the GPU's slot (the XID line names no function) and XID.
    pub xids: BTreeMap<(PciAddress, u64), Logged>,
    pub fallen_off_bus: BTreeMap<PciAddress, Logged>,
    pub sxids: BTreeMap<u32, u64>,
    /// By device index (None: the line named none) and class.
    pub neuron_errors: BTreeMap<(Option<u32>, String), Logged>,
    /// Events not kept because [`MAX_KEYS`] was reached.
    pub dropped: u64,
    /// This boot's history has been read (or cannot be: a missing journal must not hold the node
    /// forever). Until then no verdict may be a premature True: a fault from before the start may
    /// be in the part not read yet.
    pub history_read: bool,
    /// When this agent started: a line logged before it is one NVML's events cannot have
    /// delivered to it. None: every line counts as logged while the agent ran.
    pub agent_started: Option<Instant>,
}

impl LogFacts {
    pub fn new(agent_started: Instant) -> LogFacts {
        LogFacts {
            agent_started: Some(agent_started),
            ..LogFacts::default()
        }
    }

    /// The problem a verdict carries while the history is still being read.
    pub fn pending(&self) -> Option<mlnode_core::health::Problem> {
        (!self.history_read).then(|| {
            mlnode_core::health::Problem::new(
                "KernelLogPending",
                "this boot's kernel log is still being read: a fault logged before the agent started may be in it".to_string(),
            )
        })
    }
}

impl LogFacts {
    pub fn apply(&mut self, event: KernelEvent, at: Instant) {
        let full = self.keys() >= MAX_KEYS;
        let before_start = self.agent_started.is_some_and(|started| at < started);
        let note = |map_has: bool, dropped: &mut u64| {
            if full && !map_has {
                *dropped += 1;
                false
            } else {
                true
            }
        };
        match event {
            KernelEvent::Xid {
                gpu, xid, process, ..
            } => {
                let key = (slot(gpu), xid);
                if note(self.xids.contains_key(&key), &mut self.dropped) {
                    let logged = self.xids.entry(key).or_insert_with(|| fresh(at));
                    logged.before_start += u64::from(before_start);
                    see(logged, at, process);
                }
            }
            KernelEvent::FallenOffBus { gpu } => {
                let key = slot(gpu);
                if note(self.fallen_off_bus.contains_key(&key), &mut self.dropped) {
                    see(
                        self.fallen_off_bus.entry(key).or_insert_with(|| fresh(at)),
                        at,
                        None,
                    );
                }
            }
            KernelEvent::Sxid { sxid, .. } => {
                if note(self.sxids.contains_key(&sxid), &mut self.dropped) {
                    *self.sxids.entry(sxid).or_default() += 1;
                }
            }
            KernelEvent::NeuronHardwareError { class, device, .. } => {
                let key = (device, class);
                if note(self.neuron_errors.contains_key(&key), &mut self.dropped) {
                    see(
                        self.neuron_errors.entry(key).or_insert_with(|| fresh(at)),
                        at,
                        None,
                    );
                }
            }
        }
    }

    fn keys(&self) -> usize {
        self.xids.len() + self.fallen_off_bus.len() + self.sxids.len() + self.neuron_errors.len()
    }

    /// The XIDs logged for the GPU at `gpu` (NVML's address), with when each was last logged.
    pub fn xids_of(&self, gpu: &PciAddress) -> impl Iterator<Item = (u64, &Logged)> + '_ {
        let gpu = *gpu;
        self.xids
            .iter()
            .filter(move |((slot, _), _)| slot.same_slot(&gpu))
            .map(|((_, xid), logged)| (*xid, logged))
    }

    pub fn fell_off_bus(&self, gpu: &PciAddress) -> Option<&Logged> {
        self.fallen_off_bus
            .iter()
            .find(|(slot, _)| slot.same_slot(gpu))
            .map(|(_, logged)| logged)
    }
}

fn slot(gpu: PciAddress) -> PciAddress {
    PciAddress {
        function: None,
        ..gpu
    }
}

fn fresh(at: Instant) -> Logged {
    Logged {
        last: at,
        count: 0,
        before_start: 0,
        process: None,
    }
}

/// Order-free: the history's files are read in parallel, so the process kept is that of the
/// latest line naming one, whichever is read last.
fn see(logged: &mut Logged, at: Instant, process: Option<String>) {
    logged.count += 1;
    if process.is_some() && at >= logged.last {
        logged.process = process;
    }
    logged.last = logged.last.max(at);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_log::parse::Parser;
    use std::time::Duration;

    #[test]
    fn repeats_are_one_entry_with_a_count_and_the_latest_time() {
        let t0 = Instant::now();
        let mut facts = LogFacts::default();
        let mut parser = Parser::default();
        for (i, line) in [
            "NVRM: Xid (PCI:0000:5a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
            "NVRM: GPU 0000:5a:00.0: GPU has fallen off the bus.",
            "NVRM: Xid (PCI:0000:5a:00): 79, GPU has fallen off the bus.",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal",
            "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=2 nc-id=0 action=TERMINATE_INSTANCE",
        ]
        .iter()
        .enumerate()
        {
            facts.apply(
                parser.line(line).unwrap(),
                t0 + Duration::from_secs(i as u64),
            );
        }
        let nvml = PciAddress::from_nvml("00000000:5A:00.0").unwrap();
        let xids: Vec<(u64, u64)> = facts.xids_of(&nvml).map(|(x, l)| (x, l.count)).collect();
        assert_eq!(xids, [(79, 2)]);
        let logged = facts.xids_of(&nvml).next().unwrap().1;
        assert_eq!(logged.last, t0 + Duration::from_secs(2));
        assert_eq!(
            logged.process.as_deref(),
            Some("python3"),
            "the last line that named one"
        );
        assert!(facts.fell_off_bus(&nvml).is_some());
        assert_eq!(facts.sxids[&12028], 1);
        assert_eq!(
            facts.neuron_errors[&(Some(2), "HBM_UNCORRECTABLE_ERROR".to_string())].count,
            1
        );
    }

    #[test]
    fn a_flood_of_distinct_codes_stops_at_the_bound() {
        let mut facts = LogFacts::default();
        let mut parser = Parser::default();
        for sxid in 0..(MAX_KEYS as u32 + 10) {
            let line = format!("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): {sxid}, made up");
            facts.apply(parser.line(&line).unwrap(), Instant::now());
        }
        assert_eq!(facts.sxids.len(), MAX_KEYS);
        assert_eq!(facts.dropped, 10);
        let line = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 7, seen before";
        facts.apply(parser.line(line).unwrap(), Instant::now());
        assert_eq!(facts.sxids[&7], 2, "a known key still counts");
    }
}
