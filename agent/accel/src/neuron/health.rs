//! What the Neuron collector reports of its devices' health ([`mlnode_core::health`]): every
//! Inferentia/Trainium device on the PCI bus listed by the driver, and no uncorrected ECC error
//! since the agent started. [`assess`] is a pure function of the readings; [`NeuronHealth`] reads
//! them (a few files per device, not the whole tree) and keeps the ECC baselines.

use std::collections::BTreeMap;
use std::time::Instant;

use super::settings::NeuronSettings;
use crate::counters::Rises;
use crate::kernel_log::facts::LogFacts;
use mlnode_core::assignments::{Assignments, SharedAssignments};
use mlnode_core::health::{
    hold, DeviceKind, FromNode, HealthSource, Held, Holdings, Problem, Report,
};
use mlnode_core::shared::Shared;

/// The firmware's counts that mean data was lost. Repairable included: a pending HBM repair needs
/// a reboot to apply.
const UNCORRECTED: [&str; 3] = [
    "mem_ecc_uncorrected",
    "mem_ecc_repairable_uncorrected",
    "sram_ecc_uncorrected",
];

/// The Neuron driver's sysfs tree and the PCI devices directory, read at each report, and which
/// pod holds which device or core.
pub struct NeuronHealth {
    settings: NeuronSettings,
    ecc: Rises<u32>,
    /// What the kernel log says, when that source runs: the runtime's `NEURON_HW_ERR` lines.
    kernel_log: Option<Shared<LogFacts>>,
    assignments: SharedAssignments,
    /// The extended resources whose ids are device indexes, and those whose ids are logical cores.
    resources: (Vec<String>, Vec<String>),
}

impl NeuronHealth {
    pub fn new(
        settings: NeuronSettings,
        kernel_log: Option<Shared<LogFacts>>,
        assignments: SharedAssignments,
        resources: (Vec<String>, Vec<String>),
    ) -> NeuronHealth {
        NeuronHealth {
            settings,
            ecc: Rises::default(),
            kernel_log,
            assignments,
            resources,
        }
    }

    /// The device each logical core (the runtime's and the device plugin's numbering) is on, read
    /// from the driver's core directories only when a pod holds cores.
    fn core_devices(&self, assignments: &Assignments) -> BTreeMap<u32, u32> {
        if assignments.of(&self.resources.1).next().is_none() {
            return BTreeMap::new();
        }
        let snapshot = super::sysfs::read(&self.settings.sysfs_root);
        let layout = super::collector::layout(&snapshot, &self.settings);
        snapshot
            .devices
            .iter()
            .flat_map(|device| {
                let physical: Vec<u32> = device.cores.iter().map(|c| c.index).collect();
                layout
                    .logical_cores(device.index, &physical)
                    .into_iter()
                    .map(move |core| (core.global, device.index))
            })
            .collect()
    }
}

impl HealthSource for NeuronHealth {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Neuron
    }

    fn report(&mut self, from_node: &FromNode, _now: Instant) -> Report {
        let hardware = super::sysfs::read_ecc(&self.settings.sysfs_root);
        let on_bus = crate::pci::scan(&self.settings.pci_devices, crate::pci::is_neuron_device)
            .ok()
            .map(|bus| bus.devices.len());
        let mut report = assess(
            &hardware,
            on_bus,
            from_node.expected.neuron_devices,
            &mut self.ecc,
        );
        if let Some(log) = &self.kernel_log {
            report
                .problems
                .extend(logged_errors(&log.borrow(), from_node));
        }
        let assignments = self.assignments.get();
        let listed: Vec<u32> = hardware.keys().copied().collect();
        report.holdings = holdings(
            &listed,
            &self.core_devices(&assignments),
            &assignments,
            &self.resources,
        );
        report
    }
}

