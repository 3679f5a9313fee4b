//! What the GPU collector concludes about each GPU's health, as plain facts the readiness gate
//! combines: the driver's own verdict first (NVML's recovery action, field 230, R565 drivers and
//! later), NVIDIA's XID catalog where it gives none or has not spoken since the XID, and the device
//! failures NVML reports. Pure functions of [`GpuState`] and the instant, tested on made-up ones.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::state::{GpuEntry, GpuFailure, GpuState};
use super::xid::{catalog, XidPolicy, XidThresholds};
use super::FabricReading;
use crate::kernel_log::facts::{LogFacts, Logged};
use crate::kernel_log::parse::PciAddress;
use mlnode_core::assignments::{Assignments, SharedAssignments};
use mlnode_core::health::{
    hold, DeviceKind, FromNode, HealthSource, Held, Holdings, Problem, Report,
};
use mlnode_core::shared::Shared;

/// `nvmlDeviceGpuRecoveryAction_t` (nvml.h 13.3: NONE 0 to RECOVER_IMEX_DOMAIN 5; NVML's change log
/// for v615 adds BUS_RESET 6 and SYSTEM_REBOOT 7): the value, the series' `action` label, the gate's
/// reason and what the driver asks for, in words.
pub const RECOVERY_ACTIONS: [(u32, &str, &str, &str); 8] = [
    (0, "none", "", "nothing"),
    (1, "gpu_reset", "GPUResetRequired", "a GPU reset"),
    (2, "node_reboot", "NodeRebootRequired", "a node reboot"),
    (
        3,
        "drain_p2p",
        "DrainP2PRequired",
        "draining its peer-to-peer work",
    ),
    (
        4,
        "drain_and_reset",
        "DrainAndResetRequired",
        "a drain, then a GPU reset",
    ),
    (
        5,
        "recover_imex_domain",
        "IMEXDomainRecoveryRequired",
        "recovering its IMEX domain",
    ),
    (6, "bus_reset", "BusResetRequired", "a bus reset"),
    (
        7,
        "system_reboot",
        "SystemRebootRequired",
        "a system reboot",
    ),
];

/// The GPU collector as a [`HealthSource`]: its state, judged by the XID policy, what the kernel
/// log says of its GPUs when that source runs, and which pod holds which GPU.
pub struct GpuHealth {
    pub state: Shared<GpuState>,
    pub policy: XidPolicy,
    pub thresholds: XidThresholds,
    pub kernel_log: Option<Shared<LogFacts>>,
    /// The kubelet's assignments, and the resources (and DRA drivers) whose devices are GPUs.
    pub assignments: SharedAssignments,
    pub resources: Vec<String>,
}

impl HealthSource for GpuHealth {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }

    fn report(&mut self, from_node: &FromNode, now: Instant) -> Report {
        // Taken before the state's lock: no two `Shared` locks are held at once.
        let assignments = self.assignments.get();
        let state = self.state.borrow();
        let mut report = assess(&state, &self.policy, from_node, now);
        report.holdings = holdings(&state, &assignments, &self.resources);
        report
            .problems
            .extend(repeated(&state, &self.thresholds, now));
        if let Some(log) = &self.kernel_log {
            add_logged(&mut report, &state, &log.borrow(), &self.policy, from_node);
        }
        report
    }

    /// Every sample of the GPUs, and every XID event.
    fn changed(&self) -> futures_util::future::BoxFuture<'static, ()> {
        let state = self.state.clone();
        Box::pin(async move { state.changed().await })
    }
}

