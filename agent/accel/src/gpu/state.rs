//! What the agent knows about its GPUs between scrapes: the latest readings and the counters
//! built from them. Plain data, updated by the NVML threads and read by the collector.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::{GpuIdentity, GpuReading, CLOCK_EVENT_REASONS};

#[derive(Clone, Debug, Default)]
pub struct GpuEntry {
    pub identity: Option<GpuIdentity>,
    /// None while the GPU is failing (or before its first read): no reading is exported as if
    /// current.
    pub reading: Option<GpuReading>,
    /// Why NVML cannot read the GPU now, if it cannot.
    pub failure: Option<GpuFailure>,
    /// Seconds each clock event reason was seen active, in [`CLOCK_EVENT_REASONS`] order.
    pub reason_seconds: [f64; CLOCK_EVENT_REASONS.len()],
    /// Critical XID events seen since the agent started, per XID.
    pub xids: BTreeMap<u64, u64>,
    /// When each XID was last seen: a recovery action read after it speaks for it.
    pub xid_last_seen: BTreeMap<u64, Instant>,
    /// The latest sightings, oldest first, for the windowed count (at most [`XID_SIGHTINGS_KEPT`]).
    pub xid_sightings: VecDeque<(Instant, u64)>,
    /// When the current reading was taken.
    pub read_at: Option<Instant>,
    /// Those of them NVML placed in a MIG GPU instance, per (GPU instance id, XID).
    pub instance_xids: BTreeMap<(u32, u64), u64>,
    pub last_xid: Option<u64>,
    /// The NVLink links seen active since the agent started reading this GPU: one of them
    /// inactive now is a link lost.
    pub nvlink_seen_active: BTreeSet<u32>,
    /// The last NVLink recovery-error total read, and when it last rose.
    pub nvlink_recovery: Option<u64>,
    pub nvlink_recovery_rose: Option<Instant>,
}

/// Sightings kept per GPU for `DCGM_EXP_XID_ERRORS_COUNT`: a GPU in an XID storm costs bounded
/// memory, and its count saturates here rather than growing without end.
pub const XID_SIGHTINGS_KEPT: usize = 1024;

