//! When the agent lets go of NVML, and when it takes it back: pure decisions over what the sampler
//! read and what the PCI bus shows, tested on made-up instants. The NVML threads act on them.
//!
//! A process holding NVML keeps the GPUs' device files open, and `nvidia-smi --gpu-reset` (the GPU
//! Operator's and NVSentinel's reset flows with it) refuses a GPU another process holds
//! (NVIDIA/NVSentinel#1691). So when the driver asks for a reset, the agent closes every handle and
//! shuts NVML down, and watches the reset through sysfs alone: the GPU leaving the driver (unbound,
//! or gone from the bus) and coming back. It never waits longer than `nvml.release_timeout`.
//! And NVML lists the GPUs it found at init: when the set bound to the driver changes (a GPU
//! unbound for a reset or given to vfio, then bound again), NVML is initialised again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::state::DeviceRead;
use super::{GpuIdentity, GpuReading};

/// `nvmlDeviceGpuRecoveryAction_t` values that ask for a GPU reset: GPU_RESET 1, DRAIN_AND_RESET 4.
pub const RESET_ACTIONS: [u32; 2] = [1, 4];

/// The node annotation through which an operator or a repair engine (a reset janitor) asks the
/// agent to let go of every GPU; any value, which the log and the gate repeat. Removing it hands
/// NVML back.
pub const RELEASE_ANNOTATION: &str = "mlnode.dev/release-gpus";

/// Who asked for a release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The driver's recovery action for the targets.
    Driver(u32),
    /// [`RELEASE_ANNOTATION`], with its value.
    Operator(String),
}

/// One GPU the agent let go of NVML for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub uuid: String,
    /// As sysfs names it: `0000:18:00.0`.
    pub address: String,
}

/// The agent holds no NVML handle until the targets have been reset or the timeout passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub targets: Vec<Target>,
    pub cause: Cause,
    pub since: Instant,
    /// The targets seen off the driver since (unbound, or gone from the bus).
    away: BTreeSet<String>,
}

/// Why NVML is taken back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reattach {
    /// Every target left the driver and came back: the reset happened.
    Reset,
    /// The annotation that asked for it was removed.
    Removed,
    /// `nvml.release_timeout` passed first.
    TimedOut,
}

impl Reattach {
    /// The `after` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reattach::Reset => "reset",
            Reattach::Removed => "annotation_removed",
            Reattach::TimedOut => "timeout",
        }
    }
}

/// The GPUs this round read, with their readings (those NVML failed to read are left out).
fn read_gpus(reads: &[(u32, DeviceRead)]) -> impl Iterator<Item = (&GpuIdentity, &GpuReading)> {
    reads.iter().filter_map(|(_, read)| match read {
        DeviceRead::Read { identity, reading } => Some((identity, reading.as_ref())),
        DeviceRead::Failed(_) => None,
    })
}

fn asks_reset(reading: &GpuReading) -> Option<u32> {
    reading
        .recovery_action
        .filter(|a| RESET_ACTIONS.contains(a))
}

impl Target {
    fn of(identity: &GpuIdentity) -> Option<Target> {
        Some(Target {
            uuid: identity.uuid.clone(),
            address: crate::pci::sysfs_bus_id(&identity.pci_bus_id)?,
        })
    }
}

/// The GPUs this round's reads say the driver wants reset, leaving out those whose earlier release
/// timed out (`declined`) until their action changes; None when there is none.
pub fn wanted(
    reads: &[(u32, DeviceRead)],
    declined: &BTreeSet<String>,
    now: Instant,
) -> Option<Release> {
    let mut action = 0;
    let targets: Vec<Target> = read_gpus(reads)
        .filter(|(identity, _)| !declined.contains(&identity.uuid))
        .filter_map(|(identity, reading)| {
            action = asks_reset(reading)?;
            Target::of(identity)
        })
        .collect();
    (!targets.is_empty()).then(|| Release::new(targets, Cause::Driver(action), now))
}

