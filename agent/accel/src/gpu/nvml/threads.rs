//! The plain threads that run NVML off the async runtime. The NVML thread holds one session of
//! NVML at a time: it samples every GPU each `sample_interval` into [`GpuState`] (and the PCI bus
//! beside it) while an XID listener of the session blocks in `nvmlEventSetWait` for critical XID
//! events. A session ends when the driver asks for a GPU reset (every handle closed, NVML shut
//! down, the reset watched through sysfs: [`crate::gpu::release`]) or when the GPUs bound to the
//! driver change (NVML initialised again). Both stop at their next wake-up after [`Stop::stop`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};

use super::{symbol, NvmlSource, SinceLast};
use crate::gpu::health::RECOVERY_ACTIONS;
use crate::gpu::release::{
    asked as asked_release, forget_declined, gpus_changed, wanted, Cause, DeclinedAsks, NodeAsks,
    Reattach, Release, MIG_CONFIG_STATE_LABEL, RELEASE_ANNOTATION,
};
use crate::gpu::state::{DeviceRead, GpuFailure, GpuState, Released};
use mlnode_core::cgroup::{self, CgroupOwner};
use mlnode_core::metrics::{AgentMetrics, Subsystem};
use mlnode_core::shared::Shared;
use mlnode_core::trouble::Trouble;

/// How long one XID wait blocks before checking for shutdown.
const XID_WAIT_MS: u32 = 500;

/// Tells the NVML threads to stop, and wakes the sampler from its sleep.
#[derive(Default)]
pub struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    pub fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps up to `timeout`; true when stopped.
    fn wait(&self, timeout: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = self
            .wake
            .wait_timeout_while(guard, timeout, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

/// What the NVML thread needs beyond the first session: where to open NVML again, and for how
/// long to let go of it for a reset.
pub struct Reopen {
    pub library: PathBuf,
    /// What the node asks of the agent's hold on NVML ([`RELEASE_ANNOTATION`], the MIG manager's
    /// state), kept by the node watch; nothing without an API server.
    pub asked: Shared<NodeAsks>,
    /// `nvml.release_for_reset`.
    pub release_for_reset: bool,
    pub release_timeout: Duration,
}

/// Starts the NVML thread: sessions of NVML, each a sampler and an XID listener, one after the
/// other (a release for a reset or a changed set of GPUs ends one); it runs until `stop`.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    source: NvmlSource,
    reopen: Reopen,
    state: Shared<GpuState>,
    interval: Duration,
    pci_devices: PathBuf,
    proc_root: Option<PathBuf>,
    stop: Arc<Stop>,
    up: AgentMetrics,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let thread = std::thread::Builder::new()
        .name("nvml".into())
        .spawn(move || {
            let owner_of = proc_root.map(|root| move |pid| owner_of(&root, pid));
            let owner_of = owner_of.as_ref().map(|f| f as &super::OwnerOf);
            let context = Context {
                state,
                interval,
                pci_devices,
                owner_of,
                stop,
                up,
            };
            supervise(source, &reopen, &context)
        })?;
    Ok(vec![thread])
}

/// What every session shares.
struct Context<'a> {
    state: Shared<GpuState>,
    interval: Duration,
    pci_devices: PathBuf,
    owner_of: Option<&'a super::OwnerOf>,
    stop: Arc<Stop>,
    up: AgentMetrics,
}

/// Why a session of NVML ended.
enum Leave {
    Stopped,
    /// The GPUs bound to the driver changed: NVML's list is stale.
    Changed,
    /// The driver, or the annotation, asks to let go of these GPUs.
    Release(Release),
}

/// Releases not to repeat: the GPUs whose driver-asked release timed out (until their action
/// changes), and the node's requests' (until they go).
#[derive(Default)]
struct Declined {
    gpus: BTreeSet<String>,
    node: DeclinedAsks,
}

/// The driver the GPUs NVML lists are bound to.
const NVIDIA_DRIVER: &str = "nvidia";