#[derive(Clone, Debug, Default)]
pub struct GpuState {
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2` (12040: CUDA 12.4), where the driver says.
    pub cuda_driver_version: Option<i32>,
    /// The GPUs (by index) whose critical XIDs NVML's event set delivers: for the others, no XID
    /// reaching the agent says nothing, and no count of 0 is claimed for them.
    pub xids_watched: std::collections::BTreeSet<u32>,
    pub gpus: BTreeMap<u32, GpuEntry>,
    /// Why NVML itself stopped answering (it cannot even count the GPUs), while it does.
    pub failing: Option<String>,
    /// When the sampler last finished reading every GPU (or started, before its first round).
    pub last_round: Option<Instant>,
    /// How old the readings may get before they are no longer current: an NVML call on a dying GPU
    /// can block for seconds or for good, and the sampler with it.
    pub stall_after: Duration,
    /// The NVIDIA GPUs on the PCI bus, as sysfs lists them at the last round; None before the first
    /// scan, or while the PCI directory cannot be listed.
    pub pci: Option<crate::pci::BusScan>,
    /// `nvml.expected_gpus`.
    pub expected_gpus: Option<u32>,
    /// `nvml.xid_count_window`: how far back `DCGM_EXP_XID_ERRORS_COUNT` counts.
    pub xid_count_window: Duration,
    /// `nvml.nvlink_error_window`: how long a rise in NVLink recovery errors is a problem.
    pub nvlink_error_window: Duration,
    /// Per-process readings that failed, by reason, since the agent started.
    pub attribution_errors: BTreeMap<&'static str, u64>,
    /// While the agent has let go of NVML so GPUs can be reset: which, and why. No reading is
    /// current then.
    pub released: Option<Released>,
    /// Times NVML was taken back after a release, by how (`reset`, `timeout`).
    pub reattached: BTreeMap<&'static str, u64>,
    /// Times NVML was initialised again because the GPUs bound to the driver changed.
    pub reinits: u64,
}

/// What the agent let go of NVML for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// `GPU-… (0000:18:00.0)`, each GPU the driver asked to reset.
    pub targets: String,
    /// Their UUIDs: their series are absent until NVML is taken back.
    pub uuids: Vec<String>,
    /// The gate's reason meanwhile: the driver's verdict (`GPUResetRequired`, ...) or
    /// `GPUsReleased` (the annotation) or `MIGReconfiguring` (the MIG manager).
    pub reason: &'static str,
    /// Who asked, in words.
    pub why: String,
    /// When NVML is taken back, in words.
    pub until: &'static str,
    /// `nvml.release_timeout`; None once the release lasts until the agent restarts.
    pub timeout: Option<Duration>,
}

/// Why NVML cannot read a GPU: the error classes of `nvml.h` that describe the device rather than
/// one call, each a state an alert or the `AcceleratorHealthy` gate can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuFailure {
    /// NVML_ERROR_GPU_IS_LOST (15): fell off the bus.
    Lost,
    /// NVML_ERROR_RESET_REQUIRED (16): the usual state after an XID 48/79-class failure.
    ResetRequired,
    /// NVML_ERROR_IRQ_ISSUE (11): the driver cannot talk to the GPU's interrupts.
    IrqIssue,
    /// NVML_ERROR_NO_PERMISSION (4): the agent may not read it (a device node it cannot open).
    NoPermission,
    /// NVML_ERROR_UNKNOWN (999), or any other error getting the GPU's handle.
    Unknown,
}

impl GpuFailure {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuFailure::Lost => "lost",
            GpuFailure::ResetRequired => "reset_required",
            GpuFailure::IrqIssue => "irq_issue",
            GpuFailure::NoPermission => "no_permission",
            GpuFailure::Unknown => "unknown",
        }
    }
}

/// The outcome of reading one GPU.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceRead {
    Read {
        identity: GpuIdentity,
        /// Boxed: a failure is a byte, a reading hundreds.
        reading: Box<GpuReading>,
    },
    Failed(GpuFailure),
}

impl GpuEntry {
    fn note_nvlink(&mut self, nvlink: &super::NvLinkReading, at: Instant) {
        self.nvlink_seen_active.extend(
            nvlink
                .links
                .iter()
                .filter(|(_, active)| *active)
                .map(|(l, _)| *l),
        );
        if let Some(total) = nvlink.errors[super::NVLINK_RECOVERY] {
            // A lower total is the driver reloaded (counted from 0 again), not a rise.
            if self.nvlink_recovery.is_some_and(|last| total > last) {
                self.nvlink_recovery_rose = Some(at);
            }
            self.nvlink_recovery = Some(total);
        }
    }

    /// The links seen active before that NVML reports inactive now.
    pub fn nvlinks_lost(&self) -> Vec<u32> {
        let Some(nvlink) = self.reading.as_ref().and_then(|r| r.nvlink.as_ref()) else {
            return Vec::new();
        };
        nvlink
            .links
            .iter()
            .filter(|(link, active)| !active && self.nvlink_seen_active.contains(link))
            .map(|(link, _)| *link)
            .collect()
    }

    /// The XIDs seen in the `window` before `now`, per XID: dcgm-exporter's windowed count (its
    /// expcollector.go counts DCGM's XID values since now minus `--xid-count-window-size`).
    pub fn xids_within(&self, now: Instant, window: Duration) -> BTreeMap<u64, u64> {
        let mut counts = BTreeMap::new();
        let from = now.checked_sub(window);
        for (at, xid) in &self.xid_sightings {
            if from.is_none_or(|from| *at >= from) {
                *counts.entry(*xid).or_default() += 1;
            }
        }
        counts
    }
}

impl GpuState {
    /// Applies one read of GPU `index`, taken `at`, `elapsed` seconds after the previous one: each
    /// clock event reason active now is counted as having held for that interval.
    pub fn apply(&mut self, index: u32, read: DeviceRead, elapsed: f64, at: Instant) {
        let entry = self.gpus.entry(index).or_default();
        match read {
            DeviceRead::Read { identity, reading } => {
                if let Some(mask) = reading.clock_event_reasons {
                    for (seconds, (bit, _)) in
                        entry.reason_seconds.iter_mut().zip(CLOCK_EVENT_REASONS)
                    {
                        if mask & bit != 0 {
                            *seconds += elapsed;
                        }
                    }
                }
                for reason in reading.attribution_errors() {
                    *self.attribution_errors.entry(reason).or_default() += 1;
                }
                let entry = self.gpus.entry(index).or_default();
                if entry
                    .identity
                    .as_ref()
                    .is_some_and(|known| known.uuid != identity.uuid)
                {
                    // Another GPU at this index: what was seen of the old one says nothing.
                    entry.nvlink_seen_active.clear();
                    entry.nvlink_recovery = None;
                    entry.nvlink_recovery_rose = None;
                }
                if let Some(nvlink) = &reading.nvlink {
                    entry.note_nvlink(nvlink, at);
                }
                entry.identity = Some(identity);
                entry.reading = Some(*reading);
                entry.read_at = Some(at);
                entry.failure = None;
            }
            DeviceRead::Failed(failure) => {
                entry.reading = None;
                entry.failure = Some(failure);
            }
        }
    }

    /// The agent let go of NVML: no reading is current until it takes it back. Identities and
    /// counters stay.
    pub fn release(&mut self, released: Released) {
        for entry in self.gpus.values_mut() {
            entry.reading = None;
        }
        self.released = Some(released);
    }

    /// NVML was initialised (again) and lists `listed` (index, UUID where it could be read): each GPU
    /// keeps what was known of it under its new index, found by UUID; a GPU no longer listed is
    /// forgotten, so its series are gone.
    pub fn renumber(&mut self, listed: &[(u32, Option<String>)]) {
        let mut by_uuid: BTreeMap<String, GpuEntry> = std::mem::take(&mut self.gpus)
            .into_values()
            .filter_map(|e| Some((e.identity.as_ref()?.uuid.clone(), e)))
            .collect();
        // A GPU not seen before gets its entry from its first read, as at start.
        for (index, uuid) in listed {
            if let Some(known) = uuid.as_ref().and_then(|uuid| by_uuid.remove(uuid)) {
                self.gpus.insert(*index, known);
            }
        }
    }

    /// NVML stopped answering: no reading is current any more. Identities and counters stay, so
    /// the GPUs are still named and their history kept.
    pub fn fail(&mut self, reason: String) {
        for entry in self.gpus.values_mut() {
            entry.reading = None;
        }
        self.failing = Some(reason);
    }

    /// How long ago the sampler last finished a round, when that is longer than `stall_after`:
    /// its readings are then not current.
    pub fn stalled_for(&self, now: Instant) -> Option<Duration> {
        let age = now.saturating_duration_since(self.last_round?);
        (age > self.stall_after).then_some(age)
    }

    /// An XID on GPU `index` `at`, in MIG GPU instance `gpu_instance` when NVML says which.
    pub fn record_xid(&mut self, index: u32, xid: u64, gpu_instance: Option<u32>, at: Instant) {
        let entry = self.gpus.entry(index).or_default();
        *entry.xids.entry(xid).or_default() += 1;
        entry.xid_last_seen.insert(xid, at);
        if entry.xid_sightings.len() == XID_SIGHTINGS_KEPT {
            entry.xid_sightings.pop_front();
        }
        entry.xid_sightings.push_back((at, xid));
        if let Some(instance) = gpu_instance {
            *entry.instance_xids.entry((instance, xid)).or_default() += 1;
        }
        entry.last_xid = Some(xid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> GpuIdentity {
        GpuIdentity {
            index: 0,
            uuid: "GPU-1".into(),
            pci_bus_id: "00000000:07:00.0".into(),
            model_name: "H100".into(),
            ..Default::default()
        }
    }

    fn reasons(mask: u64) -> DeviceRead {
        DeviceRead::Read {
            identity: identity(),
            reading: Box::new(GpuReading {
                clock_event_reasons: Some(mask),
                ..GpuReading::default()
            }),
        }
    }

    fn read_of(uuid: &str) -> DeviceRead {
        DeviceRead::Read {
            identity: GpuIdentity {
                uuid: uuid.into(),
                ..identity()
            },
            reading: Box::new(GpuReading::default()),
        }
    }

    /// NVML initialised again after GPU 0 was unbound: GPU-2 is index 0 now and keeps its XIDs;
    /// GPU-1, not listed, is gone.
    #[test]
    fn a_new_nvml_keeps_each_gpus_history_under_its_new_index() {
        let mut state = GpuState::default();
        state.apply(0, read_of("GPU-1"), 1.0, Instant::now());
        state.apply(1, read_of("GPU-2"), 1.0, Instant::now());
        state.record_xid(1, 13, None, Instant::now());
        state.renumber(&[(0, Some("GPU-2".into()))]);
        assert_eq!(state.gpus.len(), 1);
        let entry = &state.gpus[&0];
        assert_eq!(entry.identity.as_ref().unwrap().uuid, "GPU-2");
        assert_eq!(entry.xids[&13], 1);
    }

    #[test]
    fn reason_seconds_accumulate_only_while_active() {
        let mut state = GpuState::default();
        state.apply(0, reasons(0x4 | 0x8), 1.0, Instant::now()); // sw_power_cap, hw_slowdown
        state.apply(0, reasons(0x4), 2.0, Instant::now());
        state.apply(0, reasons(0), 5.0, Instant::now());
        let seconds = state.gpus[&0].reason_seconds;
        assert_eq!(seconds[2], 3.0, "sw_power_cap held for 1 + 2 s");
        assert_eq!(seconds[3], 1.0, "hw_slowdown held for 1 s");
        assert_eq!(seconds.iter().sum::<f64>(), 4.0);
    }

    #[test]
    fn a_lost_gpu_keeps_its_identity_and_counters() {
        let mut state = GpuState::default();
        state.apply(0, reasons(0x4), 1.0, Instant::now());
        state.record_xid(0, 79, None, Instant::now());
        state.apply(0, DeviceRead::Failed(GpuFailure::Lost), 1.0, Instant::now());
        let entry = &state.gpus[&0];
        assert!(entry.failure == Some(GpuFailure::Lost) && entry.reading.is_none());
        assert_eq!(entry.identity.as_ref().unwrap().uuid, "GPU-1");
        assert_eq!(entry.xids[&79], 1);
        assert_eq!(entry.reason_seconds[2], 1.0);
    }

    #[test]
    fn a_failing_nvml_leaves_no_reading_current() {
        let mut state = GpuState::default();
        state.apply(0, reasons(0x4), 1.0, Instant::now());
        state.record_xid(0, 79, None, Instant::now());
        state.fail("NVML: Unknown Error".into());
        let entry = &state.gpus[&0];
        assert!(entry.reading.is_none() && entry.identity.is_some());
        assert_eq!(entry.xids[&79], 1);
        assert_eq!(state.failing.as_deref(), Some("NVML: Unknown Error"));
    }

    #[test]
    fn readings_stop_being_current_when_the_sampler_stalls() {
        let start = Instant::now();
        let mut state = GpuState {
            stall_after: Duration::from_secs(3),
            ..GpuState::default()
        };
        assert_eq!(state.stalled_for(start), None, "no sampler yet");
        state.last_round = Some(start);
        assert_eq!(state.stalled_for(start + Duration::from_secs(3)), None);
        assert_eq!(
            state.stalled_for(start + Duration::from_secs(4)),
            Some(Duration::from_secs(4))
        );
    }

    #[test]
    fn xids_count_per_value_and_remember_the_last() {
        let mut state = GpuState::default();
        for xid in [79, 48, 79] {
            state.record_xid(3, xid, None, Instant::now());
        }
        state.record_xid(3, 31, Some(7), Instant::now());
        let entry = &state.gpus[&3];
        assert_eq!(entry.xids[&79], 2);
        assert_eq!(entry.xids[&48], 1);
        assert_eq!(entry.xids[&31], 1, "an instance's XID is the GPU's too");
        assert_eq!(entry.instance_xids[&(7, 31)], 1);
        assert_eq!(entry.instance_xids.len(), 1);
        assert_eq!(entry.last_xid, Some(31));
    }

    /// Only the sightings in the window count; the oldest go first once a storm fills the bound.
    #[test]
    fn the_windowed_count_keeps_to_its_window_and_its_bound() {
        let t0 = Instant::now();
        let window = Duration::from_secs(300);
        let mut state = GpuState::default();
        state.record_xid(0, 79, None, t0);
        state.record_xid(0, 79, None, t0 + Duration::from_secs(200));
        state.record_xid(0, 48, None, t0 + Duration::from_secs(250));
        let entry = &state.gpus[&0];
        assert_eq!(
            entry.xids_within(t0 + Duration::from_secs(299), window),
            [(48, 1), (79, 2)].into()
        );
        assert_eq!(
            entry.xids_within(t0 + Duration::from_secs(301), window),
            [(48, 1), (79, 1)].into(),
            "the first 79 left the window"
        );
        assert!(entry
            .xids_within(t0 + Duration::from_secs(600), window)
            .is_empty());
        for i in 0..XID_SIGHTINGS_KEPT as u64 + 10 {
            state.record_xid(1, 13, None, t0 + Duration::from_millis(i));
        }
        let storm = &state.gpus[&1];
        assert_eq!(storm.xid_sightings.len(), XID_SIGHTINGS_KEPT);
        assert_eq!(
            storm.xids_within(t0 + Duration::from_secs(2), window)[&13],
            XID_SIGHTINGS_KEPT as u64
        );
        assert_eq!(
            storm.xids[&13],
            XID_SIGHTINGS_KEPT as u64 + 10,
            "the total keeps every one"
        );
    }
}
