//! The GPU series, built at scrape time from [`GpuState`] (the node_exporter way: a scrape reads
//! the latest samples, it never waits on the driver). Label sets follow dcgm-exporter exactly:
//! `pod`, `namespace` and `container` appear only on a GPU assigned to a container, so a custom
//! collector rather than fixed-label vectors.
//!
//! This module walks the GPUs and their MIG devices and works out each one's labels; what is
//! written for each is one reading group's, in a module of its own that declares its series
//! (name, help, type) in one table beside the code writing them: [`inventory`], [`memory`],
//! [`clocks`], [`power`], [`utilization`], [`fabric`], [`recovery`], [`mig`], [`containers`].

use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::attribution::{self, ContainerUse};
use super::state::GpuState;
use super::virtual_gpus::{copy_per_holder, HolderCopy, SharedDevice};
use super::{GpuIdentity, MigInstance};
use crate::kernel_log::facts::LogFacts;
use crate::kernel_log::parse::PciAddress;
use mlnode_core::assignments::{Assignment, Assignments, SharedAssignments};
use mlnode_core::metrics::family::{descs, with_label, Families, FamilySpec, Labels};
use mlnode_core::pods::{PodDirectory, PodNames};
use mlnode_core::shared::Shared;
use recovery::XidLog;

mod clocks;
mod containers;
mod fabric;
mod inventory;
mod memory;
mod mig;
mod power;
mod recovery;
mod utilization;

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
        let descs = descs(families(dcgm_names))?;
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
        let now = Instant::now();
        inventory::collect_node(&state, now, &mut out);
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
            inventory::collect_info(
                identity,
                state.cuda_driver_version,
                &mut self.series(&device, &mut out),
            );
            let labels = self.labels(&device, &identity.uuid, &holders);
            let address = PciAddress::from_nvml(&identity.pci_bus_id);
            listed.extend(address);
            let mut series = self.series(&labels, &mut out);
            recovery::collect_failure(entry, &mut series);
            // Nothing heard from a GPU no source watches is no 0: dcgm-exporter's zeros need one.
            let xids_known =
                state.xids_watched.contains(index) || matches!(xid_log, XidLog::Read(_));
            recovery::collect_xids(entry, address, &xid_log, xids_known, &mut series);
            clocks::collect_reason_seconds(entry, &mut series);
            recovery::collect_xid_window(
                entry,
                (now, state.xid_count_window),
                xids_known,
                &mut series,
            );
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
                mig::collect_xids(*xid, *count, &mut self.series(&instance_labels, &mut out));
            }
            // A stalled sampler's readings are history, not the GPU now.
            let Some(reading) = entry.reading.as_ref().filter(|_| !stalled) else {
                continue;
            };
            let mut series = self.series(&labels, &mut out);
            if let Some(m) = &reading.memory {
                memory::collect(m, &mut series);
            }
            clocks::collect(reading, &mut series);
            power::collect(reading, &mut series);
            utilization::collect(reading, &mut series);
            fabric::collect(reading, &mut series);
            recovery::collect(reading, &mut series);
            mig::collect_mode(reading, &mut series);
            let rows = reading.processes.as_ref().map(|processes| {
                attribution::per_container(processes, &identity.uuid, &pods, &assignments)
            });
            if let Some(rows) = &rows {
                containers::collect_use(
                    rows,
                    self.pod_label_names(),
                    &mut self.series(&device, &mut out),
                );
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
                mig::collect_instance(instance, &mut self.series(&labels, &mut out));
                let rows = instance.processes.as_ref().map(|processes| {
                    attribution::per_container(processes, &instance.uuid, &pods, &assignments)
                });
                if let Some(rows) = &rows {
                    let device =
                        self.instance_device_labels(identity, &state.driver_version, instance);
                    containers::collect_use(
                        rows,
                        self.pod_label_names(),
                        &mut self.series(&device, &mut out),
                    );
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
        if let XidLog::Read(log) = xid_log {
            recovery::collect_unlisted_xids(log, &listed, &mut out);
        }
        copy_per_holder(&mut out, &shared);
        containers::collect_errors(&state, &mut out);
        out.into_families(families(self.dcgm_names))
    }
}

impl GpuCollector {
    fn series<'a>(
        &self,
        labels: &'a [(&'static str, String)],
        out: &'a mut Families,
    ) -> Series<'a> {
        Series {
            labels,
            dcgm_names: self.dcgm_names,
            out,
        }
    }
}

/// One reading group's series as (name, help, type): the agent's own, and dcgm-exporter's (its
/// default counters' names, units and help texts) that `nvml.dcgm_names` adds.
struct Group {
    ours: &'static [FamilySpec],
    dcgm: &'static [FamilySpec],
}

const GROUPS: [&Group; 9] = [
    &inventory::SERIES,
    &memory::SERIES,
    &clocks::SERIES,
    &power::SERIES,
    &utilization::SERIES,
    &fabric::SERIES,
    &recovery::SERIES,
    &mig::SERIES,
    &containers::SERIES,
];

/// Every family the collector can write, dcgm-exporter's with `dcgm_names`.
fn families(dcgm_names: bool) -> impl Iterator<Item = &'static FamilySpec> {
    GROUPS.iter().flat_map(move |group| {
        let dcgm: &'static [FamilySpec] = if dcgm_names { group.dcgm } else { &[] };
        group.ours.iter().chain(dcgm)
    })
}

/// Where a group writes one device's series (a GPU's or a MIG device's): under its labels, and
/// dcgm-exporter's names beside the agent's where `nvml.dcgm_names` asks for them.
struct Series<'a> {
    labels: &'a [(&'static str, String)],
    dcgm_names: bool,
    out: &'a mut Families,
}

impl Series<'_> {
    fn gauge(&mut self, name: &'static str, value: f64) {
        self.out.gauge(name, self.labels, value);
    }

    fn counter(&mut self, name: &'static str, value: f64) {
        self.out.counter(name, self.labels, value);
    }

    /// The device's labels and one more, `(name, value)`.
    fn gauge_by(&mut self, name: &'static str, (label, of): (&'static str, &str), value: f64) {
        self.out
            .gauge(name, &with_label(self.labels, label, of), value);
    }

    fn counter_by(&mut self, name: &'static str, (label, of): (&'static str, &str), value: f64) {
        self.out
            .counter(name, &with_label(self.labels, label, of), value);
    }

    fn dcgm_gauge(&mut self, name: &'static str, value: f64) {
        if self.dcgm_names {
            self.gauge(name, value);
        }
    }

    fn dcgm_counter(&mut self, name: &'static str, value: f64) {
        if self.dcgm_names {
            self.counter(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn each_family_is_declared_by_one_group_under_its_own_naming() {
        let mut seen = BTreeSet::new();
        for group in GROUPS {
            for (name, ..) in group.ours {
                assert!(
                    name.starts_with("mlnode_gpu_"),
                    "{name} among the agent's names"
                );
                assert!(seen.insert(*name), "{name} declared twice");
            }
            for (name, ..) in group.dcgm {
                assert!(
                    name.starts_with("DCGM_"),
                    "{name} among dcgm-exporter's names"
                );
                assert!(seen.insert(*name), "{name} declared twice");
            }
        }
    }
}