/// What the kernel log adds to [`assess`]'s verdict: the XIDs it logged for a GPU that NVML's
/// events did not deliver (from before the agent started, or while it was not registered), judged
/// by the same catalog and cleared the same way; each GPU it says fell off the bus (the catalog's
/// action for XID 79, RESTART_BM); and the same for an address NVML does not list. An XID both
/// sources saw is one: NVML's holds it already, and the log adds nothing.
pub fn add_logged(
    report: &mut Report,
    state: &GpuState,
    logged: &LogFacts,
    policy: &XidPolicy,
    from_node: &FromNode,
) {
    report.problems.extend(logged.pending());
    let mut listed = Vec::new();
    for (index, entry) in &state.gpus {
        let Some(id) = &entry.identity else { continue };
        let Some(address) = PciAddress::from_nvml(&id.pci_bus_id) else {
            continue;
        };
        listed.push(address);
        let name = gpu_name(*index, entry);
        let held_by_nvml = report.held.get(&id.uuid).cloned().unwrap_or_default();
        let action = entry.reading.as_ref().and_then(|r| r.recovery_action);
        let cleared_by_driver = |xid: u64, at: Instant| {
            action == Some(0)
                && catalog(xid).is_some_and(|e| e.recovery_action_linked)
                && entry
                    .read_at
                    .is_some_and(|read| read >= at + state.stall_after)
        };
        let xids: Vec<(u64, &Logged)> = logged
            .xids_of(&address)
            .filter(|(xid, l)| {
                policy.holds(*xid)
                    && !held_by_nvml.contains(xid)
                    && !cleared_by_driver(*xid, l.last)
                    && from_node.outlives_clearing(l.last)
            })
            .collect();
        report.problems.extend(
            logged_problems(&name, &xids, logged.fell_off_bus(&address), from_node)
                .into_iter()
                .map(|p| p.on(&id.uuid)),
        );
        if !xids.is_empty() {
            report
                .held
                .entry(id.uuid.clone())
                .or_default()
                .extend(xids.iter().map(|(xid, _)| *xid));
        }
    }
    // The GPUs NVML does not list (lost, or never found): the log names them by address.
    let mut unlisted: BTreeSet<PciAddress> = logged.xids.keys().map(|(a, _)| *a).collect();
    unlisted.extend(logged.fallen_off_bus.keys());
    for address in unlisted
        .into_iter()
        .filter(|a| !listed.iter().any(|l| l.same_slot(a)))
    {
        let xids: Vec<(u64, &Logged)> = logged
            .xids_of(&address)
            .filter(|(xid, l)| policy.holds(*xid) && from_node.outlives_clearing(l.last))
            .collect();
        let name = format!("the GPU at PCI {address} (not listed by NVML)");
        report.problems.extend(logged_problems(
            &name,
            &xids,
            logged.fell_off_bus(&address),
            from_node,
        ));
    }
}

fn logged_problems(
    name: &str,
    xids: &[(u64, &Logged)],
    fell: Option<&Logged>,
    from_node: &FromNode,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    if fell.is_some_and(|l| from_node.outlives_clearing(l.last)) {
        problems.push(Problem::new(
            "GPUFallenOffBus",
            format!("{name} fell off the bus (kernel log, this boot): RESTART_BM, the node must be rebooted"),
        ));
    }
    if !xids.is_empty() {
        let said: Vec<String> = xids
            .iter()
            .map(|(xid, l)| {
                let action = catalog(*xid).map_or("added by readiness.fatal_xids", |e| e.action);
                let process = l
                    .process
                    .as_deref()
                    .map(|p| format!(", process {p}"))
                    .unwrap_or_default();
                format!("{xid} ({action}{process})")
            })
            .collect();
        problems.push(
            Problem::new(
                "FatalXID",
                format!("{name}: the kernel log has XID {} on this boot, which NVIDIA's catalog says needs the GPU reset or the machine restarted", said.join(", ")),
            )
            .with_xid(latest(xids.iter().map(|(xid, l)| (xid, &l.last)))),
        );
    }
    problems
}

