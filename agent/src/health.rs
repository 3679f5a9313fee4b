//! The contract between the accelerator collectors and the readiness gate, as node-problem-detector
//! has it between problem sources and its condition manager: each collector reports its devices'
//! health as plain facts (a [`Report`]: how many devices, what is wrong with which, what must be
//! remembered), and `readiness` only combines the reports into `AcceleratorHealthy`. How a GPU's
//! XIDs or a Neuron device's ECC counts become a problem is the collector's own knowledge; the gate
//! never reads NVML state or sysfs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Held fault codes (XIDs) per device id (a GPU UUID): what a restarted agent must not forget.
pub type HeldFaults = BTreeMap<String, BTreeSet<u64>>;

/// One reason a device (or its collector) is not fit to serve: the gate's reason (CamelCase, as
/// Kubernetes reasons are) and a message naming the device and the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
}

impl Problem {
    pub fn new(reason: &str, message: String) -> Problem {
        Problem {
            reason: reason.to_string(),
            message,
        }
    }
}

/// Which kind of device a report counts, for the gate's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    Neuron,
}

/// What one collector knows of its devices' health now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub kind: DeviceKind,
    /// Devices the collector monitors.
    pub devices: usize,
    /// Empty: every device fit.
    pub problems: Vec<Problem>,
    /// The faults that hold a device, by device id, for the node to remember ([`Carried`]).
    pub held: HeldFaults,
}

impl Report {
    pub fn new(kind: DeviceKind) -> Report {
        Report {
            kind,
            devices: 0,
            problems: Vec::new(),
            held: HeldFaults::new(),
        }
    }
}

/// What the node remembers for the agent, handed to every source: the faults a previous agent
/// held on this boot (read back from the condition it wrote), taken as seen when this agent first
/// read the node (`since`); and the instant before which an operator cleared every held fault.
#[derive(Clone, Debug, Default)]
pub struct Carried {
    pub since: Option<Instant>,
    pub faults: HeldFaults,
    pub cleared_before: Option<Instant>,
}

impl Carried {
    /// Whether a fault seen `at` still counts after the operator's clearing.
    pub fn outlives_clearing(&self, at: Instant) -> bool {
        self.cleared_before.is_none_or(|cleared| at > cleared)
    }
}

/// A collector whose devices' health the readiness gate combines.
pub trait HealthSource: Send + Sync {
    /// The report as of `now`, with what the node remembers.
    fn report(&mut self, carried: &Carried, now: Instant) -> Report;
}
