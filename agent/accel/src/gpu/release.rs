//! When the agent lets go of NVML, and when it takes it back: pure decisions over what the sampler
//! read and what the PCI bus shows, tested on made-up instants. The NVML threads act on them.
//!
//! A process holding NVML keeps the GPUs' device files open, and `nvidia-smi --gpu-reset` (the GPU
//! Operator's and NVSentinel's reset flows with it) refuses a GPU another process holds
//! (NVIDIA/NVSentinel#1691). So when the driver asks for a reset, the agent closes every handle and
//! shuts NVML down, and watches the reset through sysfs alone: the GPU leaving the driver (unbound,
//! or gone from the bus) and coming back. It never waits longer than `nvml.release_timeout`.
//! The same release holds while the GPU Operator's MIG manager changes the MIG layout: it resets
//! the GPUs to switch MIG mode and refuses to while another process holds them, as DataDog's
//! agent found (DataDog/datadog-agent#56118, which releases NVML for the same window).
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

/// The node label the GPU Operator's MIG manager keeps while it reconfigures (NVIDIA/mig-parted,
/// `deployments/gpu-operator/reconfigure-mig.sh`): `pending` from before it stops the GPU clients
/// until it is done, then `success` or `failed`; `rebooting` just before it reboots the node for a
/// MIG mode change the GPUs could not take without one.
pub const MIG_CONFIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";

/// What the node says of the agent's hold on NVML, as the agent's watch of its Node last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAsks {
    /// [`RELEASE_ANNOTATION`]'s value while set.
    pub annotation: Option<String>,
    /// [`MIG_CONFIG_STATE_LABEL`]'s value while set.
    pub mig_config_state: Option<String>,
}

impl NodeAsks {
    /// The MIG manager is at work: it set `pending` and has not finished.
    pub fn mig_pending(&self) -> bool {
        self.mig_config_state.as_deref() == Some("pending")
    }

    fn mig_rebooting(&self) -> bool {
        self.mig_config_state.as_deref() == Some("rebooting")
    }
}

/// Who asked for a release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The driver's recovery action for the targets.
    Driver(u32),
    /// [`RELEASE_ANNOTATION`], with its value.
    Operator(String),
    /// The MIG manager's reconfiguration ([`MIG_CONFIG_STATE_LABEL`] `pending`).
    MigManager,
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
    /// The MIG manager said it reboots the node: NVML stays released, past any timeout, until
    /// the agent starts again.
    pub until_restart: bool,
}

/// Why NVML is taken back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reattach {
    /// Every target left the driver and came back: the reset happened.
    Reset,
    /// The annotation that asked for it was removed.
    Removed,
    /// The MIG manager finished (`success` or `failed`, or the label removed).
    Reconfigured,
    /// `nvml.release_timeout` passed first.
    TimedOut,
}

impl Reattach {
    /// The `after` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reattach::Reset => "reset",
            Reattach::Removed => "annotation_removed",
            Reattach::Reconfigured => "mig_config_done",
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

/// Every GPU of this round's reads, released for what the node asks (the annotation first: an
/// operator's word; then the MIG manager's `pending`), leaving out a request whose earlier
/// release timed out (`declined`) until it goes; None when nothing is asked.
pub fn asked(
    reads: &[(u32, DeviceRead)],
    asks: &NodeAsks,
    declined: &DeclinedAsks,
    now: Instant,
) -> Option<Release> {
    let cause = match &asks.annotation {
        Some(value) if !declined.annotation => Cause::Operator(value.clone()),
        _ if asks.mig_pending() && !declined.mig => Cause::MigManager,
        _ => return None,
    };
    let targets = read_gpus(reads)
        .filter_map(|(identity, _)| Target::of(identity))
        .collect();
    Some(Release::new(targets, cause, now))
}

/// The node's requests whose release timed out: not repeated until the request goes (the
/// annotation removed, the MIG state no longer `pending`), so that a forgotten one does not
/// keep the GPUs unmonitored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeclinedAsks {
    pub annotation: bool,
    pub mig: bool,
}

