//! The GPU series, built at scrape time from [`GpuState`] (the node_exporter way: a scrape reads
//! the latest samples, it never waits on the driver). Label sets follow dcgm-exporter exactly:
//! `pod`, `namespace` and `container` appear only on a GPU assigned to a container, so a custom
//! collector rather than fixed-label vectors.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::attribution::{self, ContainerUse};
use super::families::{DCGM_FAMILIES, FAMILIES};
use super::health;
use super::state::{GpuEntry, GpuFailure, GpuState};
use super::virtual_gpus::{copy_per_holder, HolderCopy, SharedDevice};
use super::xid::{self, xid_message};
use super::{
    GpmReading, GpuIdentity, MigInstance, CLOCK_EVENT_REASONS, NVLINK_ERROR_COUNTERS,
    THERMAL_LIMITS,
};
use crate::kernel_log::facts::LogFacts;
use crate::kernel_log::parse::PciAddress;
use mlnode_core::assignments::{Assignment, Assignments, SharedAssignments};
use mlnode_core::metrics::family::{descs, with_label, Families, Labels};
use mlnode_core::pods::{PodDirectory, PodNames};
use mlnode_core::shared::Shared;

const MIB: u64 = 1 << 20;

/// Label spellings of dcgm-exporter's releases.
#[derive(Clone, Debug, Default)]
pub struct LabelStyle {
    /// `pod_name`/`pod_namespace`/`container_name`, as dcgm-exporter before 2.x.
    pub legacy_pod_labels: bool,
}

/// Who holds each device, and what the agent knows of their pods: the labels naming a holder.
struct Holders<'a> {
    assignments: &'a Assignments,
    pods: &'a PodDirectory,
}

pub struct GpuCollector {
    state: Shared<GpuState>,
    assignments: SharedAssignments,
    /// The node's pods, naming the owners of the GPUs' processes, and what of a holder's pod
    /// its devices' series carry (`kubelet.pod_uid`, `kubelet.pod_labels`).
    pod_names: PodNames,
    /// Extended resources whose device ids are GPU UUIDs (`nvidia.com/gpu`).
    resource_names: Vec<String>,
    style: LabelStyle,
    dcgm_names: bool,
    /// What the kernel log says, when `kernel_log.enabled`: the XIDs it logged are counted too.
    kernel_log: Option<Shared<LogFacts>>,
    descs: Vec<Desc>,
}

impl GpuCollector {
    pub fn new(
        state: Shared<GpuState>,
        assignments: SharedAssignments,
        pod_names: PodNames,
        resource_names: Vec<String>,
        style: LabelStyle,
        dcgm_names: bool,
        kernel_log: Option<Shared<LogFacts>>,
    ) -> prometheus::Result<GpuCollector> {
        let families = FAMILIES.iter().chain(if dcgm_names {
            DCGM_FAMILIES.iter()
        } else {
            [].iter()
        });
        let descs = descs(families)?;
        Ok(GpuCollector {
            state,
            assignments,
            pod_names,
            resource_names,
            style,
            dcgm_names,
            kernel_log,
            descs,
        })
    }