/// The health facts of every GPU: the problems (none: healthy), and the XIDs that hold each GPU
/// (by UUID), which the readiness controller writes down so that a restarted agent keeps them.
pub fn assess(state: &GpuState, policy: &XidPolicy, from_node: &FromNode, now: Instant) -> Report {
    let mut assessment = Report::new(DeviceKind::Gpu);
    assessment.devices = state.gpus.len();
    let problems = &mut assessment.problems;
    if let Some(reason) = &state.failing {
        problems.push(Problem::new(
            "CollectorUnavailable",
            format!("nvml stopped answering: {reason}"),
        ));
    }
    // The driver's verdict stands while its GPU is let go of: the reason is the action's, and
    // the pods on the GPUs being reset share it.
    if let Some(released) = &state.released {
        let problem = Problem::new(
            released.reason,
            format!(
                "{} of {}: the agent closed every NVML handle so the reset can proceed, and takes NVML back {}{}",
                released.why,
                released.targets,
                released.until,
                released.timeout.map_or(String::new(), |timeout| format!(
                    ", or after {} (nvml.release_timeout)",
                    humantime::format_duration(timeout)
                ))
            ),
        );
        problems.push(
            released
                .uuids
                .iter()
                .fold(problem, |problem, uuid| problem.on(uuid)),
        );
    }
    // A fixed message: one with the growing age would rewrite the condition every round.
    if state.stalled_for(now).is_some() {
        problems.push(Problem::new(
            "CollectorUnavailable",
            format!(
                "nvml has not finished reading the GPUs within {} s: a call is hanging in the driver",
                state.stall_after.as_secs()
            ),
        ));
    }
    problems.extend(count_mismatch(state, from_node.expected.gpus));
    let mut listed = BTreeSet::new();
    for (index, entry) in &state.gpus {
        let uuid = entry.identity.as_ref().map(|id| id.uuid.as_str());
        listed.extend(uuid);
        let (gpu_problems, held) = assess_gpu(*index, entry, policy, state, from_node, now);
        problems.extend(gpu_problems.into_iter().map(|p| pinned(p, entry)));
        if let (Some(uuid), false) = (uuid, held.is_empty()) {
            assessment.held.insert(uuid.to_string(), held);
        }
    }
    // A GPU a previous agent held that NVML does not list now still holds the node.
    let cleared = from_node
        .since
        .is_some_and(|since| !from_node.outlives_clearing(since));
    for (uuid, xids) in from_node
        .faults
        .iter()
        .filter(|(u, _)| !listed.contains(u.as_str()))
    {
        if cleared {
            continue;
        }
        let said: Vec<String> = xids.iter().map(u64::to_string).collect();
        problems.push(
            Problem::new(
                "FatalXID",
                format!(
                    "{uuid}, not listed by NVML now, reported XID {} before this agent started on this boot",
                    said.join(", ")
                ),
            )
            // No times are remembered: the highest number, the newest in NVIDIA's catalog.
            .with_xid(xids.last().copied())
            .on(uuid),
        );
        assessment
            .held
            .insert(uuid.clone(), from_node.faults[uuid].clone());
    }
    assessment
}

/// NVIDIA GPUs on the PCI bus that NVML does not list (by address), and fewer on the bus than
/// `nvml.expected_gpus`, or else than the node's instance type has (`labelled`).
fn count_mismatch(state: &GpuState, labelled: Option<u32>) -> Option<Problem> {
    let bus = state.pci.as_ref()?;
    let listed: BTreeSet<String> = state
        .gpus
        .values()
        .filter_map(|e| e.identity.as_ref())
        .filter_map(|id| crate::pci::sysfs_bus_id(&id.pci_bus_id))
        .collect();
    // A GPU bound to vfio-pci is a VM's: the host's NVML is not meant to list it.
    let handed_to_vms = bus.bound_to(crate::pci::BusScan::VFIO_DRIVER);
    let missing: Vec<&str> = bus
        .devices
        .iter()
        .filter(|d| !listed.contains(*d) && !handed_to_vms.contains(*d))
        .map(String::as_str)
        .collect();
    // A GPU NVML lists but cannot name (lost before its first read) is one of the missing
    // addresses, and has its own verdict.
    let unnamed = state.gpus.values().filter(|e| e.identity.is_none()).count();
    let mut said = Vec::new();
    if missing.len() > unnamed {
        let vms = if handed_to_vms.is_empty() {
            String::new()
        } else {
            let named: Vec<&str> = handed_to_vms.iter().map(String::as_str).collect();
            format!(
                " (besides {}, handed to a VM through vfio-pci)",
                named.join(", ")
            )
        };
        said.push(format!(
            "the PCI bus has {} NVIDIA GPU(s) and NVML lists {}: not listed {}{vms}",
            bus.devices.len(),
            state.gpus.len(),
            missing.join(", ")
        ));
    }
    let expected = match state.expected_gpus {
        Some(configured) => Some((configured, "nvml.expected_gpus")),
        None => labelled.map(|n| (n, mlnode_core::health::GPU_COUNT_LABEL)),
    };
    if let Some((expected, from)) =
        expected.filter(|&(e, _)| (bus.devices.len() as u64) < u64::from(e))
    {
        said.push(format!(
            "{expected} GPU(s) expected ({from}), {} on the PCI bus",
            bus.devices.len()
        ));
    }
    (!said.is_empty()).then(|| Problem::new("GPUCountMismatch", said.join("; ")))
}

