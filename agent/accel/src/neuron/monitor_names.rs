//! `neuron.monitor_names: true`: the series neuron-monitor-prometheus.py exports (AWS's exporter for
//! neuron-monitor, `/opt/aws/neuron/bin/neuron-monitor-prometheus.py` in aws-neuronx-tools), with
//! its names, types, units and labels, for what sysfs and procfs can feed from live data, so AWS's
//! Neuron Grafana dashboard and PromQL written for neuron-monitor run unchanged.
//!
//! Names and label sets follow the exporter's `process_*` functions and an exposition it produced
//! on a trn1n.32xlarge (quoted in open-telemetry/opentelemetry-collector-contrib,
//! `receiver/awscontainerinsightreceiver/internal/neuron` tests). What needs the runtime's own data
//! (execution counts and latency, per-runtime vCPU and memory with a `runtime_tag`) is not here:
//! docs/neuron.md lists it.

use std::collections::BTreeMap;

use prometheus::proto::MetricType;

use super::sysfs::{CoreSnapshot, DeviceSnapshot};
use super::NodeLabels;
use crate::counters::Rises;
use mlnode_core::metrics::family::{with_label, Families, FamilySpec, Labels};

pub const FAMILIES: [FamilySpec; 16] = [
    (
        "neuroncore_utilization_ratio",
        "NeuronCore utilization ratio",
        MetricType::GAUGE,
    ),
    (
        "neuroncore_memory_usage_constants",
        "NeuronCore memory utilization for constants",
        MetricType::GAUGE,
    ),
    (
        "neuroncore_memory_usage_model_code",
        "NeuronCore memory utilization for model_code",
        MetricType::GAUGE,
    ),
    (
        "neuroncore_memory_usage_model_shared_scratchpad",
        "NeuronCore memory utilization for model_shared_scratchpad",
        MetricType::GAUGE,
    ),
    (
        "neuroncore_memory_usage_runtime_memory",
        "NeuronCore memory utilization for runtime_memory",
        MetricType::GAUGE,
    ),
    (
        "neuroncore_memory_usage_tensors",
        "NeuronCore memory utilization for tensors",
        MetricType::GAUGE,
    ),
    (
        "neuron_runtime_memory_used_bytes",
        "Runtime memory used bytes",
        MetricType::GAUGE,
    ),
    (
        "hardware_ecc_events_total",
        "Hardware ecc events total",
        MetricType::COUNTER,
    ),
    (
        "neuron_hardware_info",
        "Neuron Hardware Information",
        MetricType::GAUGE,
    ),
    (
        "instance_info",
        "EC2 instance information",
        MetricType::GAUGE,
    ),
    ("system_vcpu_count", "System vCPU count", MetricType::GAUGE),
    (
        "system_vcpu_usage_ratio",
        "System CPU utilization ratio",
        MetricType::GAUGE,
    ),
    (
        "system_memory_total_bytes",
        "System memory total_bytes bytes",
        MetricType::GAUGE,
    ),
    (
        "system_memory_used_bytes",
        "System memory used_bytes bytes",
        MetricType::GAUGE,
    ),
    (
        "system_swap_total_bytes",
        "System swap total_bytes bytes",
        MetricType::GAUGE,
    ),
    (
        "system_swap_used_bytes",
        "System swap used_bytes bytes",
        MetricType::GAUGE,
    ),
];

/// The memory categories neuron-monitor reports per NeuronCore (`process_memory_used`), each a
/// driver `device_mem/<category>` of the same name.
pub const CORE_MEMORY_CATEGORIES: [&str; 5] = [
    "constants",
    "model_code",
    "model_shared_scratchpad",
    "runtime_memory",
    "tensors",
];

/// What one scrape saw, per logical core and device, in the exporter's terms.
#[derive(Default)]
pub struct View {
    pub devices: u32,
    pub cores_per_device: u32,
    /// Per logical core: utilisation, if there is an interval yet, and memory per category.
    pub cores: BTreeMap<u32, (Option<f64>, BTreeMap<String, u64>)>,
    pub host_memory: u64,
    pub device_memory: u64,
    /// Per (device, ECC kind): rises of the firmware's count since the agent started.
    pub ecc_events: BTreeMap<(u32, String), u64>,
    pub system: Option<SystemView>,
    /// neuron-monitor's reports give the runtimes' memory, per runtime: no sysfs total then.
    pub runtimes_reported: bool,
}