    /// dcgm-exporter's label set for one GPU: its device labels, and its holder's.
    fn labels(&self, device: &[(&'static str, String)], uuid: &str, holders: &Holders) -> Labels {
        let mut labels = device.to_vec();
        self.push_pod(&mut labels, holders, uuid);
        labels
    }

    /// A MIG device's labels as dcgm-exporter writes them: its parent GPU's, `GPU_I_ID`,
    /// `GPU_I_PROFILE`, and the pod holding the MIG device (`MIG-<uuid>`).
    fn instance_labels(
        &self,
        identity: &GpuIdentity,
        driver: &str,
        instance: &MigInstance,
        holders: &Holders,
    ) -> Vec<(&'static str, String)> {
        let mut labels = self.instance_device_labels(identity, driver, instance);
        self.push_pod(&mut labels, holders, &instance.uuid);
        labels
    }

    /// A MIG device's own labels: its parent GPU's, `GPU_I_ID`, `GPU_I_PROFILE`.
    fn instance_device_labels(
        &self,
        identity: &GpuIdentity,
        driver: &str,
        instance: &MigInstance,
    ) -> Labels {
        let mut labels = self.device_labels(identity, driver);
        labels.push(("GPU_I_ID", instance.gpu_instance_id.to_string()));
        labels.push(("GPU_I_PROFILE", instance.profile.clone()));
        labels
    }

    fn device_labels(&self, identity: &GpuIdentity, driver: &str) -> Vec<(&'static str, String)> {
        vec![
            ("gpu", identity.index.to_string()),
            ("UUID", identity.uuid.clone()),
            ("pci_bus_id", identity.pci_bus_id.clone()),
            ("device", format!("nvidia{}", identity.index)),
            ("modelName", identity.model_name.clone()),
            ("DCGM_FI_DRIVER_VERSION", driver.to_string()),
        ]
    }

    /// A shared device's first holder is no more its holder than the others: with
    /// `kubelet.virtual_gpus` its series carry none (the DCGM_* ones are then copied per holder).
    fn push_pod(&self, labels: &mut Labels, holders: &Holders, device_id: &str) {
        if self.pod_names.holder.virtual_gpus && holders.assignments.is_shared(device_id) {
            return;
        }
        if let Some(a) = holders.assignments.find(&self.resource_names, device_id) {
            self.push_holder(labels, holders.pods, a);
        }
    }

    /// A holder's names, then what `holder_labels` adds of its pod.
    fn push_holder(&self, labels: &mut Labels, pods: &PodDirectory, a: &Assignment) {
        let names = self.pod_label_names();
        labels.push((names[0], a.pod.clone()));
        labels.push((names[1], a.namespace.clone()));
        labels.push((names[2], a.container.clone()));
        let extra = self.pod_names.holder.of(pods, &a.namespace, &a.pod, labels);
        labels.extend(extra);
    }

    fn pod_label_names(&self) -> [&'static str; 3] {
        if self.style.legacy_pod_labels {
            ["pod_name", "pod_namespace", "container_name"]
        } else {
            ["pod", "namespace", "container"]
        }
    }

    /// With `kubelet.virtual_gpus` and dcgm-exporter's names, the copies a shared device's DCGM_*
    /// series get: one per replica holder, with `vgpu`, and that holder's own framebuffer and SM
    /// use where the device's processes were read (`rows`; 0 for a holder running nothing).
    fn virtual_copies(
        &self,
        device_id: &str,
        parent_uuid: &str,
        gpu_instance: Option<u32>,
        rows: Option<&[ContainerUse]>,
        holders: &Holders,
    ) -> Option<SharedDevice> {
        if !(self.pod_names.holder.virtual_gpus && self.dcgm_names) {
            return None;
        }
        let copies: Vec<HolderCopy> = holders
            .assignments
            .holders(device_id)
            .into_iter()
            .map(|(holder, replica)| {
                let mut labels = Vec::new();
                self.push_holder(&mut labels, holders.pods, holder);
                labels.push(("vgpu", replica.to_string()));
                let own = rows.map(|rows| {
                    rows.iter()
                        .find(|r| {
                            r.namespace == holder.namespace
                                && r.pod == holder.pod
                                && r.container == holder.container
                        })
                        .map_or((0.0, 0.0), |r| {
                            (
                                (r.memory_bytes.unwrap_or(0) / MIB) as f64,
                                (r.sm_ratio.unwrap_or(0.0) * 100.0).round(),
                            )
                        })
                });
                HolderCopy { labels, own }
            })
            .collect();
        (!copies.is_empty()).then(|| SharedDevice {
            uuid: parent_uuid.to_string(),
            gpu_instance: gpu_instance.map(|id| id.to_string()),
            copies,
        })
    }
}

impl Collector for GpuCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let state = self.state.borrow();
        let assignments = self.assignments.get();
        let pods = self.pod_names.pods.borrow();
        let holders = Holders {
            assignments: &assignments,
            pods: &pods,
        };
        let mut shared = Vec::new();
        let mut out = Families::default();
        // While NVML cannot count them, there is no current count.
        if state.failing.is_none() {
            out.gauge("mlnode_gpu_count", &[], state.gpus.len() as f64);
        }
        if let Some(bus) = &state.pci {
            out.gauge("mlnode_gpu_pci_devices", &[], bus.devices.len() as f64);
            out.gauge(
                "mlnode_gpu_pci_virtual_functions",
                &[],
                bus.virtual_functions.len() as f64,
            );
            for address in bus.bound_to(crate::pci::BusScan::VFIO_DRIVER) {
                let bus_id = PciAddress::from_nvml(&address).map_or(address, |a| a.nvml_bus_id());
                out.gauge("mlnode_gpu_pci_passthrough", &[("pci_bus_id", bus_id)], 1.0);
            }
        }
        let now = Instant::now();
        if let Some(last) = state.last_round {
            out.gauge(
                "mlnode_gpu_readings_age_seconds",
                &[],
                now.saturating_duration_since(last).as_secs_f64(),
            );
        }
        out.gauge(
            "mlnode_gpu_nvml_released",
            &[],
            f64::from(u8::from(state.released.is_some())),
        );
        for (after, n) in &state.reattached {
            out.counter(
                "mlnode_gpu_nvml_reattaches_total",
                &[("after", after.to_string())],
                *n as f64,
            );
        }
        out.counter("mlnode_gpu_nvml_reinits_total", &[], state.reinits as f64);
        let released: &[String] = state.released.as_ref().map_or(&[], |r| &r.uuids);
        let stalled = state.stalled_for(now).is_some();
        let log = self.kernel_log.as_ref().map(|log| log.borrow());
        // Until the kernel log's history is read, no GPU's count of this boot's XIDs is known: no
        // sample, rather than a low one a restarted agent's scrape would take for a reset.
        let xid_log = match &log {
            None => XidLog::Off,
            Some(log) if !log.history_read => XidLog::Reading,
            Some(log) => XidLog::Read(log),
        };
        let mut listed = Vec::new();
        for (index, entry) in &state.gpus {
            let Some(identity) = &entry.identity else {
                continue;
            };
            // Let go of for a reset: nothing of it is known until NVML is taken back.
            if released.contains(&identity.uuid) {
                continue;
            }
            let device = self.device_labels(identity, &state.driver_version);
            out.gauge(
                "mlnode_gpu_info",
                &info_labels(&device, identity, state.cuda_driver_version),
                1.0,
            );
            let labels = self.labels(&device, &identity.uuid, &holders);
            let address = PciAddress::from_nvml(&identity.pci_bus_id);
            listed.extend(address);
            let lost = entry.failure == Some(GpuFailure::Lost);
            out.gauge("mlnode_gpu_lost", &labels, f64::from(u8::from(lost)));
            if let Some(failure) = entry.failure {
                out.gauge(
                    "mlnode_gpu_failure",
                    &with_label(&labels, "reason", failure.as_str()),
                    1.0,
                );
            }
            // Nothing heard from a GPU no source watches is no 0: dcgm-exporter's zeros need one.
            let xids_known =
                state.xids_watched.contains(index) || matches!(xid_log, XidLog::Read(_));
            self.collect_counters(entry, address, &xid_log, xids_known, &labels, &mut out);
            if self.dcgm_names {
                collect_xid_window(
                    entry,
                    &labels,
                    (now, state.xid_count_window),
                    xids_known,
                    &mut out,
                );
            }
            // An instance's XIDs, labelled as that instance's series are where it is still known.
            for ((gpu_instance, xid), count) in &entry.instance_xids {
                let known = entry
                    .reading
                    .as_ref()
                    .and_then(|r| r.mig.iter().find(|i| i.gpu_instance_id == *gpu_instance));
                let instance_labels = match known {
                    Some(instance) => {
                        self.instance_labels(identity, &state.driver_version, instance, &holders)
                    }
                    None => with_label(&labels, "GPU_I_ID", &gpu_instance.to_string()),
                };
                out.counter(
                    "mlnode_gpu_mig_xid_errors_total",
                    &with_label(&instance_labels, "xid", &xid.to_string()),
                    *count as f64,
                );
            }
            // A stalled sampler's readings are history, not the GPU now.
            if let Some(reading) = entry.reading.as_ref().filter(|_| !stalled) {
                self.collect_reading(reading, &labels, &mut out);
                let rows = reading.processes.as_ref().map(|processes| {
                    attribution::per_container(processes, &identity.uuid, &pods, &assignments)
                });
                if let Some(rows) = &rows {
                    self.collect_container_use(rows, &device, &mut out);
                }
                shared.extend(self.virtual_copies(
                    &identity.uuid,
                    &identity.uuid,
                    None,
                    rows.as_deref(),
                    &holders,
                ));
                for instance in &reading.mig {
                    let labels =
                        self.instance_labels(identity, &state.driver_version, instance, &holders);
                    self.collect_instance(instance, &labels, &mut out);
                    let rows = instance.processes.as_ref().map(|processes| {
                        attribution::per_container(processes, &instance.uuid, &pods, &assignments)
                    });
                    if let Some(rows) = &rows {
                        let device =
                            self.instance_device_labels(identity, &state.driver_version, instance);
                        self.collect_container_use(rows, &device, &mut out);
                    }
                    shared.extend(self.virtual_copies(
                        &instance.uuid,
                        &identity.uuid,
                        Some(instance.gpu_instance_id),
                        rows.as_deref(),
                        &holders,
                    ));
                }
            }
        }
        if let XidLog::Read(log) = xid_log {
            collect_unlisted_xids(log, &listed, &mut out);
        }
        copy_per_holder(&mut out, &shared);
        for (reason, count) in &state.attribution_errors {
            out.counter(
                "mlnode_gpu_process_attribution_errors_total",
                &[("reason", reason.to_string())],
                *count as f64,
            );
        }
        out.into_families(FAMILIES.iter().chain(if self.dcgm_names {
            DCGM_FAMILIES.iter()
        } else {
            [].iter()
        }))
    }
}