/// Which Neuron device each pod holds: a device by its index under the device resources, a core
/// by the device it is on (`core_devices`: logical core → device) under the core resources. A pod
/// holding a device the driver does not list, or a core on none, holds it unlisted.
pub fn holdings(
    listed: &[u32],
    core_devices: &BTreeMap<u32, u32>,
    assignments: &Assignments,
    (device_resources, core_resources): &(Vec<String>, Vec<String>),
) -> Holdings {
    let mut holdings = Holdings::new();
    let device = |index: u32| Held {
        device: index.to_string(),
        name: format!("Neuron device {index}"),
        listed: listed.contains(&index),
    };
    for (id, holder) in assignments.every_holder(device_resources) {
        let held = match id.parse::<u32>() {
            Ok(index) => device(index),
            Err(_) => unresolved(id),
        };
        hold(&mut holdings, holder, held);
    }
    for (id, holder) in assignments.every_holder(core_resources) {
        let on = id
            .parse::<u32>()
            .ok()
            .and_then(|core| core_devices.get(&core));
        let held = match on {
            Some(&index) => Held {
                name: format!("NeuronCore {id} of Neuron device {index}"),
                ..device(index)
            },
            None => unresolved(&format!("NeuronCore {id}")),
        };
        hold(&mut holdings, holder, held);
    }
    holdings
}

fn unresolved(id: &str) -> Held {
    Held {
        device: id.to_string(),
        name: format!("{id}, which the Neuron driver does not list"),
        listed: false,
    }
}

/// Each device and class the runtime logged as `NEURON_HW_ERR` on this boot (SRAM, NeuronCore or
/// HBM uncorrectable, DMA): every one fails the gate, as node-problem-detector's Neuron rules make
/// each permanent. An operator's clearing (docs/readiness.md) clears those logged before it.
pub fn logged_errors(logged: &LogFacts, from_node: &FromNode) -> Vec<Problem> {
    let pending = logged.pending();
    pending
        .into_iter()
        .chain(logged_faults(logged, from_node))
        .collect()
}

fn logged_faults<'a>(
    logged: &'a LogFacts,
    from_node: &'a FromNode,
) -> impl Iterator<Item = Problem> + 'a {
    logged
        .neuron_errors
        .iter()
        .filter(|(_, l)| from_node.outlives_clearing(l.last))
        .map(|((device, class), l)| {
            let named = device.map_or("a Neuron device (the line names none)".to_string(), |d| {
                format!("Neuron device {d}")
            });
            let problem = Problem::new(
                "NeuronHardwareError",
                format!("{named}: the Neuron runtime logged NEURON_HW_ERR={class} {} time(s) on this boot (kernel log)", l.count),
            );
            match device {
                Some(index) => problem.on(&index.to_string()),
                None => problem,
            }
        })
}

/// The report from each device's `stats/hardware` counts (by device index), the number of
/// Inferentia/Trainium devices on the PCI bus (None: the bus could not be read) and the number the
/// node's instance type has (None: no label says). The counts are
/// register snapshots, not counters: on Trn2 errors move between the repairable and unrepairable
/// counts as the HBM repair state changes, and a count can go down. `ecc` sums the rises since the
/// agent started; a fall lowers the baseline, never the errors already seen, and errors from before
/// the start are history.
pub fn assess(
    hardware: &BTreeMap<u32, BTreeMap<String, u64>>,
    on_bus: Option<usize>,
    expected: Option<u32>,
    ecc: &mut Rises<u32>,
) -> Report {
    let mut report = Report::new(DeviceKind::Neuron);
    report.devices = hardware.len();
    report
        .problems
        .extend(count_mismatch(hardware.len(), on_bus, expected));
    for (&device, counts) in hardware {
        let now: u64 = UNCORRECTED.iter().filter_map(|e| counts.get(*e)).sum();
        let since_start = ecc.observe(device, now);
        if since_start > 0 {
            report.problems.push(
                Problem::new(
                    "NeuronUncorrectedECC",
                    format!("Neuron device {device}: {since_start} uncorrected ECC error(s)"),
                )
                .on(&device.to_string()),
            );
        }
    }
    report
}

