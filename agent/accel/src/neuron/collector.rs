//! The Neuron series, read from sysfs at scrape time (the server gathers off the async runtime).
//! Labels follow neuron-monitor-prometheus: `neuron_device_index`, `neuroncore` (the runtime's
//! logical core index, node-wide; see [`super::cores`]), `instance_type` (the EC2 type, when
//! known); plus `physical_core` on series the driver keeps per physical core, and `pod`,
//! `namespace`, `container` for devices or cores the kubelet assigned to a container.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::cores::{Family, Layout};
use super::monitor_input::{self, SharedRuntimes};
use super::monitor_names::{self, SystemReader};
use super::settings::{LogicalNcConfig, NeuronSettings};
use super::sysfs::{self, CoreSnapshot, DeviceSnapshot, MemoryStat};
use super::utilization::Utilization;
use super::SharedNodeLabels;
use crate::counters::{MonotonicCounters, Rises};
use mlnode_core::assignments::{Assignment, Assignments, SharedAssignments};
use mlnode_core::metrics::family::{descs, with_label, Families, FamilySpec, Labels};
use mlnode_core::pods::PodNames;

const FAMILIES: [FamilySpec; 21] = [
    ("mlnode_neuron_pci_devices", "Inferentia/Trainium devices (Amazon vendor 0x1d0f, the device ids the Neuron driver binds) the kernel lists on the PCI bus; compare with mlnode_neuron_device_count, the driver's.", MetricType::GAUGE),
    ("mlnode_neuron_device_info", "A Neuron device the driver reports; always 1. Labels: chip family, device version, serial number, logical and physical core counts.", MetricType::GAUGE),
    ("mlnode_neuron_core_info", "A physical NeuronCore and the logical NeuronCore it belongs to; always 1.", MetricType::GAUGE),
    ("mlnode_neuron_core_utilization_ratio", "Fraction of tensor-engine cycles busy (matmul or weight load) since the previous scrape, per logical NeuronCore; live.", MetricType::GAUGE),
    ("mlnode_neuron_core_tensor_engine_cycles_total", "Tensor-engine cycles per state (matmul, weight_load, idle), per physical NeuronCore; read live from the hardware counters.", MetricType::COUNTER),
    ("mlnode_neuron_core_memory_bytes", "Memory in use by the physical NeuronCore, all categories, per location (device, host).", MetricType::GAUGE),
    ("mlnode_neuron_core_memory_peak_bytes", "Peak memory use of the physical NeuronCore, per location (device, host).", MetricType::GAUGE),
    ("mlnode_neuron_device_memory_bytes", "NeuronCore device memory in use, per category.", MetricType::GAUGE),
    ("mlnode_neuron_device_memory_peak_bytes", "Peak NeuronCore device memory use, per category.", MetricType::GAUGE),
    ("mlnode_neuron_host_memory_bytes", "Host memory in use by the Neuron device, per category.", MetricType::GAUGE),
    ("mlnode_neuron_ecc_errors", "Uncorrected ECC errors the device firmware reports now, per kind; not a counter: a count can move between kinds or go down as the HBM repair state changes.", MetricType::GAUGE),
    ("mlnode_neuron_exited_runtime_executions_total", "NeuronCore executions per outcome, added when a runtime process releases the core (at its exit); flat while a runtime runs.", MetricType::COUNTER),
    ("mlnode_neuron_exited_runtime_model_loads_total", "Models loaded on the NeuronCore, added when a runtime process exits.", MetricType::COUNTER),
    ("mlnode_neuron_exited_runtime_inferences_total", "Inferences run on the NeuronCore, added when a runtime process exits.", MetricType::COUNTER),
    ("mlnode_neuron_exited_runtime_flops_total", "Floating-point operations run on the NeuronCore (2 per multiply-accumulate), added when a runtime process exits.", MetricType::COUNTER),
    ("mlnode_neuron_exited_runtime_busy_seconds_total", "Time the NeuronCore was in use, added when a runtime process exits.", MetricType::COUNTER),
    ("mlnode_neuron_core_resets_total", "NeuronCore resets, requested and failed; live.", MetricType::COUNTER),
    ("mlnode_neuron_power_utilization_ratio", "Average device power above idle over the driver's last one-minute sample, as a fraction of its maximum.", MetricType::GAUGE),
    ("mlnode_neuron_sysfs_read_errors_total", "Neuron sysfs files that exist but could not be read or parsed, per kind of path.", MetricType::COUNTER),
    ("mlnode_neuron_counter_resets_total", "Neuron sysfs counters seen going backwards (reset by a write or a driver reload), per kind of path.", MetricType::COUNTER),
    ("mlnode_neuron_device_count", "Neuron devices the driver reports.", MetricType::GAUGE),
];