/// Which GPU each pod holds, from the kubelet's assignments under `resources` (extended resources
/// and DRA drivers): a GPU by its UUID, a MIG device (`MIG-…`) by the GPU it is carved from, a
/// time-sliced or MPS replica by the GPU it shares. A pod holding an id NVML does not list holds
/// it unlisted. A pod holding one GPU several ways (two replicas) has it once.
pub fn holdings(state: &GpuState, assignments: &Assignments, resources: &[String]) -> Holdings {
    let mut holdings = Holdings::new();
    for (id, holder) in assignments.every_holder(resources) {
        hold(&mut holdings, holder, resolve(state, id));
    }
    holdings
}

/// The GPU a device id the kubelet hands out is (or is carved from).
fn resolve(state: &GpuState, id: &str) -> Held {
    for (index, entry) in &state.gpus {
        let Some(identity) = &entry.identity else {
            continue;
        };
        if identity.uuid == id {
            return Held {
                device: id.to_string(),
                name: gpu_name(*index, entry),
                listed: true,
            };
        }
        let mig = entry.reading.as_ref().map(|r| r.mig.as_slice());
        if mig.unwrap_or_default().iter().any(|m| m.uuid == id) {
            return Held {
                device: identity.uuid.clone(),
                name: format!("MIG device {id} of {}", gpu_name(*index, entry)),
                listed: true,
            };
        }
    }
    Held {
        device: id.to_string(),
        name: format!("{id}, which NVML does not list"),
        listed: false,
    }
}

/// The problem pinned to the GPU's UUID; a GPU lost before its first read has none to pin it
/// to, and its verdict is the node's.
fn pinned(problem: Problem, entry: &GpuEntry) -> Problem {
    match &entry.identity {
        Some(id) => problem.on(&id.uuid),
        None => problem,
    }
}

/// `GPU 3 (GPU-…, 00000000:4E:00.0)`, as every verdict names a GPU.
fn gpu_name(index: u32, entry: &GpuEntry) -> String {
    match &entry.identity {
        Some(id) => format!("GPU {index} ({}, {})", id.uuid, id.pci_bus_id),
        None => format!("GPU {index}"),
    }
}