fn supervise(first: NvmlSource, reopen: &Reopen, cx: &Context) {
    let mut next = Some(first);
    let mut declined = Declined::default();
    let mut pci_said = Trouble::default();
    loop {
        let source = match next.take() {
            Some(source) => source,
            None => match NvmlSource::open(&reopen.library) {
                Ok(source) => source,
                Err(reason) => {
                    cx.state.update(|state| {
                        if state.failing.is_none() {
                            tracing::error!(error = %reason, "NVML cannot be opened again; GPU readings are dropped until it can");
                        }
                        state.fail(reason);
                    });
                    cx.up.set_up(Subsystem::Nvml, false);
                    if cx.stop.wait(cx.interval) {
                        return;
                    }
                    continue;
                }
            },
        };
        // Before anything of the session records by index: the GPUs' history follows them.
        if let Ok(listed) = source.listed() {
            cx.state.update(|state| state.renumber(&listed));
        }
        let source = Arc::new(source);
        let session = Arc::new(Stop::default());
        let xids = {
            let (source, state, session) = (source.clone(), cx.state.clone(), session.clone());
            std::thread::Builder::new()
                .name("nvml-xid".into())
                .spawn(move || xid_loop(&source, &state, &session))
        };
        if let Err(e) = &xids {
            tracing::warn!(error = %e, "cannot start the XID listener; XID errors will not be counted");
        }
        let leave = sample_session(&source, cx, reopen, &mut declined, &mut pci_said);
        session.stop();
        if let Ok(xids) = xids {
            let _ = xids.join();
        }
        // The set was this session's, by its indexes: the next session registers its own.
        cx.state.update(|state| state.xids_watched.clear());
        // The last holder of the session lets go here: NVML shuts down, every device file closes.
        drop(source);
        match leave {
            Leave::Stopped => return,
            Leave::Changed => {
                cx.state.update(|state| state.reinits += 1);
                tracing::info!(
                    "the GPUs bound to the driver changed: NVML is initialised again to list them"
                );
            }
            Leave::Release(release) => {
                if !wait_for_reset(release, reopen, cx, &mut declined, &mut pci_said) {
                    return;
                }
            }
        }
    }
}

/// Holds no NVML handle until the GPUs have been reset (each left the driver and came back) or
/// `timeout` passed; false when stopped meanwhile. A release that timed out is not repeated for
/// the same GPUs until their action changes.
fn wait_for_reset(
    mut release: Release,
    reopen: &Reopen,
    cx: &Context,
    declined: &mut Declined,
    pci_said: &mut Trouble,
) -> bool {
    let timeout = reopen.release_timeout;
    let named = release.named();
    let uuids: Vec<String> = release.targets.iter().map(|t| t.uuid.clone()).collect();
    let released = match &release.cause {
        Cause::Driver(action) => {
            let (reason, words) = RECOVERY_ACTIONS.iter().find(|(v, ..)| v == action).map_or(
                ("GPUResetRequired", "a GPU reset"),
                |(_, _, reason, words)| (*reason, *words),
            );
            tracing::warn!(gpus = %named, action, "the driver asks for a GPU reset: every NVML handle is closed so the reset can proceed; GPU series are absent until NVML is taken back, once the GPU has left the driver and come back, or after nvml.release_timeout");
            Released {
                targets: named.clone(),
                uuids: uuids.clone(),
                reason,
                why: format!("the driver asks for {words}"),
                until: "once the GPU has left the driver and come back",
                timeout: Some(timeout),
            }
        }
        Cause::Operator(value) => {
            tracing::warn!(gpus = %named, annotation = RELEASE_ANNOTATION, value = %value, "the node asks to let go of the GPUs: every NVML handle is closed; GPU series are absent until the annotation is removed, or after nvml.release_timeout");
            Released {
                targets: named.clone(),
                uuids: uuids.clone(),
                reason: "GPUsReleased",
                why: format!(
                    "the node's {RELEASE_ANNOTATION} annotation ({value:?}) asks for a release"
                ),
                until: "once the annotation is removed",
                timeout: Some(timeout),
            }
        }
        Cause::MigManager => {
            tracing::warn!(gpus = %named, label = MIG_CONFIG_STATE_LABEL, "the GPU Operator's MIG manager is reconfiguring the GPUs: every NVML handle is closed so it can reset them; GPU series are absent until it is done, or after nvml.release_timeout");
            Released {
                targets: named.clone(),
                uuids: uuids.clone(),
                reason: "MIGReconfiguring",
                why: format!(
                    "the GPU Operator's MIG manager is changing the MIG layout ({MIG_CONFIG_STATE_LABEL}=pending)"
                ),
                until: "once it is done (the label leaves pending)",
                timeout: Some(timeout),
            }
        }
    };
    let mut said_until_restart = false;
    cx.state.update(|state| state.release(released));
    loop {
        if cx.stop.wait(cx.interval) {
            return false;
        }
        let pci = scan_pci(&cx.pci_devices, pci_said);
        let bound = pci.as_ref().map(|p| p.bound_to(NVIDIA_DRIVER));
        let asks = reopen.asked.get();
        let back = release.observe(bound.as_ref(), &asks, Instant::now(), timeout);
        if release.until_restart && !said_until_restart {
            said_until_restart = true;
            tracing::warn!(gpus = %named, label = MIG_CONFIG_STATE_LABEL, "the MIG manager reboots the node: NVML stays released until the agent starts again");
            cx.state.update(|state| {
                if let Some(released) = &mut state.released {
                    released.until = "when the agent starts again after the node's reboot";
                    released.timeout = None;
                }
            });
        }
        cx.state.update(|state| {
            state.pci = pci;
            // The thread is alive and keeping its word: not a stalled sampler.
            state.last_round = Some(Instant::now());
            if let Some(how) = back {
                state.released = None;
                *state.reattached.entry(how.as_str()).or_default() += 1;
            }
        });
        match back {
            None => {}
            Some(Reattach::Reset) => {
                tracing::info!(gpus = %named, "the GPUs left the driver and came back: NVML is taken back");
                return true;
            }
            Some(Reattach::Removed) => {
                tracing::info!(gpus = %named, annotation = RELEASE_ANNOTATION, "the annotation was removed: NVML is taken back");
                return true;
            }
            Some(Reattach::Reconfigured) => {
                tracing::info!(gpus = %named, label = MIG_CONFIG_STATE_LABEL, state = asks.mig_config_state.as_deref().unwrap_or("(removed)"), "the MIG manager is done: NVML is taken back");
                return true;
            }
            Some(Reattach::TimedOut) => {
                tracing::warn!(gpus = %named, timeout = ?timeout, "no reset seen within nvml.release_timeout: NVML is taken back, and not let go again for these GPUs until what asked for it changes");
                match release.cause {
                    Cause::Driver(_) => declined.gpus.extend(uuids),
                    Cause::Operator(_) => declined.node.annotation = true,
                    Cause::MigManager => declined.node.mig = true,
                }
                return true;
            }
        }
    }
}