impl View {
    /// A device: its logical core count, host memory, and the rises of its firmware ECC counts
    /// (neuron-monitor's ECC series are counters of events).
    pub fn add_device(
        &mut self,
        device: &DeviceSnapshot,
        logical_cores: usize,
        rises: &mut Rises<(u32, String)>,
    ) {
        self.cores_per_device = self.cores_per_device.max(logical_cores as u32);
        self.host_memory += device
            .host_memory
            .values()
            .filter_map(|m| m.total)
            .sum::<u64>();
        for (kind, value) in &device.hardware {
            let events = rises.observe((device.index, kind.clone()), *value);
            self.ecc_events.insert((device.index, kind.clone()), events);
        }
    }

    /// A logical core: its utilisation and the device memory of its physical cores, per category.
    pub fn add_core(&mut self, global: u32, utilization: Option<f64>, physical: &[&CoreSnapshot]) {
        let mut memory: BTreeMap<String, u64> = BTreeMap::new();
        for core in physical {
            self.device_memory += core.device_memory_total.total.unwrap_or(0);
            for (category, stat) in &core.device_memory {
                *memory.entry(category.clone()).or_default() += stat.total.unwrap_or(0);
            }
        }
        self.cores.insert(global, (utilization, memory));
    }
}

/// Host CPU and memory from procfs, as neuron-monitor's `system_data` reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemView {
    pub vcpus: usize,
    /// (user, system) fractions since the previous scrape; None without an interval yet.
    pub usage: Option<(f64, f64)>,
    pub memory_total: u64,
    pub memory_used: u64,
    pub swap_total: u64,
    pub swap_used: u64,
}

/// The exporter's instance labels (`get_instance_labels`), those the node knows.
pub fn instance_labels(node: &NodeLabels) -> Labels {
    [
        ("instance_id", &node.instance_id),
        ("instance_type", &node.instance_type),
        ("availability_zone", &node.availability_zone),
        ("region", &node.region),
    ]
    .into_iter()
    .filter(|(_, value)| !value.is_empty())
    .map(|(name, value)| (name, value.clone()))
    .collect()
}

pub fn render(view: &View, node: &NodeLabels, out: &mut Families) {
    let instance = instance_labels(node);
    out.gauge("instance_info", &instance, 1.0);
    let mut hardware = instance.clone();
    hardware.push(("neuron_device_count", view.devices.to_string()));
    hardware.push((
        "neuroncore_per_device_count",
        view.cores_per_device.to_string(),
    ));
    out.gauge("neuron_hardware_info", &hardware, 1.0);
    for (core, (utilization, memory)) in &view.cores {
        let labels = with_label(&instance, "neuroncore", &core.to_string());
        if let Some(ratio) = utilization {
            out.gauge("neuroncore_utilization_ratio", &labels, *ratio);
        }
        // The exporter sets memory_location to None on these series (a Python None, printed).
        let labels = with_label(&labels, "memory_location", "None");
        for (family, category) in MEMORY_FAMILIES.iter().zip(CORE_MEMORY_CATEGORIES) {
            let bytes = memory.get(category).copied().unwrap_or(0);
            out.gauge(family, &labels, bytes as f64);
        }
    }
    let memory = [
        ("host", view.host_memory),
        ("neuron_device", view.device_memory),
    ];
    for (location, bytes) in memory.into_iter().filter(|_| !view.runtimes_reported) {
        out.gauge(
            "neuron_runtime_memory_used_bytes",
            &with_label(&instance, "memory_location", location),
            bytes as f64,
        );
    }
    for ((device, kind), events) in &view.ecc_events {
        let mut labels = with_label(&instance, "event_type", kind);
        labels.push(("neuron_device_index", device.to_string()));
        out.counter("hardware_ecc_events_total", &labels, *events as f64);
    }
    if let Some(system) = &view.system {
        out.gauge("system_vcpu_count", &instance, system.vcpus as f64);
        if let Some(usage) = system.usage {
            usage_gauges(out, "system_vcpu_usage_ratio", &instance, usage);
        }
        for (family, bytes) in [
            ("system_memory_total_bytes", system.memory_total),
            ("system_memory_used_bytes", system.memory_used),
            ("system_swap_total_bytes", system.swap_total),
            ("system_swap_used_bytes", system.swap_used),
        ] {
            out.gauge(family, &instance, bytes as f64);
        }
    }
}

/// `family{usage_type="user"}` and `{usage_type="system"}`, as the exporter writes CPU shares.
pub fn usage_gauges(
    out: &mut Families,
    family: &'static str,
    labels: &Labels,
    (user, system): (f64, f64),
) {
    for (usage_type, ratio) in [("user", user), ("system", system)] {
        out.gauge(family, &with_label(labels, "usage_type", usage_type), ratio);
    }
}

const MEMORY_FAMILIES: [&str; 5] = [
    "neuroncore_memory_usage_constants",
    "neuroncore_memory_usage_model_code",
    "neuroncore_memory_usage_model_shared_scratchpad",
    "neuroncore_memory_usage_runtime_memory",
    "neuroncore_memory_usage_tensors",
];

