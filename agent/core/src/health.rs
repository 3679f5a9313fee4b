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
/// Kubernetes reasons are), a message naming the device and the evidence, and the XID behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
    /// The GPU XID that caused the problem or came with it, where there is one: the repair engines
    /// decide by it (docs/readiness.md, "Repair by the engines clusters run").
    pub xid: Option<XidCause>,
    /// The devices the problem is pinned to, as its report's [`Held::device`] names them (GPU
    /// UUIDs, Neuron device indexes): the pods holding one share it. Empty: a verdict on the node
    /// (a count mismatch, NVML not answering), which no pod's gate takes (docs/readiness.md).
    pub devices: Vec<String>,
}

/// An XID behind a [`Problem`]: one that holds the GPU by itself, or one that held it only by
/// repeating past `readiness.xid_thresholds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XidCause {
    pub xid: u64,
    pub repeated: bool,
}

impl Problem {
    pub fn new(reason: &str, message: String) -> Problem {
        Problem {
            reason: reason.to_string(),
            message,
            xid: None,
            devices: Vec::new(),
        }
    }

    /// The problem pinned to `device` too.
    pub fn on(mut self, device: &str) -> Problem {
        self.devices.push(device.to_string());
        self
    }

    /// Whether the problem is pinned to `device`.
    pub fn concerns(&self, device: &str) -> bool {
        self.devices.iter().any(|d| d == device)
    }

    /// The problem with the XID that caused it or came with it; none leaves it as it is.
    pub fn with_xid(self, xid: Option<u64>) -> Problem {
        Problem {
            xid: xid.map(|xid| XidCause {
                xid,
                repeated: false,
            }),
            ..self
        }
    }

    /// The problem of an XID that repeated past its threshold.
    pub fn with_repeated_xid(self, xid: u64) -> Problem {
        Problem {
            xid: Some(XidCause {
                xid,
                repeated: true,
            }),
            ..self
        }
    }
}

/// Which kind of device a report counts, for the gate's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Gpu,
    Neuron,
    /// RDMA devices (EFA, InfiniBand): the network fabric, judged in a condition of its own.
    Fabric,
}

/// What one collector knows of its devices' health now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub kind: DeviceKind,
    /// Devices the collector monitors.
    pub devices: usize,
    /// Empty: every device fit.
    pub problems: Vec<Problem>,
    /// The faults that hold a device, by device id, for the node to remember ([`FromNode`]).
    pub held: HeldFaults,
    /// The devices each pod holds, as the collector resolves the ids the kubelet gave it: what
    /// each pod's own gate is decided by.
    pub holdings: Holdings,
}

/// A pod, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// One device a pod holds, resolved from the id the kubelet gave it: a GPU from its UUID, a MIG
/// device or a time-sliced replica from the GPU it is part of, a Neuron core from its device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The device whose problems the pod shares ([`Problem::devices`]).
    pub device: String,
    /// The device as the verdicts name it: `GPU 1 (GPU-…, 00000000:4E:00.0)`, `MIG device MIG-…
    /// of GPU 1 (…)`, `Neuron device 3`.
    pub name: String,
    /// Whether the collector lists the device: one it does not (fell off the bus before the agent
    /// read it, or an id no collector knows) is held but cannot be judged.
    pub listed: bool,
}

/// What each pod holds of one collector's devices.
pub type Holdings = BTreeMap<PodRef, Vec<Held>>;

/// Records that `holder`'s pod holds `held`, once however many ways it holds it (two replicas of
/// one GPU, two cores of one device).
pub fn hold(holdings: &mut Holdings, holder: &crate::assignments::Assignment, held: Held) {
    let pod = PodRef {
        namespace: holder.namespace.clone(),
        name: holder.pod.clone(),
    };
    let devices = holdings.entry(pod).or_default();
    if !devices.contains(&held) {
        devices.push(held);
    }
}

impl Report {
    pub fn new(kind: DeviceKind) -> Report {
        Report {
            kind,
            devices: 0,
            problems: Vec::new(),
            held: HeldFaults::new(),
            holdings: Holdings::new(),
        }
    }
}