/// Whose process `pid` is, from `<proc_root>/<pid>/cgroup` (the host's `/proc` with hostPID).
fn owner_of(proc_root: &Path, pid: u32) -> Result<CgroupOwner, &'static str> {
    let path = proc_root.join(pid.to_string()).join("cgroup");
    match std::fs::read_to_string(&path) {
        Ok(text) => cgroup::owner(&text).map_err(|t| t.as_str()),
        // Gone between NVML's list and this read (ESRCH from a /proc/<pid> being torn down).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(3) => {
            Err("process_exited")
        }
        Err(_) => Err("cgroup_unreadable"),
    }
}

/// Reads every GPU each interval until stopped, a release (the driver's reset, the annotation;
/// `declined` are not repeated), or a change in the GPUs bound to the driver.
fn sample_session(
    source: &NvmlSource,
    cx: &Context,
    reopen: &Reopen,
    declined: &mut Declined,
    pci_said: &mut Trouble,
) -> Leave {
    let state = &cx.state;
    state.update(|state| {
        state.driver_version = source.driver_version();
        state.cuda_driver_version = source.cuda_driver_version();
        state.last_round = Some(Instant::now());
    });
    let mut last = Instant::now();
    let mut since_last: BTreeMap<u32, SinceLast> = BTreeMap::new();
    let mut attribution_said = BTreeSet::new();
    // The GPUs bound to the driver when this NVML was initialised (its first round's scan).
    let mut at_init: Option<Option<BTreeSet<String>>> = None;
    loop {
        let elapsed = last.elapsed().as_secs_f64();
        last = Instant::now();
        match source.device_count() {
            Ok(count) => {
                let reads: Vec<(u32, DeviceRead)> = (0..count)
                    .filter_map(|i| {
                        let previous = since_last.entry(i).or_default();
                        source.read(i, previous, cx.owner_of).map(|r| (i, r))
                    })
                    .collect();
                let pci = scan_pci(&cx.pci_devices, pci_said);
                let bound = pci.as_ref().map(|p| p.bound_to(NVIDIA_DRIVER));
                let before = at_init.get_or_insert_with(|| bound.clone());
                if gpus_changed(before.as_ref(), bound.as_ref()) {
                    return Leave::Changed;
                }
                // The driver's requests only with `nvml.release_for_reset`; the annotation's always.
                forget_declined(&reads, &mut declined.gpus);
                let asks = reopen.asked.get();
                declined.node.forget_gone(&asks);
                let release = reopen
                    .release_for_reset
                    .then(|| wanted(&reads, &declined.gpus, Instant::now()))
                    .flatten()
                    .or_else(|| asked_release(&reads, &asks, &declined.node, Instant::now()));
                let at = Instant::now();
                state.update(|state| {
                    if state.failing.take().is_some() {
                        tracing::info!("NVML answers again");
                    }
                    state.pci = pci;
                    for (index, read) in reads {
                        log_change(state, index, &read);
                        say_attribution_trouble(&read, &mut attribution_said);
                        state.apply(index, read, elapsed, at);
                    }
                    if let Some(stalled) = state.stalled_for(Instant::now()) {
                        tracing::warn!(took = ?stalled, "reading the GPUs took longer than the stall limit: an NVML call was hanging");
                    }
                    state.last_round = Some(Instant::now());
                });
                cx.up.set_up(Subsystem::Nvml, true);
                if let Some(release) = release {
                    return Leave::Release(release);
                }
            }
            Err(reason) => {
                state.update(|state| {
                    if state.failing.is_none() {
                        tracing::error!(error = %reason, "NVML stopped answering; GPU readings are dropped until it answers again");
                    }
                    state.fail(reason);
                });
                cx.up.set_up(Subsystem::Nvml, false);
            }
        }
        if cx.stop.wait(cx.interval) {
            return Leave::Stopped;
        }
    }
}