/// Reads the host's CPU and memory from procfs (the container's `/proc` shows the host's CPUs and
/// memory: neither file is namespaced), keeping the last CPU times for the next interval.
#[derive(Default)]
pub struct SystemReader {
    last: Option<CpuTimes>,
    /// Kept while no jiffy passes between two scrapes.
    last_usage: Option<(f64, f64)>,
}

impl SystemReader {
    pub fn read(&mut self) -> Option<SystemView> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let now = parse_proc_stat(&stat)?;
        let (memory_total, memory_used, swap_total, swap_used) = parse_meminfo(&meminfo)?;
        let usage = self
            .last
            .and_then(|before| vcpu_usage(before, now))
            .or(self.last_usage);
        self.last = Some(now);
        self.last_usage = usage;
        Some(SystemView {
            vcpus: now.vcpus,
            usage,
            memory_total,
            memory_used,
            swap_total,
            swap_used,
        })
    }
}

/// The `cpu` lines of `/proc/stat` (proc(5)): (vCPUs, aggregate jiffies per field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub vcpus: usize,
    /// user, nice, system, idle, iowait, irq, softirq, steal.
    pub fields: [u64; 8],
}

pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let mut times = CpuTimes::default();
    let mut aggregate = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("cpu") => {
                for (slot, word) in times.fields.iter_mut().zip(words) {
                    *slot = word.parse().ok()?;
                }
                aggregate = true;
            }
            Some(name) if name.starts_with("cpu") => times.vcpus += 1,
            _ => {}
        }
    }
    (aggregate && times.vcpus > 0).then_some(times)
}

/// (user, system) fractions between two readings, grouped as neuron-monitor-prometheus groups
/// them (`process_vcpu_usage`): user = user + nice; system = system + iowait + irq + softirq.
pub fn vcpu_usage(before: CpuTimes, now: CpuTimes) -> Option<(f64, f64)> {
    let delta: Vec<u64> = now
        .fields
        .iter()
        .zip(before.fields)
        .map(|(n, b)| n.checked_sub(b))
        .collect::<Option<_>>()?;
    let all: u64 = delta.iter().sum();
    if all == 0 {
        return None;
    }
    let share = |fields: &[usize]| {
        (fields.iter().map(|&i| delta[i]).sum::<u64>() as f64 / all as f64).min(1.0)
    };
    Some((share(&[0, 1]), share(&[2, 4, 5, 6])))
}

/// `/proc/meminfo` (proc(5), values in kB): (total, used, swap total, swap used); used = total -
/// available, the memory applications cannot have back without reclaim.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64, u64, u64)> {
    let fields: BTreeMap<&str, u64> = text
        .lines()
        .filter_map(|line| {
            let (key, rest) = line.split_once(':')?;
            let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
            Some((key, kb.saturating_mul(1024)))
        })
        .collect();
    let total = *fields.get("MemTotal")?;
    let available = *fields.get("MemAvailable")?;
    let swap_total = fields.get("SwapTotal").copied().unwrap_or(0);
    let swap_free = fields.get("SwapFree").copied().unwrap_or(0);
    Some((
        total,
        total.saturating_sub(available),
        swap_total,
        swap_total.saturating_sub(swap_free),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shapes from proc(5); the test of the collector reads this machine's real /proc.
    const STAT: &str = "cpu  100 20 30 800 10 5 5 0 0 0\ncpu0 50 10 15 400 5 2 3 0 0 0\ncpu1 50 10 15 400 5 3 2 0 0 0\nintr 12345\nctxt 999\n";

    #[test]
    fn proc_stat_and_the_exporters_grouping() {
        let before = parse_proc_stat(STAT).unwrap();
        assert_eq!(before.vcpus, 2);
        let mut now = before;
        // 100 jiffies pass: 30 user + 10 nice, 10 system + 10 iowait, 40 idle.
        for (i, d) in [(0, 30), (1, 10), (2, 10), (4, 10), (3, 40)] {
            now.fields[i] += d;
        }
        assert_eq!(vcpu_usage(before, now), Some((0.4, 0.2)));
        assert_eq!(vcpu_usage(now, now), None, "no time passed");
        assert_eq!(vcpu_usage(now, before), None, "backwards");
        assert_eq!(parse_proc_stat("intr 1\n"), None);
    }

    #[test]
    fn meminfo_used_is_total_less_available() {
        let text = "MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    6000 kB\nSwapTotal:       2000 kB\nSwapFree:        1500 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some((16000 * 1024, 10000 * 1024, 2000 * 1024, 500 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }
}