/// Every GPU of this round's reads, released because [`RELEASE_ANNOTATION`] says `value`.
pub fn asked(reads: &[(u32, DeviceRead)], value: String, now: Instant) -> Release {
    let targets = read_gpus(reads)
        .filter_map(|(identity, _)| Target::of(identity))
        .collect();
    Release::new(targets, Cause::Operator(value), now)
}

/// The GPUs no longer asking for a reset leave `declined`: a later request is a new one.
pub fn forget_declined(reads: &[(u32, DeviceRead)], declined: &mut BTreeSet<String>) {
    for (identity, reading) in read_gpus(reads) {
        if asks_reset(reading).is_none() {
            declined.remove(&identity.uuid);
        }
    }
}

impl Release {
    fn new(targets: Vec<Target>, cause: Cause, now: Instant) -> Release {
        Release {
            targets,
            cause,
            since: now,
            away: BTreeSet::new(),
        }
    }

    /// What the bus shows now (`bound`: the NVIDIA GPUs bound to the driver; None: unreadable)
    /// and whether the annotation still asks (`asked`) say about the reset; Some once NVML should
    /// be taken back. A release the annotation asked for lasts while it does; the driver's, until
    /// its GPUs have left the driver and come back.
    pub fn observe(
        &mut self,
        bound: Option<&BTreeSet<String>>,
        asked: bool,
        now: Instant,
        timeout: Duration,
    ) -> Option<Reattach> {
        if matches!(self.cause, Cause::Operator(_)) {
            if !asked {
                return Some(Reattach::Removed);
            }
        } else if let Some(bound) = bound {
            for target in &self.targets {
                if !bound.contains(&target.address) {
                    self.away.insert(target.address.clone());
                }
            }
            let all_back = self
                .targets
                .iter()
                .all(|t| self.away.contains(&t.address) && bound.contains(&t.address));
            if all_back {
                return Some(Reattach::Reset);
            }
        }
        (now.saturating_duration_since(self.since) >= timeout).then_some(Reattach::TimedOut)
    }

    /// `GPU-…, 0000:18:00.0` for each target.
    pub fn named(&self) -> String {
        let names: Vec<String> = self
            .targets
            .iter()
            .map(|t| format!("{} ({})", t.uuid, t.address))
            .collect();
        names.join(", ")
    }
}