/// Each reason per-process reading fails for, said once: NVML's refusals do not change from one
/// round to the next, and a process exiting mid-read is ordinary.
fn say_attribution_trouble(read: &DeviceRead, said: &mut BTreeSet<&'static str>) {
    let DeviceRead::Read { reading, .. } = read else {
        return;
    };
    for reason in reading.attribution_errors() {
        if said.insert(reason) {
            tracing::warn!(reason, "per-process GPU use cannot be read in full; those series are absent (counted in mlnode_gpu_process_attribution_errors_total)");
        }
    }
}

/// The NVIDIA GPUs on the PCI bus; what cannot be read is said once (per distinct trouble), not
/// every round, and never taken for an absent GPU.
fn scan_pci(devices: &Path, said: &mut Trouble) -> Option<crate::pci::BusScan> {
    let scan = crate::pci::scan(devices, crate::pci::is_nvidia_gpu);
    let trouble = match &scan {
        Ok(found) if found.unreadable.is_empty() => None,
        Ok(found) => Some(format!(
            "unreadable entries: {}",
            found.unreadable.join(", ")
        )),
        Err(e) => Some(e.clone()),
    };
    match trouble {
        None => {
            said.recovered();
        }
        Some(trouble) => {
            if let Some(trouble) = said.failed(trouble) {
                tracing::warn!(pci_devices = %devices.display(), trouble = %trouble, "cannot read every PCI device: GPUs there are not counted against NVML's");
            }
        }
    }
    scan.ok()
}

/// One log line when a GPU starts or stops failing, not one per sample.
fn log_change(state: &GpuState, index: u32, read: &DeviceRead) {
    let entry = state.gpus.get(&index);
    let before = entry.and_then(|g| g.failure);
    let uuid = entry
        .and_then(|g| g.identity.as_ref())
        .map(|i| i.uuid.as_str())
        .unwrap_or_default();
    match (read, before) {
        (DeviceRead::Failed(failure), before) if before == Some(*failure) => {}
        (DeviceRead::Failed(GpuFailure::Lost), _) => {
            tracing::error!(
                gpu = index,
                uuid,
                "GPU fell off the bus (NVML: GPU is lost)"
            );
        }
        (DeviceRead::Failed(failure), _) => {
            tracing::error!(
                gpu = index,
                uuid,
                failure = failure.as_str(),
                "GPU cannot be read; its readings are dropped until it can"
            );
        }
        (DeviceRead::Read { .. }, Some(failure)) => {
            tracing::info!(gpu = index, was = failure.as_str(), "GPU can be read again");
        }
        (DeviceRead::Read { .. }, None) => {}
    }
    // Said once, when the GPU is first seen in MIG mode, and when it is first read without a
    // recovery action.
    if let DeviceRead::Read { reading, .. } = read {
        let had_action = entry
            .and_then(|g| g.reading.as_ref())
            .map(|r| r.recovery_action.is_some());
        if reading.recovery_action.is_none() && had_action != Some(false) {
            tracing::info!(
                gpu = index,
                uuid,
                "the driver gives no GPU recovery action (NVML field 230, R565 drivers and later): AcceleratorHealthy follows NVIDIA's XID catalog alone for this GPU"
            );
        }
        let was_mig = entry
            .and_then(|g| g.reading.as_ref())
            .is_some_and(|r| r.mig_mode == Some(true));
        if reading.mig_mode == Some(true) && !was_mig {
            tracing::info!(
                gpu = index,
                uuid,
                instances = reading.mig.len(),
                memory = if reading.memory.is_some() { "readable" } else { "refused (no mig/monitor capability)" },
                "GPU is in MIG mode: NVML gives no GPU-wide utilisation for it, and its aggregate memory only to a holder of the mig/monitor capability; each MIG device has its own series (GPU_I_ID, GPU_I_PROFILE)"
            );
        }
    }
}

