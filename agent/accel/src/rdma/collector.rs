//! The RDMA series, read from sysfs at scrape time (the server gathers off the async runtime).
//! Labels are the kernel's names, `device` and `port`, as node_exporter's infiniband collector
//! labels them, so its joins work; each counter keeps the name its driver gives it (`counter`).

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::attribution::attribute;
use super::settings::RdmaSettings;
use super::sysfs;
use crate::counters::MonotonicCounters;
use mlnode_core::assignments::SharedAssignments;
use mlnode_core::metrics::family::{descs, Families, FamilySpec};

const FAMILIES: [FamilySpec; 13] = [
    ("mlnode_rdma_device_count", "RDMA devices the kernel registered (EFA, InfiniBand, RoCE), from /sys/class/infiniband.", MetricType::GAUGE),
    ("mlnode_rdma_efa_pci_devices", "EFA functions (Amazon vendor 0x1d0f, the device ids the EFA driver binds) on the PCI bus; compare with the EFA devices the driver registered.", MetricType::GAUGE),
    ("mlnode_rdma_device_info", "An RDMA device the kernel registered, with the driver bound to it and its PCI function; always 1.", MetricType::GAUGE),
    ("mlnode_rdma_port_state", "The port's logical state, as the kernel numbers it: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.", MetricType::GAUGE),
    ("mlnode_rdma_port_physical_state", "The port's physical state, as the kernel numbers it: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test.", MetricType::GAUGE),
    ("mlnode_rdma_port_rate_bytes_per_second", "The port's active rate (width times lane speed).", MetricType::GAUGE),
    ("mlnode_rdma_port_counter_total", "The port's management (PMA) counters, by the kernel's names: link_downed, link_error_recovery, symbol_error, port_rcv_errors, port_xmit_discards, ...; port_xmit_data and port_rcv_data count 4-byte words.", MetricType::COUNTER),
    ("mlnode_rdma_port_hw_counter_total", "The driver's port statistics (hw_counters), by its names: for EFA tx_bytes, rx_bytes, rdma_read_bytes, rdma_write_bytes, retrans_pkts, unresponsive_remote_events, impaired_remote_conn_events, ...", MetricType::COUNTER),
    ("mlnode_rdma_device_hw_counter_total", "The driver's device statistics (hw_counters), by its names: for EFA submitted_cmds, cmds_err, create_qp_err, ...", MetricType::COUNTER),
    ("mlnode_rdma_sysfs_read_errors_total", "RDMA sysfs reads that failed, by kind: vanished (a device gone while read), unreadable, parse (a value in no format the kernel writes), too_many (past a bound).", MetricType::COUNTER),
    ("mlnode_rdma_pod_device", "A container holds the RDMA device, from the kubelet's pod-resources (kubelet.rdma_resource_names: one device per id; kubelet.rdma_shared_resource_names: every device); always 1. Join on device for a pod's RDMA traffic.", MetricType::GAUGE),
    ("mlnode_rdma_pod_device_ids_unresolved", "Device ids held under kubelet.rdma_resource_names that name no RDMA device here (by device, uverbs or PCI name): whose those devices are is not known.", MetricType::GAUGE),
    ("mlnode_rdma_counter_resets_total", "RDMA counters seen going backwards (a driver reload), by kind of counter; the exported counter goes on from where it was.", MetricType::COUNTER),
];

/// Which counter: device, port (None: the device's own), kind, name.
type CounterKey = (String, Option<u32>, &'static str, String);

pub struct RdmaCollector {
    settings: RdmaSettings,
    holders: Option<Holders>,
    descs: Vec<Desc>,
    state: Mutex<State>,
}

/// Who holds the devices: the kubelet's assignments, and the resources that are RDMA devices.
pub struct Holders {
    pub assignments: SharedAssignments,
    /// One device per id (`vpc.amazonaws.com/efa`).
    pub exclusive: Vec<String>,
    /// A pool whose every holder gets every device (k8s-rdma-shared-dev-plugin).
    pub shared: Vec<String>,
}

#[derive(Default)]
struct State {
    counters: MonotonicCounters<CounterKey>,
    errors: std::collections::BTreeMap<&'static str, u64>,
    /// Kinds of read error already in the log.
    said: BTreeSet<&'static str>,
    /// Whether a device id that names no device here was logged.
    said_unresolved: bool,
}

impl RdmaCollector {
    pub fn new(
        settings: RdmaSettings,
        holders: Option<Holders>,
    ) -> prometheus::Result<RdmaCollector> {
        Ok(RdmaCollector {
            settings,
            holders,
            descs: descs(FAMILIES.iter())?,
            state: Mutex::new(State::default()),
        })
    }
}

impl Collector for RdmaCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut out = Families::default();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State {
            counters,
            errors,
            said,
            said_unresolved,
        } = &mut *state;
        let settings = &self.settings;
        match sysfs::read(&settings.sysfs_root, &|c| settings.exports(c)) {
            Ok(fabric) => {
                out.gauge("mlnode_rdma_device_count", &[], fabric.devices.len() as f64);
                for device in &fabric.devices {
                    collect_device(device, counters, &mut out);
                }
                if let Some(holders) = &self.holders {
                    self.collect_holders(&fabric.devices, holders, said_unresolved, &mut out);
                }
                for (kind, n) in fabric.errors {
                    *errors.entry(kind).or_default() += n;
                    if said.insert(kind) {
                        tracing::warn!(kind, sysfs_root = %self.settings.sysfs_root.display(), "cannot read part of the RDMA devices' sysfs; what could not be read is left out (counted in mlnode_rdma_sysfs_read_errors_total)");
                    }
                }
            }
            Err(why) => {
                *errors.entry("unreadable").or_default() += 1;
                if said.insert("unreadable") {
                    tracing::warn!(%why, "cannot read the RDMA devices");
                }
            }
        }
        if let Ok(scan) = crate::pci::scan(&self.settings.pci_devices, crate::pci::is_efa_device) {
            out.gauge(
                "mlnode_rdma_efa_pci_devices",
                &[],
                scan.devices.len() as f64,
            );
        }
        for (kind, n) in errors.iter() {
            out.counter(
                "mlnode_rdma_sysfs_read_errors_total",
                &[("kind", kind.to_string())],
                *n as f64,
            );
        }
        for (kind, n) in counters.resets() {
            out.counter(
                "mlnode_rdma_counter_resets_total",
                &[("kind", kind.to_string())],
                *n as f64,
            );
        }
        out.into_families(FAMILIES.iter())
    }
}