fn assess_gpu(
    index: u32,
    entry: &GpuEntry,
    policy: &XidPolicy,
    state: &GpuState,
    from_node: &FromNode,
    now: Instant,
) -> (Vec<Problem>, BTreeSet<u64>) {
    let name = gpu_name(index, entry);
    let mut problems = Vec::new();
    match entry.failure {
        Some(GpuFailure::Lost) => {
            problems.push(Problem::new("GPULost", format!("{name} fell off the bus")))
        }
        Some(GpuFailure::ResetRequired) => problems.push(Problem::new(
            "GPUResetRequired",
            format!("{name} needs a reset (NVML: reset required)"),
        )),
        Some(other) => problems.push(Problem::new(
            "GPUUnreadable",
            format!("{name} cannot be read (NVML: {})", other.as_str()),
        )),
        None => {}
    }
    // This agent's own sightings, and what a previous agent on this boot held, as seen when this
    // one started; the later sighting counts.
    let mut seen: BTreeMap<u64, Instant> = entry.xid_last_seen.clone();
    if let (Some(uuid), Some(since)) = (entry.identity.as_ref().map(|i| &i.uuid), from_node.since) {
        for &xid in from_node.faults.get(uuid).into_iter().flatten() {
            seen.entry(xid).or_insert(since);
        }
    }
    let action = entry.reading.as_ref().and_then(|r| r.recovery_action);
    if let Some(value) = action.filter(|&v| v != 0) {
        // The XID the driver's action followed: the latest of those the catalog links to one.
        let followed = latest(
            seen.iter()
                .filter(|(&xid, _)| catalog(xid).is_some_and(|e| e.recovery_action_linked)),
        );
        problems.push(
            match RECOVERY_ACTIONS.iter().find(|(v, ..)| *v == value) {
                Some((_, _, reason, words)) => Problem::new(
                    reason,
                    format!("the driver asks for {words} of {name} (NVML recovery action {value})"),
                ),
                None => Problem::new(
                    "UnknownRecoveryAction",
                    format!("the driver asks for recovery action {value} of {name}, newer than this agent knows: treated as unfit"),
                ),
            }
            .with_xid(followed),
        );
    }
    problems.extend(row_remap_problems(&name, entry, action));
    if let Some(fabric) = entry.reading.as_ref().and_then(|r| r.fabric) {
        match fabric.state {
            FabricReading::NOT_STARTED | FabricReading::IN_PROGRESS => problems.push(Problem::new(
                "FabricNotReady",
                format!(
                    "{name} is not registered with the NVLink fabric yet (state {}): CUDA fails on it until Fabric Manager completes",
                    if fabric.state == FabricReading::NOT_STARTED { "not started" } else { "in progress" }
                ),
            )),
            FabricReading::COMPLETED if fabric.status != 0 => problems.push(Problem::new(
                "FabricFailed",
                format!(
                    "{name}'s NVLink fabric registration completed with error {} (an nvmlReturn_t)",
                    fabric.status
                ),
            )),
            _ => {}
        }
    }
    problems.extend(nvlink_problems(&name, entry, state, now));
    // An XID the driver links a recovery action to is cleared by a NONE read after it (the
    // driver reset the GPU, or judged it fine); the others hold until the node restarts.
    let cleared_by_driver = |xid: u64, seen: Instant| {
        action == Some(0)
            && catalog(xid).is_some_and(|e| e.recovery_action_linked)
            && entry
                .read_at
                .is_some_and(|read| read >= seen + state.stall_after)
    };
    let held: BTreeSet<u64> = seen
        .iter()
        .filter(|(&xid, &at)| {
            policy.holds(xid) && !cleared_by_driver(xid, at) && from_node.outlives_clearing(at)
        })
        .map(|(&xid, _)| xid)
        .collect();
    let holding: Vec<String> = held
        .iter()
        .map(|&xid| match catalog(xid) {
            Some(entry) => format!("{xid} ({}, {})", entry.mnemonic, entry.action),
            None => format!("{xid} (added by readiness.fatal_xids)"),
        })
        .collect();
    if !holding.is_empty() {
        problems.push(
            Problem::new(
                "FatalXID",
                format!(
                    "{name} reported XID {}, which NVIDIA's catalog says needs the GPU reset or the machine restarted",
                    holding.join(", ")
                ),
            )
            .with_xid(latest(seen.iter().filter(|(xid, _)| held.contains(xid)))),
        );
    }
    (problems, held)
}