/// `nc_time_in_use` is in microseconds (Neuron sysfs user guide).
const MICROSECONDS: f64 = 1e-6;

/// The exit-time counters of `other_info` and the family each feeds.
const EXITED_RUNTIME: [(&str, &str, f64); 4] = [
    (
        "model_load_count",
        "mlnode_neuron_exited_runtime_model_loads_total",
        1.0,
    ),
    (
        "inference_count",
        "mlnode_neuron_exited_runtime_inferences_total",
        1.0,
    ),
    (
        "flop_count",
        "mlnode_neuron_exited_runtime_flops_total",
        1.0,
    ),
    (
        "nc_time_in_use",
        "mlnode_neuron_exited_runtime_busy_seconds_total",
        MICROSECONDS,
    ),
];

pub struct NeuronCollector {
    settings: NeuronSettings,
    assignments: SharedAssignments,
    node_labels: SharedNodeLabels,
    /// neuron-monitor's reports, where `neuron.monitor_input` is set.
    runtimes: Option<SharedRuntimes>,
    /// Extended resources whose device ids are Neuron device indexes (`aws.amazon.com/neuron`).
    device_resources: Vec<String>,
    /// Extended resources whose device ids are logical NeuronCore indexes (`aws.amazon.com/neuroncore`).
    core_resources: Vec<String>,
    /// What of a holder's pod its devices' series carry (`kubelet.pod_uid`, `kubelet.pod_labels`).
    pod_names: PodNames,
    state: Mutex<State>,
    descs: Vec<Desc>,
}

#[derive(Default)]
struct State {
    counters: MonotonicCounters<(u32, Option<u32>, &'static str, String)>,
    utilization: Utilization,
    ecc_rises: Rises<(u32, String)>,
    system: SystemReader,
    read_errors: BTreeMap<&'static str, u64>,
}

impl NeuronCollector {
    pub fn new(
        settings: NeuronSettings,
        assignments: SharedAssignments,
        node_labels: SharedNodeLabels,
        runtimes: Option<SharedRuntimes>,
        device_resources: Vec<String>,
        core_resources: Vec<String>,
        pod_names: PodNames,
    ) -> prometheus::Result<NeuronCollector> {
        let descs = descs(
            FAMILIES
                .iter()
                .chain(optional_families(&settings, &runtimes)),
        )?;
        Ok(NeuronCollector {
            settings,
            assignments,
            node_labels,
            runtimes,
            device_resources,
            core_resources,
            pod_names,
            state: Mutex::new(State::default()),
            descs,
        })
    }

    /// The node's core layout: the family the driver reports, the configured LNC where the family
    /// has one, and whether this is a die-flipped UltraServer node.
    fn layout(&self, snapshot: &sysfs::Snapshot) -> Layout {
        layout(snapshot, &self.settings)
    }