impl RdmaCollector {
    fn collect_holders(
        &self,
        devices: &[sysfs::Device],
        holders: &Holders,
        said_unresolved: &mut bool,
        out: &mut Families,
    ) {
        let assignments = holders.assignments.get();
        let resolve = |uverbs: &_| {
            attribute(
                devices,
                &assignments,
                &holders.exclusive,
                &holders.shared,
                uverbs,
            )
        };
        let mut found = resolve(&Default::default());
        // The uverbs names are read only when an id is none of the devices' own names.
        if !found.unresolved.is_empty() {
            found = resolve(&sysfs::uverbs_devices(&self.settings.sysfs_root));
        }
        for (holder, device) in &found.held {
            out.gauge(
                "mlnode_rdma_pod_device",
                &[
                    ("device", device.clone()),
                    ("pod", holder.pod.clone()),
                    ("namespace", holder.namespace.clone()),
                    ("container", holder.container.clone()),
                ],
                1.0,
            );
        }
        out.gauge(
            "mlnode_rdma_pod_device_ids_unresolved",
            &[],
            found.unresolved.len() as f64,
        );
        if let (false, Some(id)) = (*said_unresolved, found.unresolved.first()) {
            *said_unresolved = true;
            tracing::warn!(id, resources = ?holders.exclusive, "a device id the kubelet lists names no RDMA device here (by device, uverbs or PCI name): its holder's RDMA traffic cannot be told (counted in mlnode_rdma_pod_device_ids_unresolved)");
        }
    }
}

fn collect_device(
    device: &sysfs::Device,
    counters: &mut MonotonicCounters<CounterKey>,
    out: &mut Families,
) {
    let name = || ("device", device.name.clone());
    out.gauge(
        "mlnode_rdma_device_info",
        &[
            name(),
            ("driver", device.driver.clone().unwrap_or_default()),
            ("pci_bus_id", device.pci_bus_id.clone().unwrap_or_default()),
        ],
        1.0,
    );
    for (counter, raw) in &device.hw_counters {
        let key = (device.name.clone(), None, "device_hw", counter.clone());
        out.counter(
            "mlnode_rdma_device_hw_counter_total",
            &[name(), ("counter", counter.clone())],
            counters.observe(key, "device_hw", *raw),
        );
    }
    for port in &device.ports {
        let labels = [name(), ("port", port.number.to_string())];
        if let Some(state) = &port.state {
            let mut with_layer = labels.to_vec();
            with_layer.push(("link_layer", port.link_layer.clone().unwrap_or_default()));
            out.gauge("mlnode_rdma_port_state", &with_layer, f64::from(state.id));
        }
        if let Some(state) = &port.phys_state {
            out.gauge(
                "mlnode_rdma_port_physical_state",
                &labels,
                f64::from(state.id),
            );
        }
        if let Some(rate) = port.rate_bytes_per_second {
            out.gauge("mlnode_rdma_port_rate_bytes_per_second", &labels, rate);
        }
        for (family, kind, values) in [
            ("mlnode_rdma_port_counter_total", "port", &port.counters),
            (
                "mlnode_rdma_port_hw_counter_total",
                "port_hw",
                &port.hw_counters,
            ),
        ] {
            for (counter, raw) in values {
                let key = (
                    device.name.clone(),
                    Some(port.number),
                    kind,
                    counter.clone(),
                );
                let mut with_counter = labels.to_vec();
                with_counter.push(("counter", counter.clone()));
                out.counter(family, &with_counter, counters.observe(key, kind, *raw));
            }
        }
    }
}