/// Registers `device` for critical XID events on `set`, leaving the set in NVML's hands whatever
/// the answer. nvml-wrapper's `register_events` frees the whole set on any error, which would
/// silently drop every GPU registered before; NVML itself says only UNKNOWN leaves the set
/// undefined.
fn register_xids(
    nvml: &Nvml,
    device: &Device,
    set: &nvml_wrapper::EventSet,
) -> Result<(), NvmlError> {
    let sym = symbol(&nvml.lib().nvmlDeviceRegisterEvents)?;
    // SAFETY: both handles are valid while `device` and `set` live; NVML copies what it needs.
    nvml_try(unsafe {
        sym(
            device.handle(),
            EventTypes::CRITICAL_XID_ERROR.bits(),
            set.handle(),
        )
    })
}

/// One critical XID event: the GPU's index, the XID (999: one NVML could not identify), and the
/// MIG GPU instance it happened in, if one.
struct XidEvent {
    device: u32,
    xid: u64,
    gpu_instance: Option<u32>,
}

/// `nvmlEventSetWait_v2` through the raw symbol: nvml-wrapper's `EventData` drops the event's
/// `gpuInstanceId`/`computeInstanceId` (nvml.h), which say which MIG instance an XID hit.
/// Ok(None): an event that is not a critical XID, or of a device without an index.
fn wait_xid(
    nvml: &Nvml,
    set: &nvml_wrapper::EventSet,
    timeout_ms: u32,
) -> Result<Option<XidEvent>, NvmlError> {
    let lib = nvml.lib();
    let wait = symbol(&lib.nvmlEventSetWait_v2)?;
    let index_of = symbol(&lib.nvmlDeviceGetIndex)?;
    // SAFETY: the set's handle is valid while `set` lives; the event data is plain out-data whose
    // device handle NVML owns.
    unsafe {
        let mut data: nvml_wrapper_sys::bindings::nvmlEventData_t = std::mem::zeroed();
        nvml_try(wait(set.handle(), &mut data, timeout_ms))?;
        if data.eventType & EventTypes::CRITICAL_XID_ERROR.bits() == 0 {
            return Ok(None);
        }
        let mut device = 0;
        if nvml_try(index_of(data.device, &mut device)).is_err() {
            return Ok(None);
        }
        Ok(Some(XidEvent {
            device,
            xid: data.eventData,
            gpu_instance: (data.gpuInstanceId != u32::MAX).then_some(data.gpuInstanceId),
        }))
    }
}

fn xid_loop(source: &NvmlSource, state: &Shared<GpuState>, stop: &Stop) {
    let nvml = &source.nvml;
    let Ok(mut set) = nvml.create_event_set() else {
        tracing::warn!("NVML cannot create an event set; XID errors will not be counted");
        return;
    };
    let count = source.device_count().unwrap_or(0);
    let mut registered: Vec<u32> = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let supported = device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            tracing::info!(gpu = index, "GPU does not report XID events");
            continue;
        }
        match register_xids(nvml, &device, &set) {
            Ok(()) => registered.push(index),
            Err(NvmlError::Unknown) => {
                // The set is undefined now: a new one, with the GPUs the old one had.
                tracing::warn!(gpu = index, "NVML lost the XID event set registering this GPU; registering the others again");
                let Ok(fresh) = nvml.create_event_set() else {
                    tracing::warn!(
                        "NVML cannot create an event set; XID errors will not be counted"
                    );
                    return;
                };
                set = fresh;
                registered.retain(|&i| {
                    nvml.device_by_index(i)
                        .is_ok_and(|d| register_xids(nvml, &d, &set).is_ok())
                });
            }
            Err(e) => {
                tracing::warn!(gpu = index, error = %e, "cannot listen for XID events on this GPU; the others are unaffected");
            }
        }
    }
    state.update(|state| state.xids_watched = registered.iter().copied().collect());
    while !stop.is_stopped() {
        match wait_xid(nvml, &set, XID_WAIT_MS) {
            Ok(None) => {}
            Ok(Some(event)) => {
                tracing::error!(
                    gpu = event.device,
                    xid = event.xid,
                    gpu_instance = event.gpu_instance,
                    "XID error"
                );
                state.update(|state| {
                    state.record_xid(event.device, event.xid, event.gpu_instance, Instant::now())
                });
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::debug!(error = %e, "NVML event wait");
                if stop.wait(Duration::from_secs(1)) {
                    return;
                }
            }
        }
    }
}