/// The kernel log as the XID counts see it.
enum XidLog<'a> {
    Off,
    /// Its history is still being read.
    Reading,
    Read(&'a LogFacts),
}

fn xid_labels(labels: &[(&'static str, String)], xid: u64) -> Labels {
    let mut xid_labels = with_label(labels, "xid", &xid.to_string());
    xid_labels.push(("immediate_action", xid::immediate_action(xid).to_string()));
    xid_labels
}

/// The XIDs the kernel log has for a GPU NVML does not list (lost before the agent started, or
/// never found): counted under its address alone, which is all the log names.
fn collect_unlisted_xids(log: &LogFacts, listed: &[PciAddress], out: &mut Families) {
    for ((address, xid), logged) in &log.xids {
        if listed.iter().any(|l| l.same_slot(address)) {
            continue;
        }
        out.counter(
            "mlnode_gpu_xid_errors_total",
            &xid_labels(&[("pci_bus_id", address.nvml_bus_id())], *xid),
            logged.count as f64,
        );
    }
}

#[derive(Clone, Copy)]
enum GpmScope {
    Gpu,
    MigInstance,
}

impl GpuCollector {
    /// One container's use of a GPU or MIG device: the device's own labels (never its first
    /// holder's), the container's, its pod's UID and, on a shared device, its replica.
    fn collect_container_use(
        &self,
        rows: &[ContainerUse],
        device: &[(&'static str, String)],
        out: &mut Families,
    ) {
        let names = self.pod_label_names();
        for row in rows {
            let mut labels = device.to_vec();
            labels.push((names[0], row.pod.clone()));
            labels.push((names[1], row.namespace.clone()));
            labels.push((names[2], row.container.clone()));
            labels.push(("pod_uid", row.pod_uid.clone()));
            if let Some(vgpu) = &row.vgpu {
                labels.push(("vgpu", vgpu.clone()));
            }
            if let Some(bytes) = row.memory_bytes {
                out.gauge("mlnode_gpu_pod_memory_used_bytes", &labels, bytes as f64);
            }
            if let Some(ratio) = row.sm_ratio {
                out.gauge("mlnode_gpu_pod_sm_utilization_ratio", &labels, ratio);
            }
        }
    }

    fn collect_instance(
        &self,
        instance: &MigInstance,
        labels: &[(&'static str, String)],
        out: &mut Families,
    ) {
        let mut info = with_label(labels, "mig_uuid", &instance.uuid);
        info.push((
            "compute_instance_id",
            instance.compute_instance_id.to_string(),
        ));
        out.gauge("mlnode_gpu_mig_instance_info", &info, 1.0);
        if let Some(m) = instance.memory {
            out.gauge("mlnode_gpu_mig_memory_used_bytes", labels, m.used as f64);
            out.gauge("mlnode_gpu_mig_memory_free_bytes", labels, m.free as f64);
            out.gauge("mlnode_gpu_mig_memory_total_bytes", labels, m.total as f64);
            if self.dcgm_names {
                out.gauge("DCGM_FI_DEV_FB_USED", labels, (m.used / MIB) as f64);
                out.gauge("DCGM_FI_DEV_FB_FREE", labels, (m.free / MIB) as f64);
            }
        }
        if let Some(gpm) = &instance.gpm {
            self.collect_gpm(gpm, GpmScope::MigInstance, labels, out);
        }
    }

    /// GPM ratios under their own names (per GPU, or `mlnode_gpu_mig_*` per GPU instance, so that
    /// a sum over a GPU's series never adds the instances to the whole) and, with `dcgm_names`,
    /// under DCGM's profiling names, which dcgm-exporter uses for both, told apart by `GPU_I_ID`.
    fn collect_gpm(
        &self,
        gpm: &GpmReading,
        scope: GpmScope,
        labels: &[(&'static str, String)],
        out: &mut Families,
    ) {
        for (gpu, instance, dcgm, value) in [
            (
                "mlnode_gpu_graphics_engine_active_ratio",
                "mlnode_gpu_mig_graphics_engine_active_ratio",
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                gpm.graphics_active,
            ),
            (
                "mlnode_gpu_sm_active_ratio",
                "mlnode_gpu_mig_sm_active_ratio",
                "DCGM_FI_PROF_SM_ACTIVE",
                gpm.sm_active,
            ),
            (
                "mlnode_gpu_tensor_pipe_active_ratio",
                "mlnode_gpu_mig_tensor_pipe_active_ratio",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                gpm.tensor_active,
            ),
            (
                "mlnode_gpu_dram_active_ratio",
                "mlnode_gpu_mig_dram_active_ratio",
                "DCGM_FI_PROF_DRAM_ACTIVE",
                gpm.dram_active,
            ),
        ] {
            let Some(value) = value else { continue };
            let ours = match scope {
                GpmScope::Gpu => gpu,
                GpmScope::MigInstance => instance,
            };
            out.gauge(ours, labels, value);
            if self.dcgm_names {
                out.gauge(dcgm, labels, value);
            }
        }
    }

    /// Counters live on even while a GPU is lost: an XID just before it fell off is the clue.
    fn collect_counters(
        &self,
        entry: &GpuEntry,
        address: Option<PciAddress>,
        xid_log: &XidLog,
        xids_known: bool,
        labels: &[(&'static str, String)],
        out: &mut Families,
    ) {
        let counts = match (xid_log, address) {
            (XidLog::Off, _) | (XidLog::Read(_), None) => Some(Cow::Borrowed(&entry.xids)),
            (XidLog::Read(log), Some(address)) => Some(Cow::Owned(xid::boot_counts(
                &entry.xids,
                log.xids_of(&address),
            ))),
            (XidLog::Reading, _) => None,
        };
        for (xid, count) in counts.iter().flat_map(|c| c.iter()) {
            out.counter(
                "mlnode_gpu_xid_errors_total",
                &xid_labels(labels, *xid),
                *count as f64,
            );
        }
        if let Some(xid) = entry.last_xid {
            out.gauge("mlnode_gpu_last_xid", labels, xid as f64);
            let mut info = with_label(labels, "xid", &xid.to_string());
            info.push(("message", xid_message(xid).to_string()));
            out.gauge("mlnode_gpu_xid_info", &info, 1.0);
        }
        if self.dcgm_names
            && entry.failure != Some(GpuFailure::Lost)
            && (xids_known || entry.last_xid.is_some())
        {
            // dcgm-exporter labels the value with err_code and NVIDIA's text for it
            // (internal/pkg/collector/gpu_collector.go:324-331).
            let xid = entry.last_xid.unwrap_or(0);
            let mut with_err = with_label(labels, "err_code", &xid.to_string());
            with_err.push(("err_msg", xid_message(xid).to_string()));
            out.gauge("DCGM_FI_DEV_XID_ERRORS", &with_err, xid as f64);
        }
        if entry
            .reading
            .as_ref()
            .is_some_and(|r| r.clock_event_reasons.is_some())
        {
            for (seconds, (_, reason)) in entry.reason_seconds.iter().zip(CLOCK_EVENT_REASONS) {
                out.counter(
                    "mlnode_gpu_clock_event_reason_seconds_total",
                    &with_label(labels, "reason", reason),
                    *seconds,
                );
            }
        }
    }

    fn collect_reading(
        &self,
        reading: &super::GpuReading,
        labels: &[(&'static str, String)],
        out: &mut Families,
    ) {
        if let Some(m) = reading.memory {
            out.gauge("mlnode_gpu_memory_free_bytes", labels, m.free as f64);
            out.gauge("mlnode_gpu_memory_used_bytes", labels, m.used as f64);
            out.gauge("mlnode_gpu_memory_total_bytes", labels, m.total as f64);
            if let Some(reserved) = m.reserved {
                out.gauge("mlnode_gpu_memory_reserved_bytes", labels, reserved as f64);
            }
            if self.dcgm_names {
                // DCGM reports whole MiB, truncated.
                out.gauge("DCGM_FI_DEV_FB_FREE", labels, (m.free / MIB) as f64);
                out.gauge("DCGM_FI_DEV_FB_USED", labels, (m.used / MIB) as f64);
                if let Some(reserved) = m.reserved {
                    out.gauge("DCGM_FI_DEV_FB_RESERVED", labels, (reserved / MIB) as f64);
                }
            }
        }
        if let Some(mask) = reading.clock_event_reasons {
            for (bit, reason) in CLOCK_EVENT_REASONS {
                out.gauge(
                    "mlnode_gpu_clock_event_reason_active",
                    &with_label(labels, "reason", reason),
                    f64::from(u8::from(mask & bit != 0)),
                );
            }
            if self.dcgm_names {
                out.gauge("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", labels, mask as f64);
            }
        }
        if let Some(fabric) = reading.fabric {
            out.gauge("mlnode_gpu_fabric_state", labels, f64::from(fabric.state));
            out.gauge(
                "mlnode_gpu_fabric_healthy",
                labels,
                f64::from(u8::from(fabric.is_ready())),
            );
            for (check, bad) in fabric.health_checks() {
                out.gauge(
                    "mlnode_gpu_fabric_health",
                    &with_label(labels, "check", check),
                    f64::from(u8::from(bad)),
                );
            }
        }
        if let Some(action) = reading.recovery_action {
            let known = health::RECOVERY_ACTIONS.iter().any(|(v, ..)| *v == action);
            for (value, label, ..) in health::RECOVERY_ACTIONS {
                out.gauge(
                    "mlnode_gpu_recovery_action",
                    &with_label(labels, "action", label),
                    f64::from(u8::from(value == action)),
                );
            }
            if !known {
                out.gauge(
                    "mlnode_gpu_recovery_action",
                    &with_label(labels, "action", "unknown"),
                    1.0,
                );
            }
        }
        let scalar = |out: &mut Families,
                      ours: &'static str,
                      ours_value: Option<f64>,
                      dcgm: &'static str,
                      dcgm_value: Option<f64>| {
            if let Some(v) = ours_value {
                out.gauge(ours, labels, v);
            }
            if let (true, Some(v)) = (self.dcgm_names, dcgm_value) {
                out.gauge(dcgm, labels, v);
            }
        };
        let as_f64 = |v: Option<u32>| v.map(f64::from);
        if let Some(on) = reading.mig_mode {
            out.gauge("mlnode_gpu_mig_mode", labels, f64::from(u8::from(on)));
        }
        scalar(
            out,
            "mlnode_gpu_sm_clock_hertz",
            reading.sm_clock_mhz.map(|v| f64::from(v) * 1e6),
            "DCGM_FI_DEV_SM_CLOCK",
            as_f64(reading.sm_clock_mhz),
        );
        scalar(
            out,
            "mlnode_gpu_memory_clock_hertz",
            reading.mem_clock_mhz.map(|v| f64::from(v) * 1e6),
            "DCGM_FI_DEV_MEM_CLOCK",
            as_f64(reading.mem_clock_mhz),
        );
        scalar(
            out,
            "mlnode_gpu_temperature_celsius",
            as_f64(reading.temperature_c),
            "DCGM_FI_DEV_GPU_TEMP",
            as_f64(reading.temperature_c),
        );
        scalar(
            out,
            "mlnode_gpu_power_watts",
            reading.power_mw.map(|v| f64::from(v) / 1000.0),
            "DCGM_FI_DEV_POWER_USAGE",
            reading.power_mw.map(|v| f64::from(v) / 1000.0),
        );
        if let Some(limit) = reading.power_limit_mw {
            out.gauge(
                "mlnode_gpu_power_limit_watts",
                labels,
                f64::from(limit) / 1000.0,
            );
        }
        scalar(
            out,
            "mlnode_gpu_utilization_ratio",
            reading.utilization_gpu_pct.map(|v| f64::from(v) / 100.0),
            "DCGM_FI_DEV_GPU_UTIL",
            as_f64(reading.utilization_gpu_pct),
        );
        let percent = |v: Option<u32>| v.map(|v| f64::from(v) / 100.0);
        scalar(
            out,
            "mlnode_gpu_memory_copy_utilization_ratio",
            percent(reading.memory_copy_util_pct),
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            as_f64(reading.memory_copy_util_pct),
        );
        scalar(
            out,
            "mlnode_gpu_encoder_utilization_ratio",
            percent(reading.encoder_util_pct),
            "DCGM_FI_DEV_ENC_UTIL",
            as_f64(reading.encoder_util_pct),
        );
        scalar(
            out,
            "mlnode_gpu_decoder_utilization_ratio",
            percent(reading.decoder_util_pct),
            "DCGM_FI_DEV_DEC_UTIL",
            as_f64(reading.decoder_util_pct),
        );
        scalar(
            out,
            "mlnode_gpu_memory_temperature_celsius",
            as_f64(reading.memory_temp_c),
            "DCGM_FI_DEV_MEMORY_TEMP",
            as_f64(reading.memory_temp_c),
        );
        if let Some(gpm) = &reading.gpm {
            self.collect_gpm(gpm, GpmScope::Gpu, labels, out);
        }
        if let Some((tx, rx)) = reading.pcie_bytes_per_second {
            for (direction, bytes, dcgm) in [
                ("tx", tx, "DCGM_FI_PROF_PCIE_TX_BYTES"),
                ("rx", rx, "DCGM_FI_PROF_PCIE_RX_BYTES"),
            ] {
                out.gauge(
                    "mlnode_gpu_pcie_bytes_per_second",
                    &with_label(labels, "direction", direction),
                    bytes as f64,
                );
                if self.dcgm_names {
                    out.gauge(dcgm, labels, bytes as f64);
                }
            }
        }
        if let Some((tx, rx)) = reading.nvlink_bytes {
            for (direction, bytes) in [("tx", tx), ("rx", rx)] {
                out.counter(
                    "mlnode_gpu_nvlink_bytes_total",
                    &with_label(labels, "direction", direction),
                    bytes as f64,
                );
            }
        }
        if let Some(nvlink) = &reading.nvlink {
            for (link, active) in &nvlink.links {
                out.gauge(
                    "mlnode_gpu_nvlink_link_active",
                    &with_label(labels, "link", &link.to_string()),
                    f64::from(u8::from(*active)),
                );
            }
            for ((_, counter, dcgm), count) in NVLINK_ERROR_COUNTERS.iter().zip(nvlink.errors) {
                let Some(count) = count else { continue };
                out.counter(
                    "mlnode_gpu_nvlink_errors_total",
                    &with_label(labels, "counter", counter),
                    count as f64,
                );
                if self.dcgm_names {
                    out.counter(dcgm, labels, count as f64);
                }
            }
        }
        for ((_, limit), margin) in THERMAL_LIMITS.iter().zip(reading.thermal_margins) {
            if let Some(margin) = margin {
                out.gauge(
                    "mlnode_gpu_thermal_margin_celsius",
                    &with_label(labels, "limit", limit),
                    margin as f64,
                );
            }
        }
        if let Some(replays) = reading.pcie_replays {
            out.counter("mlnode_gpu_pcie_replays_total", labels, f64::from(replays));
            if self.dcgm_names {
                out.counter(
                    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                    labels,
                    f64::from(replays),
                );
            }
        }
        if let Some(rows) = reading.remapped_rows {
            for (cause, count, dcgm) in [
                (
                    "correctable",
                    rows.correctable,
                    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                ),
                (
                    "uncorrectable",
                    rows.uncorrectable,
                    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                ),
            ] {
                out.counter(
                    "mlnode_gpu_remapped_rows_total",
                    &with_label(labels, "cause", cause),
                    f64::from(count),
                );
                if self.dcgm_names {
                    out.counter(dcgm, labels, f64::from(count));
                }
            }
            let flag = |b: bool| f64::from(u8::from(b));
            out.gauge("mlnode_gpu_row_remap_pending", labels, flag(rows.pending));
            out.gauge("mlnode_gpu_row_remap_failed", labels, flag(rows.failed));
            if self.dcgm_names {
                out.gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", labels, flag(rows.failed));
            }
        }
        if let Some(mj) = reading.energy_mj {
            out.counter("mlnode_gpu_energy_joules_total", labels, mj as f64 / 1000.0);
            if self.dcgm_names {
                out.counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, mj as f64);
            }
        }
    }
}

/// `DCGM_EXP_XID_ERRORS_COUNT` as dcgm-exporter writes it (internal/pkg/collector/expcollector.go):
/// one series per XID seen in the window, labelled `xid` and `window_size_in_ms`; a GPU without any
/// has one series of 0 without `xid`.
fn collect_xid_window(
    entry: &GpuEntry,
    labels: &[(&'static str, String)],
    (now, window): (Instant, Duration),
    xids_known: bool,
    out: &mut Families,
) {
    let labels = with_label(labels, "window_size_in_ms", &window.as_millis().to_string());
    let counts = entry.xids_within(now, window);
    if counts.is_empty() && xids_known {
        out.gauge("DCGM_EXP_XID_ERRORS_COUNT", &labels, 0.0);
    }
    for (xid, count) in counts {
        out.gauge(
            "DCGM_EXP_XID_ERRORS_COUNT",
            &with_label(&labels, "xid", &xid.to_string()),
            count as f64,
        );
    }
}

/// `mlnode_gpu_info`'s labels: the GPU's, and what NVML says of it that no other series carries
/// (each left out where NVML does not say).
fn info_labels(
    device: &Labels,
    identity: &GpuIdentity,
    cuda_driver_version: Option<i32>,
) -> Labels {
    let mut labels = device.clone();
    if let Some(minor) = identity.minor_number {
        labels.push(("minor_number", minor.to_string()));
    }
    if let Some((major, minor)) = identity.compute_capability {
        labels.push(("cuda_compute_capability", format!("{major}.{minor}")));
    }
    // NVML's 1000 × major + 10 × minor, as nvidia-smi prints it ("12.4").
    if let Some(version) = cuda_driver_version {
        labels.push((
            "cuda_driver_version",
            format!("{}.{}", version / 1000, version % 1000 / 10),
        ));
    }
    labels
}