/// Whether the GPUs bound to the driver differ from those bound when NVML was initialised, so
/// NVML's list is stale. Unknown either side (sysfs unreadable): no.
pub fn gpus_changed(at_init: Option<&BTreeSet<String>>, now: Option<&BTreeSet<String>>) -> bool {
    matches!((at_init, now), (Some(before), Some(now)) if before != now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuIdentity, GpuReading};

    fn read(uuid: &str, bus: &str, action: Option<u32>) -> (u32, DeviceRead) {
        (
            0,
            DeviceRead::Read {
                identity: GpuIdentity {
                    index: 0,
                    uuid: uuid.into(),
                    pci_bus_id: bus.into(),
                    model_name: "NVIDIA H100 80GB HBM3".into(),
                },
                reading: Box::new(GpuReading {
                    recovery_action: action,
                    ..GpuReading::default()
                }),
            },
        )
    }

    fn set(addresses: &[&str]) -> BTreeSet<String> {
        addresses.iter().map(|a| a.to_string()).collect()
    }

    /// GPU_RESET and DRAIN_AND_RESET ask for a release, named by sysfs address; NONE, a reboot,
    /// and a GPU whose last release timed out do not, until its action changes.
    #[test]
    fn only_a_reset_the_driver_asks_for_releases_nvml() {
        let t0 = Instant::now();
        let mut declined = BTreeSet::new();
        let quiet = [
            read("GPU-a", "00000000:18:00.0", Some(0)),
            read("GPU-b", "00000000:2A:00.0", Some(2)),
        ];
        assert_eq!(wanted(&quiet, &declined, t0), None);
        let asking = [
            read("GPU-a", "00000000:18:00.0", Some(4)),
            read("GPU-b", "00000000:2A:00.0", None),
        ];
        let release = wanted(&asking, &declined, t0).unwrap();
        assert_eq!(release.cause, Cause::Driver(4));
        assert_eq!(release.named(), "GPU-a (0000:18:00.0)");
        declined.insert("GPU-a".to_string());
        assert_eq!(wanted(&asking, &declined, t0), None, "declined");
        forget_declined(&asking, &mut declined);
        assert!(declined.contains("GPU-a"), "still asking: still declined");
        forget_declined(&quiet, &mut declined);
        assert!(
            declined.is_empty(),
            "the action changed: a new request counts"
        );
    }

    /// Back only once the GPU left the driver and returned; a GPU that never left waits for the
    /// timeout; an unreadable bus decides nothing but the timeout.
    #[test]
    fn nvml_is_taken_back_after_the_gpu_leaves_and_returns_or_the_timeout() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(600);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut release = wanted(
            &[read("GPU-a", "00000000:18:00.0", Some(1))],
            &BTreeSet::new(),
            t0,
        )
        .unwrap();
        let both = set(&["0000:18:00.0", "0000:2a:00.0"]);
        assert_eq!(release.observe(Some(&both), false, at(5), timeout), None);
        assert_eq!(
            release.observe(Some(&set(&["0000:2a:00.0"])), false, at(10), timeout),
            None
        );
        assert_eq!(release.observe(None, false, at(12), timeout), None);
        assert_eq!(
            release.observe(Some(&both), false, at(15), timeout),
            Some(Reattach::Reset)
        );
        let mut stuck = wanted(
            &[read("GPU-a", "00000000:18:00.0", Some(1))],
            &BTreeSet::new(),
            t0,
        )
        .unwrap();
        assert_eq!(stuck.observe(Some(&both), false, at(599), timeout), None);
        assert_eq!(
            stuck.observe(Some(&both), false, at(600), timeout),
            Some(Reattach::TimedOut)
        );
        assert_eq!(
            stuck.observe(None, false, at(601), timeout),
            Some(Reattach::TimedOut)
        );
    }

    /// The annotation's release takes every GPU read and lasts while the annotation does, bus
    /// or not, up to the timeout.
    #[test]
    fn the_annotations_release_lasts_while_it_is_set() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(600);
        let reads = [
            read("GPU-a", "00000000:18:00.0", Some(0)),
            read("GPU-b", "00000000:2A:00.0", None),
        ];
        let mut release = asked(&reads, "janitor".into(), t0);
        assert_eq!(
            release.named(),
            "GPU-a (0000:18:00.0), GPU-b (0000:2a:00.0)"
        );
        let none = set(&[]);
        let both = set(&["0000:18:00.0", "0000:2a:00.0"]);
        assert_eq!(release.observe(Some(&none), true, t0, timeout), None);
        assert_eq!(
            release.observe(Some(&both), true, t0, timeout),
            None,
            "back on the bus: still asked"
        );
        assert_eq!(
            release.observe(Some(&both), false, t0, timeout),
            Some(Reattach::Removed)
        );
        let mut kept = asked(&reads, "janitor".into(), t0);
        assert_eq!(
            kept.observe(None, true, t0 + timeout, timeout),
            Some(Reattach::TimedOut)
        );
    }

    #[test]
    fn nvml_is_stale_only_when_the_bound_set_changes() {
        let before = set(&["0000:18:00.0", "0000:2a:00.0"]);
        assert!(!gpus_changed(Some(&before), Some(&before.clone())));
        assert!(gpus_changed(Some(&before), Some(&set(&["0000:18:00.0"]))));
        assert!(!gpus_changed(None, Some(&before)));
        assert!(!gpus_changed(Some(&before), None));
    }
}