/// The XID seen last of some sightings (the lower number of two seen at once): a GPU's latest
/// fault is the one the repair engines are told of, since a later fault is the graver as a rule
/// (an ECC error, then the GPU off the bus) and the message names every one.
fn latest<'a>(sightings: impl Iterator<Item = (&'a u64, &'a Instant)>) -> Option<u64> {
    sightings
        .max_by(|(a, at_a), (b, at_b)| at_a.cmp(at_b).then(b.cmp(a)))
        .map(|(&xid, _)| xid)
}

/// HBM rows (`nvmlDeviceGetRemappedRows`): a failed remapping left a bad row with no spare, so
/// the memory can no longer heal and the GPU must be replaced (eks-node-monitoring-agent misses
/// it); a pending one heals at the next GPU reset, which is said only where the driver's recovery
/// action does not already ask for that reset.
fn row_remap_problems(name: &str, entry: &GpuEntry, action: Option<u32>) -> Vec<Problem> {
    let Some(rows) = entry.reading.as_ref().and_then(|r| r.remapped_rows) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if rows.failed {
        problems.push(Problem::new(
            "RowRemapFailed",
            format!("{name} failed to remap an HBM row (no spare row left, {} uncorrectable remapped): its memory can no longer heal, the GPU needs replacing", rows.uncorrectable),
        ));
    }
    // GPU_RESET (1) and DRAIN_AND_RESET (4) ask for the reset that applies the remapping.
    if rows.pending && !matches!(action, Some(1 | 4)) {
        problems.push(Problem::new(
            "RowRemapPending",
            format!("{name} has an HBM row remapping pending: it takes effect at the next GPU reset, which the GPU wants now"),
        ));
    }
    problems
}

/// The XIDs of `readiness.xid_thresholds` that NVML reported on one GPU more than their count
/// within their window (this agent's sightings: a restart starts counting again).
pub fn repeated(state: &GpuState, thresholds: &XidThresholds, now: Instant) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (index, entry) in &state.gpus {
        for (xid, threshold) in &thresholds.0 {
            let window = threshold.window.get();
            let seen = entry
                .xids_within(now, window)
                .get(xid)
                .copied()
                .unwrap_or(0);
            if seen <= u64::from(threshold.count.get()) {
                continue;
            }
            let mnemonic = catalog(*xid).map_or("not in NVIDIA's catalog", |e| e.mnemonic);
            problems.push(pinned(
                Problem::new(
                    "XIDRepeated",
                    format!(
                        "{} reported XID {xid} ({mnemonic}) more than {} times within {} (readiness.xid_thresholds): repeats on one GPU call for its diagnostics (NVIDIA's catalog: DCGM diag, then field diagnostics)",
                        gpu_name(*index, entry),
                        threshold.count.get(),
                        humantime::format_duration(window)
                    ),
                )
                .with_repeated_xid(*xid),
                entry,
            ));
        }
    }
    problems
}

/// A link seen active that NVML reports inactive now, and recovery errors that rose within
/// `nvml.nvlink_error_window`: tensor parallelism over the link stalls or crawls.
fn nvlink_problems(name: &str, entry: &GpuEntry, state: &GpuState, now: Instant) -> Vec<Problem> {
    let mut problems = Vec::new();
    let lost = entry.nvlinks_lost();
    if !lost.is_empty() {
        let links: Vec<String> = lost.iter().map(u32::to_string).collect();
        problems.push(Problem::new(
            "NVLinkInactive",
            format!(
                "{name}: NVLink link {} was active and is not now (nvmlDeviceGetNvLinkState): collectives across it fail or fall back to PCIe",
                links.join(", ")
            ),
        ));
    }
    let rising = entry
        .nvlink_recovery_rose
        .is_some_and(|at| now.saturating_duration_since(at) < state.nvlink_error_window);
    if let (true, Some(total)) = (rising, entry.nvlink_recovery) {
        problems.push(Problem::new(
            "NVLinkRecoveryErrors",
            format!(
                "{name}'s NVLink recovery errors rose to {total} within the last {} s (nvml.nvlink_error_window): a link keeps retraining",
                state.nvlink_error_window.as_secs()
            ),
        ));
    }
    problems
}

#[cfg(test)]
mod tests;