/// What the agent learns from its Node object, handed to every source: the faults a previous agent
/// held on this boot (read back from the condition it wrote), taken as seen when this agent first
/// read the node (`since`); the instant before which an operator cleared every held fault; and the
/// accelerators the node's instance type has, as its labels say.
#[derive(Clone, Debug, Default)]
pub struct FromNode {
    pub since: Option<Instant>,
    pub faults: HeldFaults,
    pub cleared_before: Option<Instant>,
    pub expected: ExpectedDevices,
}

/// The label Karpenter's AWS provider puts on a node with the instance type's GPU count (EC2's
/// `GpuInfo`), and the one with its Neuron device count (`NeuronInfo`): aws/karpenter-provider-aws
/// `pkg/apis/v1/labels.go` and `pkg/providers/instancetype/types.go`.
pub const GPU_COUNT_LABEL: &str = "karpenter.k8s.aws/instance-gpu-count";
pub const ACCELERATOR_COUNT_LABEL: &str = "karpenter.k8s.aws/instance-accelerator-count";

/// How many accelerators the node's instance type has; None where no label says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpectedDevices {
    pub gpus: Option<u32>,
    pub neuron_devices: Option<u32>,
}

impl ExpectedDevices {
    /// From the node's labels; Err names a label whose value is not a count (it is then ignored).
    pub fn of(labels: Option<&BTreeMap<String, String>>) -> (ExpectedDevices, Vec<String>) {
        let mut trouble = Vec::new();
        let mut count = |key: &str| {
            let value = labels?.get(key)?;
            match value.parse::<u32>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    trouble.push(format!(
                        "the node's label {key}={value:?} is not a device count"
                    ));
                    None
                }
            }
        };
        let expected = ExpectedDevices {
            gpus: count(GPU_COUNT_LABEL),
            neuron_devices: count(ACCELERATOR_COUNT_LABEL),
        };
        (expected, trouble)
    }
}

impl FromNode {
    /// Whether a fault seen `at` still counts after the operator's clearing.
    pub fn outlives_clearing(&self, at: Instant) -> bool {
        self.cleared_before.is_none_or(|cleared| at > cleared)
    }
}

/// The accelerator collectors' reports as the readiness controller last took them, for the pods'
/// own gates: None until its first round, so that no pod's gate is decided on nothing.
pub type LatestReports = crate::shared::Shared<Option<Vec<Report>>>;

/// A collector whose devices' health the readiness gate combines.
pub trait HealthSource: Send + Sync {
    /// Which devices it reports on: a fabric source feeds a condition of its own.
    fn kind(&self) -> DeviceKind;

    /// The report as of `now`, with what the node remembers.
    fn report(&mut self, from_node: &FromNode, now: Instant) -> Report;

    /// Resolves when what the source reads from has changed since the call (a GPU's new reading,
    /// an XID), so that a fault is judged at once rather than at the next interval; a source read
    /// only when reported (sysfs) never resolves.
    fn changed(&self) -> futures_util::future::BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_types_counts_come_from_karpenters_labels() {
        let labels: BTreeMap<String, String> = [
            (GPU_COUNT_LABEL.to_string(), "8".to_string()),
            (
                "node.kubernetes.io/instance-type".to_string(),
                "p5.48xlarge".to_string(),
            ),
        ]
        .into();
        let (expected, trouble) = ExpectedDevices::of(Some(&labels));
        assert_eq!(
            expected,
            ExpectedDevices {
                gpus: Some(8),
                neuron_devices: None
            }
        );
        assert!(trouble.is_empty());
        assert_eq!(ExpectedDevices::of(None).0, ExpectedDevices::default());
        let bad: BTreeMap<String, String> =
            [(ACCELERATOR_COUNT_LABEL.to_string(), "sixteen".to_string())].into();
        let (expected, trouble) = ExpectedDevices::of(Some(&bad));
        assert_eq!(expected.neuron_devices, None, "ignored, never guessed");
        assert!(trouble[0].contains(ACCELERATOR_COUNT_LABEL), "{trouble:?}");
    }
}