/// Devices on the bus the driver did not bring up, and fewer on the bus than the node's instance
/// type has (one gone from the bus itself): one problem saying each.
fn count_mismatch(listed: usize, on_bus: Option<usize>, expected: Option<u32>) -> Option<Problem> {
    let on_bus = on_bus?;
    let mut said = Vec::new();
    if on_bus > listed {
        said.push(format!(
            "the PCI bus has {on_bus} Inferentia/Trainium device(s) and the Neuron driver lists {listed}"
        ));
    }
    if let Some(expected) = expected.filter(|&e| (on_bus as u64) < u64::from(e)) {
        said.push(format!(
            "{expected} Neuron device(s) expected ({}), {on_bus} on the PCI bus",
            mlnode_core::health::ACCELERATOR_COUNT_LABEL
        ));
    }
    (!said.is_empty()).then(|| Problem::new("NeuronDeviceCountMismatch", said.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(counts: &[(u32, u64)]) -> BTreeMap<u32, BTreeMap<String, u64>> {
        counts
            .iter()
            .map(|&(device, count)| {
                let hardware = [
                    ("mem_ecc_uncorrected".to_string(), count),
                    ("mem_ecc_corrected".to_string(), 1000),
                ];
                (device, hardware.into())
            })
            .collect()
    }

    #[test]
    fn every_logged_hardware_error_fails_naming_its_device_and_class() {
        let t0 = Instant::now();
        let mut facts = LogFacts {
            history_read: true,
            ..LogFacts::default()
        };
        let mut parser = crate::kernel_log::parse::Parser::default();
        for line in [
            "nrt: NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0123 hostname=h nd-id=3 nc-id=1 serial-num=0x1 action=TERMINATE_INSTANCE",
            "nrt: NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR instance-id=i-0123 hostname=h nd-id=3 nc-id=1 serial-num=0x1 action=TERMINATE_INSTANCE",
            "nrt: NEURON_HW_ERR=DMA_ERROR instance-id=i-0123 hostname=h nd-id=0 nc-id=0 serial-num=0x2 action=TERMINATE_INSTANCE",
        ] {
            facts.apply(parser.line(line).unwrap(), t0);
        }
        let problems = logged_errors(&facts, &FromNode::default());
        let said: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| (p.reason.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(said, [
            ("NeuronHardwareError", "Neuron device 0: the Neuron runtime logged NEURON_HW_ERR=DMA_ERROR 1 time(s) on this boot (kernel log)"),
            ("NeuronHardwareError", "Neuron device 3: the Neuron runtime logged NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR 2 time(s) on this boot (kernel log)"),
        ]);
        let cleared = FromNode {
            cleared_before: Some(t0 + std::time::Duration::from_secs(1)),
            ..FromNode::default()
        };
        assert!(logged_errors(&facts, &cleared).is_empty());
    }

    fn reasons(report: &Report) -> Vec<&str> {
        report.problems.iter().map(|p| p.reason.as_str()).collect()
    }

    /// Errors from before the start are history; a fall (an HBM repair-state change moved errors
    /// out of the summed kinds) neither hides errors seen nor adds any; corrected ones never count.
    #[test]
    fn only_uncorrected_rises_after_the_start_count() {
        let mut ecc = Rises::default();
        let first = assess(&devices(&[(0, 5), (1, 0)]), Some(2), None, &mut ecc);
        assert_eq!((first.devices, reasons(&first).len()), (2, 0));
        let report = assess(&devices(&[(0, 6), (1, 0)]), Some(2), None, &mut ecc);
        assert_eq!(reasons(&report), ["NeuronUncorrectedECC"]);
        assert_eq!(
            report.problems[0].message,
            "Neuron device 0: 1 uncorrected ECC error(s)"
        );
        assess(&devices(&[(0, 2), (1, 0)]), Some(2), None, &mut ecc);
        let report = assess(&devices(&[(0, 4), (1, 0)]), Some(2), None, &mut ecc);
        assert_eq!(
            report.problems[0].message,
            "Neuron device 0: 3 uncorrected ECC error(s)"
        );
    }

    /// A device on the bus the driver did not bring up is a problem; an unreadable bus (None) and
    /// an equal count are not.
    #[test]
    fn a_device_the_driver_does_not_list_is_missed() {
        let listed = devices(&(0..15).map(|d| (d, 0)).collect::<Vec<_>>());
        let report = assess(&listed, Some(16), None, &mut Rises::default());
        assert_eq!(reasons(&report), ["NeuronDeviceCountMismatch"]);
        assert!(report.problems[0]
            .message
            .contains("16 Inferentia/Trainium device(s) and the Neuron driver lists 15"));
        assert!(assess(&listed, Some(15), None, &mut Rises::default())
            .problems
            .is_empty());
        assert!(assess(&listed, None, None, &mut Rises::default())
            .problems
            .is_empty());
    }

    /// A trn2.48xlarge labelled with 16 devices and 15 on the bus misses one; an unlabelled node
    /// or an unreadable bus says nothing.
    #[test]
    fn a_device_gone_from_the_bus_is_missed_against_the_instance_type() {
        let listed = devices(&(0..15).map(|d| (d, 0)).collect::<Vec<_>>());
        let check = |on_bus, expected| assess(&listed, on_bus, expected, &mut Rises::default());
        let report = check(Some(15), Some(16));
        assert_eq!(reasons(&report), ["NeuronDeviceCountMismatch"]);
        assert!(report.problems[0].message.contains("16 Neuron device(s) expected (karpenter.k8s.aws/instance-accelerator-count), 15 on the PCI bus"));
        let as_expected = check(Some(16), Some(16));
        assert!(
            !as_expected.problems[0].message.contains("expected"),
            "16 on the bus as the label says; only the unlisted one is said: {:?}",
            as_expected.problems
        );
        assert!(check(Some(15), Some(15)).problems.is_empty());
        assert!(check(Some(15), None).problems.is_empty());
        assert!(check(None, Some(16)).problems.is_empty());
    }

    /// Neuron device-plugin ids (aws-neuron-sdk's device plugin: `aws.amazon.com/neuron` and
    /// `neurondevice` by device index, `neuroncore` by the runtime's logical core) resolved to
    /// the device whose verdict they share; an index the driver does not list is held unlisted.
    #[test]
    fn a_core_is_held_as_its_device_and_a_device_by_its_index() {
        let holder = |pod: &str| mlnode_core::assignments::Assignment {
            pod: pod.into(),
            namespace: "inference".into(),
            container: "neuron".into(),
        };
        let mut assignments = Assignments::default();
        assignments.assign("aws.amazon.com/neuron", "1", || holder("whole-1"));
        assignments.assign("aws.amazon.com/neuron", "7", || holder("gone-7"));
        assignments.assign("aws.amazon.com/neuroncore", "5", || holder("core-5"));
        assignments.assign("aws.amazon.com/neuroncore", "99", || holder("core-99"));
        let resources = (
            vec!["aws.amazon.com/neuron".to_string()],
            vec!["aws.amazon.com/neuroncore".to_string()],
        );
        // Two devices of four logical cores each (Trn2 at LNC 2).
        let cores: BTreeMap<u32, u32> = (0..8).map(|core| (core, core / 4)).collect();
        let held = holdings(&[0, 1], &cores, &assignments, &resources);
        let of = |pod: &str| {
            let h = &held[&mlnode_core::health::PodRef {
                namespace: "inference".into(),
                name: pod.into(),
            }][0];
            (h.device.clone(), h.name.clone(), h.listed)
        };
        assert_eq!(of("whole-1"), ("1".into(), "Neuron device 1".into(), true));
        assert_eq!(
            of("core-5"),
            ("1".into(), "NeuronCore 5 of Neuron device 1".into(), true)
        );
        assert!(!of("gone-7").2);
        assert_eq!(
            of("core-99").1,
            "NeuronCore 99, which the Neuron driver does not list"
        );
        let mut ecc = Rises::default();
        assess(&devices(&[(1, 0)]), None, None, &mut ecc);
        let report = assess(&devices(&[(1, 2)]), None, None, &mut ecc);
        assert_eq!(report.problems[0].devices, ["1"], "pinned to the device");
    }
}