    fn device_labels(
        &self,
        device: &DeviceSnapshot,
        node: &super::NodeLabels,
        assignments: &Assignments,
    ) -> Labels {
        let mut labels = vec![("neuron_device_index", device.index.to_string())];
        if !node.instance_type.is_empty() {
            labels.push(("instance_type", node.instance_type.clone()));
        }
        if !node.availability_zone.is_empty() {
            labels.push(("availability_zone", node.availability_zone.clone()));
        }
        if let Some(a) = assignments.find(&self.device_resources, &device.index.to_string()) {
            self.push_holder(&mut labels, a);
        }
        labels
    }

    /// A device's or core's holder: its names, then what `kubelet.pod_uid` and
    /// `kubelet.pod_labels` add of its pod.
    fn push_holder(&self, labels: &mut Labels, a: &Assignment) {
        labels.extend([
            ("pod", a.pod.clone()),
            ("namespace", a.namespace.clone()),
            ("container", a.container.clone()),
        ]);
        let extra = self.pod_names.of_holder(&a.namespace, &a.pod, labels);
        labels.extend(extra);
    }

    fn core_labels(
        &self,
        device_labels: &Labels,
        global: u32,
        assignments: &Assignments,
    ) -> Labels {
        let mut labels = device_labels.clone();
        labels.insert(1, ("neuroncore", global.to_string()));
        let assigned = labels.iter().any(|(name, _)| *name == "pod");
        if !assigned {
            if let Some(a) = assignments.find(&self.core_resources, &global.to_string()) {
                self.push_holder(&mut labels, a);
            }
        }
        labels
    }
}

/// How this node's cores are grouped: the family the driver names, the LNC the runtime uses
/// (`neuron.logical_nc_config`), and on Trn2 whether this UltraServer node's dies are swapped.
pub(crate) fn layout(snapshot: &sysfs::Snapshot, settings: &NeuronSettings) -> Layout {
    let family = snapshot
        .devices
        .iter()
        .find_map(|d| d.instance_type.as_deref())
        .map(Family::from_driver)
        .unwrap_or(Family::Other(String::new()));
    let lnc = match (family.has_lnc(), settings.logical_nc_config) {
        (false, _) => 1,
        (true, LogicalNcConfig::Auto) => family.default_lnc(),
        (true, LogicalNcConfig::Fixed(n)) => n,
    };
    let die_flipped = family == Family::Trn2
        && sysfs::ultraserver_node_id(&settings.class_root).is_some_and(|id| id == 1 || id == 3);
    Layout {
        family,
        lnc,
        die_flipped,
    }
}

impl Collector for NeuronCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = sysfs::read(&self.settings.sysfs_root);
        let layout = self.layout(&snapshot);
        let node = self
            .node_labels
            .read(|labels| labels.resolve(&self.settings));
        let assignments = self.assignments.get();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Families::default();
        out.gauge(
            "mlnode_neuron_device_count",
            &[],
            snapshot.devices.len() as f64,
        );
        if let Ok(bus) = crate::pci::scan(&self.settings.pci_devices, crate::pci::is_neuron_device)
        {
            out.gauge("mlnode_neuron_pci_devices", &[], bus.devices.len() as f64);
        }
        // neuron-monitor's view of the node, gathered only where its names are exported.
        let mut view = self.settings.monitor_names.then(|| monitor_names::View {
            devices: snapshot.devices.len() as u32,
            ..Default::default()
        });
        for device in &snapshot.devices {
            let labels = self.device_labels(device, &node, &assignments);
            let physical: Vec<u32> = device.cores.iter().map(|c| c.index).collect();
            let logical = layout.logical_cores(device.index, &physical);
            device_series(&mut out, device, &labels, &layout, logical.len());
            if let Some(view) = &mut view {
                view.add_device(device, logical.len(), &mut state.ecc_rises);
            }
            for core in &logical {
                let core_labels = self.core_labels(&labels, core.global, &assignments);
                let cycles_of = |p: u32| {
                    device
                        .cores
                        .iter()
                        .find(|c| c.index == p)
                        .and_then(|c| c.pe_cycles)
                };
                let utilization = state.utilization.observe(device.index, core, cycles_of);
                if let Some(ratio) = utilization {
                    out.gauge("mlnode_neuron_core_utilization_ratio", &core_labels, ratio);
                }
                let physical_cores: Vec<&CoreSnapshot> = device
                    .cores
                    .iter()
                    .filter(|c| core.physical.contains(&c.index))
                    .collect();
                if let Some(view) = &mut view {
                    view.add_core(core.global, utilization, &physical_cores);
                }
                for snapshot in physical_cores {
                    let labels =
                        with_label(&core_labels, "physical_core", &snapshot.index.to_string());
                    physical_core_series(&mut out, device.index, snapshot, &labels, &mut state);
                }
            }
        }
        if let Some(mut view) = view {
            view.system = state.system.read();
            let runtimes = self.runtimes.as_ref().map(|runtimes| runtimes.borrow());
            if let Some(runtimes) = &runtimes {
                let current = runtimes.current(Instant::now());
                out.gauge(
                    "mlnode_neuron_monitor_input_current",
                    &[],
                    if current.is_some() { 1.0 } else { 0.0 },
                );
                out.counter(
                    "mlnode_neuron_monitor_input_rejected_lines_total",
                    &[],
                    runtimes.rejected() as f64,
                );
                if let Some(current) = current {
                    // Per runtime from the report, instead of all runtimes together from sysfs.
                    view.runtimes_reported = true;
                    monitor_input::render(
                        current,
                        &monitor_names::instance_labels(&node),
                        &mut out,
                    );
                }
            }
            monitor_names::render(&view, &node, &mut out);
        }
        let State {
            counters,
            read_errors,
            ..
        } = &mut *state;
        for (kind, n) in &snapshot.read_errors {
            *read_errors.entry(kind).or_default() += n;
        }
        for (kind, n) in read_errors.iter() {
            out.counter(
                "mlnode_neuron_sysfs_read_errors_total",
                &[("path_kind", kind.to_string())],
                *n as f64,
            );
        }
        for (kind, n) in counters.resets() {
            out.counter(
                "mlnode_neuron_counter_resets_total",
                &[("path_kind", kind.to_string())],
                *n as f64,
            );
        }
        out.into_families(
            FAMILIES
                .iter()
                .chain(optional_families(&self.settings, &self.runtimes)),
        )
    }
}

