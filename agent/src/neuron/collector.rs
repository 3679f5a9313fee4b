//! The Neuron series, read from sysfs at scrape time (the server gathers off the async runtime).
//! Labels follow neuron-monitor-prometheus: `neuron_device_index`, `neuroncore` (the global core
//! index: device index x cores per device + core), `instance_type`; plus `pod`, `namespace`,
//! `container` for devices or cores the kubelet assigned to a container.

use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::counters::MonotonicCounters;
use super::sysfs::{self, DeviceSnapshot};
use crate::config::NeuronSettings;
use crate::kubelet::pod_resources::{Assignments, SharedAssignments};
use crate::metrics::family::{descs, with_label, Families, FamilySpec, Labels};

const FAMILIES: [FamilySpec; 14] = [
    ("mlnode_neuron_device_info", "A Neuron device the driver reports; always 1.", MetricType::GAUGE),
    ("mlnode_neuron_device_memory_bytes", "NeuronCore device memory in use, per category.", MetricType::GAUGE),
    ("mlnode_neuron_device_memory_peak_bytes", "Peak NeuronCore device memory use, per category.", MetricType::GAUGE),
    ("mlnode_neuron_host_memory_bytes", "Host memory in use by the Neuron device, per category.", MetricType::GAUGE),
    ("mlnode_neuron_hardware_ecc_events_total", "ECC events reported by the device, per event type.", MetricType::COUNTER),
    ("mlnode_neuron_execution_status_total", "NeuronCore executions, per outcome.", MetricType::COUNTER),
    ("mlnode_neuron_model_loads_total", "Models loaded on the NeuronCore.", MetricType::COUNTER),
    ("mlnode_neuron_inferences_total", "Inferences run on the NeuronCore.", MetricType::COUNTER),
    ("mlnode_neuron_core_resets_total", "NeuronCore resets, requested and failed.", MetricType::COUNTER),
    ("mlnode_neuron_core_busy_seconds_total", "Time the NeuronCore was in use.", MetricType::COUNTER),
    ("mlnode_neuron_power_utilization_ratio", "Average device power over the driver's last one-minute sample, as a fraction of its maximum.", MetricType::GAUGE),
    ("mlnode_neuron_sysfs_read_errors_total", "Neuron sysfs files that exist but could not be read or parsed, per kind of path.", MetricType::COUNTER),
    ("mlnode_neuron_counter_resets_total", "Neuron sysfs counters seen going backwards (reset by a write or a driver reload), per kind of path.", MetricType::COUNTER),
    ("mlnode_neuron_device_count", "Neuron devices the driver reports.", MetricType::GAUGE),
];

/// `nc_time_in_use` is in microseconds.
const MICROSECONDS: f64 = 1e-6;

pub struct NeuronCollector {
    settings: NeuronSettings,
    assignments: SharedAssignments,
    /// Extended resources whose device ids are Neuron device indexes (`aws.amazon.com/neuron`).
    device_resources: Vec<String>,
    /// Extended resources whose device ids are global NeuronCore indexes (`aws.amazon.com/neuroncore`).
    core_resources: Vec<String>,
    state: Mutex<State>,
    descs: Vec<Desc>,
}

#[derive(Default)]
struct State {
    counters: MonotonicCounters,
    read_errors: std::collections::BTreeMap<&'static str, u64>,
}

impl NeuronCollector {
    pub fn new(
        settings: NeuronSettings,
        assignments: SharedAssignments,
        device_resources: Vec<String>,
        core_resources: Vec<String>,
    ) -> prometheus::Result<NeuronCollector> {
        let descs = descs(&FAMILIES)?;
        Ok(NeuronCollector {
            settings,
            assignments,
            device_resources,
            core_resources,
            state: Mutex::new(State::default()),
            descs,
        })
    }

    fn device_labels(&self, device: &DeviceSnapshot, assignments: &Assignments) -> Labels {
        let instance_type = Some(self.settings.instance_type.clone())
            .filter(|t| !t.is_empty())
            .or_else(|| device.instance_type.clone())
            .unwrap_or_default();
        let mut labels = vec![
            ("neuron_device_index", device.index.to_string()),
            ("instance_type", instance_type),
        ];
        if !self.settings.availability_zone.is_empty() {
            labels.push(("availability_zone", self.settings.availability_zone.clone()));
        }
        if let Some(a) = assignments.find(&self.device_resources, &device.index.to_string()) {
            labels.extend([
                ("pod", a.pod.clone()),
                ("namespace", a.namespace.clone()),
                ("container", a.container.clone()),
            ]);
        }
        labels
    }