impl DeclinedAsks {
    /// Forgets the requests `asks` no longer makes.
    pub fn forget_gone(&mut self, asks: &NodeAsks) {
        self.annotation &= asks.annotation.is_some();
        self.mig &= asks.mig_pending();
    }
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
            until_restart: false,
        }
    }

    /// What the bus shows now (`bound`: the NVIDIA GPUs bound to the driver; None: unreadable)
    /// and what the node asks (`asks`) say about the reset; Some once NVML should be taken back.
    /// A release the annotation asked for lasts while it does; the MIG manager's, while it is
    /// `pending`, and once it says `rebooting`, until the agent restarts (no timeout: the node
    /// goes down); the driver's, until its GPUs have left the driver and come back.
    pub fn observe(
        &mut self,
        bound: Option<&BTreeSet<String>>,
        asks: &NodeAsks,
        now: Instant,
        timeout: Duration,
    ) -> Option<Reattach> {
        match self.cause {
            Cause::Operator(_) if asks.annotation.is_none() => return Some(Reattach::Removed),
            Cause::Operator(_) => {}
            Cause::MigManager => {
                self.until_restart |= asks.mig_rebooting();
                if self.until_restart {
                    return None;
                }
                if !asks.mig_pending() {
                    return Some(Reattach::Reconfigured);
                }
            }
            Cause::Driver(_) => {
                if let Some(bound) = bound {
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
                    ..Default::default()
                },
                reading: Box::new(GpuReading {
                    recovery_action: action,
                    ..GpuReading::default()
                }),
            },
        )
    }

    fn quiet_node() -> NodeAsks {
        NodeAsks::default()
    }

    fn mig(state: &str) -> NodeAsks {
        NodeAsks {
            mig_config_state: Some(state.into()),
            ..NodeAsks::default()
        }
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
        assert_eq!(
            release.observe(Some(&both), &quiet_node(), at(5), timeout),
            None
        );
        assert_eq!(
            release.observe(
                Some(&set(&["0000:2a:00.0"])),
                &quiet_node(),
                at(10),
                timeout
            ),
            None
        );
        assert_eq!(release.observe(None, &quiet_node(), at(12), timeout), None);
        assert_eq!(
            release.observe(Some(&both), &quiet_node(), at(15), timeout),
            Some(Reattach::Reset)
        );
        let mut stuck = wanted(
            &[read("GPU-a", "00000000:18:00.0", Some(1))],
            &BTreeSet::new(),
            t0,
        )
        .unwrap();
        assert_eq!(
            stuck.observe(Some(&both), &quiet_node(), at(599), timeout),
            None
        );
        assert_eq!(
            stuck.observe(Some(&both), &quiet_node(), at(600), timeout),
            Some(Reattach::TimedOut)
        );
        assert_eq!(
            stuck.observe(None, &quiet_node(), at(601), timeout),
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
        let annotated = NodeAsks {
            annotation: Some("janitor".into()),
            ..NodeAsks::default()
        };
        let none_declined = DeclinedAsks::default();
        let mut release = asked(&reads, &annotated, &none_declined, t0).unwrap();
        assert_eq!(release.cause, Cause::Operator("janitor".into()));
        assert_eq!(
            release.named(),
            "GPU-a (0000:18:00.0), GPU-b (0000:2a:00.0)"
        );
        let none = set(&[]);
        let both = set(&["0000:18:00.0", "0000:2a:00.0"]);
        assert_eq!(release.observe(Some(&none), &annotated, t0, timeout), None);
        assert_eq!(
            release.observe(Some(&both), &annotated, t0, timeout),
            None,
            "back on the bus: still asked"
        );
        assert_eq!(
            release.observe(Some(&both), &quiet_node(), t0, timeout),
            Some(Reattach::Removed)
        );
        let mut kept = asked(&reads, &annotated, &none_declined, t0).unwrap();
        assert_eq!(
            kept.observe(None, &annotated, t0 + timeout, timeout),
            Some(Reattach::TimedOut)
        );
    }

    /// The MIG manager's states as reconfigure-mig.sh sets them: released while `pending`, taken
    /// back at `success` or `failed` (or the label removed), held past the timeout once it says
    /// `rebooting`; a `rebooting` left from before the agent started asks nothing.
    #[test]
    fn the_mig_managers_reconfiguration_releases_nvml_while_it_works() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(600);
        let reads = [read("GPU-a", "00000000:18:00.0", Some(0))];
        let declined = DeclinedAsks::default();
        for idle in ["success", "failed", "rebooting"] {
            assert_eq!(asked(&reads, &mig(idle), &declined, t0), None, "{idle}");
        }
        assert_eq!(asked(&reads, &quiet_node(), &declined, t0), None);
        for (done, after) in [
            (mig("success"), Reattach::Reconfigured),
            (mig("failed"), Reattach::Reconfigured),
            (quiet_node(), Reattach::Reconfigured),
        ] {
            let mut release = asked(&reads, &mig("pending"), &declined, t0).unwrap();
            assert_eq!(release.cause, Cause::MigManager);
            assert_eq!(release.observe(None, &mig("pending"), t0, timeout), None);
            assert_eq!(release.observe(None, &done, t0, timeout), Some(after));
        }
        let mut stuck = asked(&reads, &mig("pending"), &declined, t0).unwrap();
        assert_eq!(
            stuck.observe(None, &mig("pending"), t0 + timeout, timeout),
            Some(Reattach::TimedOut)
        );
        let mut rebooting = asked(&reads, &mig("pending"), &declined, t0).unwrap();
        assert_eq!(
            rebooting.observe(None, &mig("rebooting"), t0, timeout),
            None
        );
        assert!(rebooting.until_restart);
        for later in [mig("success"), quiet_node(), mig("pending")] {
            assert_eq!(
                rebooting.observe(None, &later, t0 + 10 * timeout, timeout),
                None,
                "until the agent restarts"
            );
        }
        // The annotation, an operator's word, comes first; a timed-out request waits until it goes.
        let both = NodeAsks {
            annotation: Some("janitor".into()),
            mig_config_state: Some("pending".into()),
        };
        let release = asked(&reads, &both, &declined, t0).unwrap();
        assert_eq!(release.cause, Cause::Operator("janitor".into()));
        let mut timed_out = DeclinedAsks {
            annotation: false,
            mig: true,
        };
        assert_eq!(asked(&reads, &mig("pending"), &timed_out, t0), None);
        timed_out.forget_gone(&mig("pending"));
        assert!(timed_out.mig, "still pending: still declined");
        timed_out.forget_gone(&mig("success"));
        assert_eq!(timed_out, DeclinedAsks::default());
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