fn device_series(
    out: &mut Families,
    device: &DeviceSnapshot,
    labels: &Labels,
    layout: &Layout,
    logical_cores: usize,
) {
    let mut info = labels.clone();
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    info.extend([
        ("neuron_family", text(&device.instance_type)),
        ("arch_type", text(&device.arch_type)),
        ("device_name", text(&device.device_name)),
        ("serial_number", text(&device.serial_number)),
        ("neuroncore_count", logical_cores.to_string()),
        ("physical_core_count", device.cores.len().to_string()),
        ("logical_nc_config", layout.lnc.to_string()),
    ]);
    out.gauge("mlnode_neuron_device_info", &info, 1.0);
    for (category, stat) in &device.host_memory {
        if let Some(total) = stat.total {
            out.gauge(
                "mlnode_neuron_host_memory_bytes",
                &with_label(labels, "category", category),
                total as f64,
            );
        }
    }
    // Firmware-register snapshots, exported as they read: a monotonic offset would turn a
    // repair-state move between kinds into a permanent rise.
    for (kind, value) in &device.hardware {
        out.gauge(
            "mlnode_neuron_ecc_errors",
            &with_label(labels, "event_type", kind),
            *value as f64,
        );
    }
    if let Some(power) = device.power.as_ref().filter(|p| p.is_valid()) {
        out.gauge(
            "mlnode_neuron_power_utilization_ratio",
            labels,
            power.avg_percent / 100.0,
        );
    }
}