    fn core_labels(
        &self,
        device: &DeviceSnapshot,
        global_core: u32,
        assignments: &Assignments,
    ) -> Labels {
        let mut labels = self.device_labels(device, assignments);
        let assigned = labels.iter().any(|(name, _)| *name == "pod");
        labels.insert(1, ("neuroncore", global_core.to_string()));
        if !assigned {
            if let Some(a) = assignments.find(&self.core_resources, &global_core.to_string()) {
                labels.extend([
                    ("pod", a.pod.clone()),
                    ("namespace", a.namespace.clone()),
                    ("container", a.container.clone()),
                ]);
            }
        }
        labels
    }
}

impl Collector for NeuronCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snapshot = sysfs::read(&self.settings.sysfs_root);
        let assignments = self
            .assignments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State {
            counters,
            read_errors,
        } = &mut *state;
        let mut out = Families::default();
        out.gauge(
            "mlnode_neuron_device_count",
            &[],
            snapshot.devices.len() as f64,
        );
        for device in &snapshot.devices {
            let labels = self.device_labels(device, &assignments);
            let mut info = labels.clone();
            info.push(("arch_type", device.arch_type.clone().unwrap_or_default()));
            info.push((
                "device_name",
                device.device_name.clone().unwrap_or_default(),
            ));
            info.push(("neuroncore_count", device.cores.len().to_string()));
            out.gauge("mlnode_neuron_device_info", &info, 1.0);
            for (category, stat) in &device.host_memory {
                if let Some(total) = stat.total {
                    out.gauge(
                        "mlnode_neuron_host_memory_bytes",
                        &with_label(&labels, "category", category),
                        total as f64,
                    );
                }
            }
            for (event, raw) in &device.hardware {
                let value = counters.observe((device.index, None, "hardware", event.clone()), *raw);
                out.counter(
                    "mlnode_neuron_hardware_ecc_events_total",
                    &with_label(&labels, "event_type", event),
                    value,
                );
            }
            if let Some(power) = device.power.as_ref().filter(|p| p.is_valid()) {
                out.gauge(
                    "mlnode_neuron_power_utilization_ratio",
                    &labels,
                    power.avg_percent / 100.0,
                );
            }
            let cores_per_device = device.cores.len() as u32;
            for core in &device.cores {
                let global = device.index * cores_per_device + core.index;
                let labels = self.core_labels(device, global, &assignments);
                for (category, stat) in &core.device_memory {
                    if let Some(total) = stat.total {
                        out.gauge(
                            "mlnode_neuron_device_memory_bytes",
                            &with_label(&labels, "category", category),
                            total as f64,
                        );
                    }
                    if let Some(peak) = stat.peak {
                        out.gauge(
                            "mlnode_neuron_device_memory_peak_bytes",
                            &with_label(&labels, "category", category),
                            peak as f64,
                        );
                    }
                }
                for (status, raw) in &core.status {
                    let value = counters.observe(
                        (device.index, Some(core.index), "status", status.clone()),
                        *raw,
                    );
                    out.counter(
                        "mlnode_neuron_execution_status_total",
                        &with_label(&labels, "status_type", status),
                        value,
                    );
                }
                for (name, raw) in &core.other {
                    let value = counters.observe(
                        (device.index, Some(core.index), "other_info", name.clone()),
                        *raw,
                    );
                    match name.as_str() {
                        "model_load_count" => {
                            out.counter("mlnode_neuron_model_loads_total", &labels, value)
                        }
                        "inference_count" => {
                            out.counter("mlnode_neuron_inferences_total", &labels, value)
                        }
                        "reset_req_count" => out.counter(
                            "mlnode_neuron_core_resets_total",
                            &with_label(&labels, "result", "requested"),
                            value,
                        ),
                        "reset_fail_count" => out.counter(
                            "mlnode_neuron_core_resets_total",
                            &with_label(&labels, "result", "failed"),
                            value,
                        ),
                        "nc_time_in_use" => out.counter(
                            "mlnode_neuron_core_busy_seconds_total",
                            &labels,
                            value * MICROSECONDS,
                        ),
                        _ => {}
                    }
                }
            }
        }
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
        out.into_families(&FAMILIES)
    }
}