fn physical_core_series(
    out: &mut Families,
    device: u32,
    core: &CoreSnapshot,
    labels: &Labels,
    state: &mut State,
) {
    let mut info = labels.clone();
    info.push(("arch_type", core.arch_type.clone().unwrap_or_default()));
    out.gauge("mlnode_neuron_core_info", &info, 1.0);
    if let Some(cycles) = core.pe_cycles {
        for (name, value) in [
            ("matmul", cycles.matmul),
            ("weight_load", cycles.weight_load),
            ("idle", cycles.idle),
        ] {
            out.counter(
                "mlnode_neuron_core_tensor_engine_cycles_total",
                &with_label(labels, "state", name),
                value as f64,
            );
        }
    }
    for (location, stat) in [
        ("device", core.device_memory_total),
        ("host", core.host_memory),
    ] {
        let labels = with_label(labels, "location", location);
        memory_series(out, CORE_MEMORY, &labels, stat);
    }
    for (category, stat) in &core.device_memory {
        let labels = with_label(labels, "category", category);
        memory_series(out, DEVICE_MEMORY, &labels, *stat);
    }
    let counters = &mut state.counters;
    for (status, raw) in &core.status {
        let value = counters.observe(
            (device, Some(core.index), "status", status.clone()),
            "status",
            *raw,
        );
        out.counter(
            "mlnode_neuron_exited_runtime_executions_total",
            &with_label(labels, "status_type", status),
            value,
        );
    }
    for (name, raw) in &core.other {
        let value = counters.observe(
            (device, Some(core.index), "other_info", name.clone()),
            "other_info",
            *raw,
        );
        if let Some((_, family, scale)) = EXITED_RUNTIME.iter().find(|(n, _, _)| n == name) {
            out.counter(family, labels, value * scale);
            continue;
        }
        let result = match name.as_str() {
            "reset_req_count" => "requested",
            "reset_fail_count" => "failed",
            _ => continue,
        };
        out.counter(
            "mlnode_neuron_core_resets_total",
            &with_label(labels, "result", result),
            value,
        );
    }
}

/// The families `neuron.monitor_names` and `neuron.monitor_input` add.
fn optional_families(
    settings: &NeuronSettings,
    runtimes: &Option<SharedRuntimes>,
) -> Vec<&'static FamilySpec> {
    let mut families = Vec::new();
    if settings.monitor_names {
        families.extend(monitor_names::FAMILIES.iter());
    }
    if runtimes.is_some() {
        families.extend(INPUT_FAMILIES.iter().chain(&monitor_input::FAMILIES));
    }
    families
}

/// How the agent's reading of neuron-monitor's reports is going.
const INPUT_FAMILIES: [FamilySpec; 2] = [
    (
        "mlnode_neuron_monitor_input_current",
        "1 while neuron-monitor's last report (neuron.monitor_input) is under 30 s old, else 0.",
        MetricType::GAUGE,
    ),
    (
        "mlnode_neuron_monitor_input_rejected_lines_total",
        "Lines read from neuron.monitor_input that were not neuron-monitor reports.",
        MetricType::COUNTER,
    ),
];

/// The in-use and peak families of one kind of memory node.
const CORE_MEMORY: [&str; 2] = [
    "mlnode_neuron_core_memory_bytes",
    "mlnode_neuron_core_memory_peak_bytes",
];
const DEVICE_MEMORY: [&str; 2] = [
    "mlnode_neuron_device_memory_bytes",
    "mlnode_neuron_device_memory_peak_bytes",
];

/// A memory node's `total` (in use now) and `peak`, each where the driver has it.
fn memory_series(
    out: &mut Families,
    families: [&'static str; 2],
    labels: &Labels,
    stat: MemoryStat,
) {
    for (name, value) in families.into_iter().zip([stat.total, stat.peak]) {
        if let Some(value) = value {
            out.gauge(name, labels, value as f64);
        }
    }
}
