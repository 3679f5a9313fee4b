//! What the RDMA devices say about the fabric, as plain facts for the readiness gate's
//! `FabricHealthy` condition ([`mlnode_core::health`]): an EFA function on the PCI bus the driver
//! registered no device for, fewer EFA devices than the node must have, a port that is not ACTIVE,
//! and a link that flaps (its `link_downed` counter rising more than `flap_threshold` times within
//! `flap_window`). Pure functions of one read of the tree, the bus and the instant; tested on
//! made-up ones.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::settings::RdmaSettings;
use super::sysfs::{self, Fabric, State};
use mlnode_core::health::{DeviceKind, FromNode, HealthSource, Problem, Report};

/// The RDMA collector as a [`HealthSource`]: it reads the tree at each report.
pub struct RdmaHealth {
    settings: RdmaSettings,
    flaps: Flaps,
}

impl RdmaHealth {
    pub fn new(settings: RdmaSettings) -> RdmaHealth {
        RdmaHealth {
            settings,
            flaps: Flaps::default(),
        }
    }
}

impl HealthSource for RdmaHealth {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Fabric
    }

    fn report(&mut self, _from_node: &FromNode, now: Instant) -> Report {
        // Of the counters, only what the verdicts read.
        let fabric =
            sysfs::read(&self.settings.sysfs_root, &|c| c == "link_downed").unwrap_or_default();
        let on_bus = crate::pci::scan(&self.settings.pci_devices, crate::pci::is_efa_device)
            .map(|scan| scan.devices)
            .unwrap_or_default();
        let limits = Limits {
            expected_efa_devices: self.settings.expected_efa_devices,
            flap_threshold: u64::from(self.settings.flap_threshold.get()),
            flap_window: self.settings.flap_window.get(),
        };
        assess(&fabric, &on_bus, &limits, &mut self.flaps, now)
    }
}

/// What a verdict is measured against.
pub struct Limits {
    pub expected_efa_devices: u32,
    pub flap_threshold: u64,
    pub flap_window: Duration,
}

/// The `link_downed` readings of each port within the flap window, and the last one before it.
#[derive(Default)]
pub struct Flaps {
    seen: BTreeMap<(String, u32), VecDeque<(Instant, u64)>>,
}

impl Flaps {
    /// How often the port's link went down within `window` up to `now`, given its counter now.
    fn downs(
        &mut self,
        port: (String, u32),
        link_downed: u64,
        now: Instant,
        window: Duration,
    ) -> u64 {
        let readings = self.seen.entry(port).or_default();
        // A counter that went backwards (a driver reload) starts the count again.
        if readings.back().is_some_and(|&(_, last)| link_downed < last) {
            readings.clear();
        }
        readings.push_back((now, link_downed));
        // Keep one reading at or before the window's start: the baseline of the rises within it.
        while readings.len() > 1 && now.saturating_duration_since(readings[1].0) >= window {
            readings.pop_front();
        }
        link_downed - readings.front().map_or(link_downed, |&(_, first)| first)
    }
}

/// The report on `fabric`, with the EFA functions `on_bus` (`0000:10:00.0`).
pub fn assess(
    fabric: &Fabric,
    on_bus: &[String],
    limits: &Limits,
    flaps: &mut Flaps,
    now: Instant,
) -> Report {
    let mut report = Report::new(DeviceKind::Fabric);
    report.devices = fabric.devices.len();
    let efa: Vec<&sysfs::Device> = fabric
        .devices
        .iter()
        .filter(|d| d.driver.as_deref() == Some("efa"))
        .collect();
    for function in on_bus {
        if !efa
            .iter()
            .any(|d| d.pci_bus_id.as_deref() == Some(function.as_str()))
        {
            report.problems.push(Problem::new(
                "EFADeviceMissing",
                format!("the EFA function {function} is on the PCI bus but has no RDMA device: the efa driver did not register it"),
            ));
        }
    }
    let expected = limits.expected_efa_devices as usize;
    if efa.len() < expected {
        report.problems.push(Problem::new(
            "EFADeviceMissing",
            format!(
                "{} of the {expected} EFA devices this node must have are registered (rdma.expected_efa_devices)",
                efa.len()
            ),
        ));
    }
    for device in &fabric.devices {
        for port in &device.ports {
            let name = format!("{} port {}", device.name, port.number);
            if let Some(state) = port.state.as_ref().filter(|s| s.id != State::ACTIVE) {
                let physical = port
                    .phys_state
                    .as_ref()
                    .map(|p| format!(", physical state {}", p.name))
                    .unwrap_or_default();
                report.problems.push(Problem::new(
                    "RDMAPortNotActive",
                    format!("{name} is {}{physical}", state.name),
                ));
            }
            let Some(&link_downed) = port.counters.get("link_downed") else {
                continue;
            };
            let downs = flaps.downs(
                (device.name.clone(), port.number),
                link_downed,
                now,
                limits.flap_window,
            );
            if downs > limits.flap_threshold {
                report.problems.push(Problem::new(
                    "RDMALinkFlapping",
                    format!(
                        "{name} went down {downs} times in {} (link_downed {link_downed}; more than {} is flapping)",
                        humantime::format_duration(limits.flap_window),
                        limits.flap_threshold
                    ),
                ));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, link_downed: Option<u64>) -> sysfs::Port {
        sysfs::Port {
            number: 1,
            state: State::parse(state),
            phys_state: State::parse(if state.starts_with('4') {
                "5: LinkUp"
            } else {
                "3: Disabled"
            }),
            counters: link_downed
                .map(|n| [("link_downed".to_string(), n)].into())
                .unwrap_or_default(),
            ..sysfs::Port::default()
        }
    }

    fn efa(name: &str, bus_id: &str) -> sysfs::Device {
        sysfs::Device {
            name: name.into(),
            driver: Some("efa".into()),
            pci_bus_id: Some(bus_id.into()),
            ports: vec![port("4: ACTIVE", None)],
            ..sysfs::Device::default()
        }
    }

    fn limits(expected: u32) -> Limits {
        Limits {
            expected_efa_devices: expected,
            flap_threshold: 2,
            flap_window: Duration::from_secs(600),
        }
    }

    #[test]
    fn a_function_without_its_device_and_a_short_count_are_named() {
        let fabric = Fabric {
            devices: vec![efa("rdmap16s27", "0000:10:1b.0")],
            ..Fabric::default()
        };
        let bus = ["0000:10:1b.0".to_string(), "0000:20:1b.0".to_string()];
        let report = assess(
            &fabric,
            &bus,
            &limits(2),
            &mut Flaps::default(),
            Instant::now(),
        );
        let reasons: Vec<&str> = report.problems.iter().map(|p| p.reason.as_str()).collect();
        assert_eq!(reasons, ["EFADeviceMissing", "EFADeviceMissing"]);
        assert!(report.problems[0].message.contains("0000:20:1b.0"));
        assert!(report.problems[1].message.contains("1 of the 2"));
        let whole = assess(
            &fabric,
            &bus[..1],
            &limits(1),
            &mut Flaps::default(),
            Instant::now(),
        );
        assert!(whole.problems.is_empty(), "{:?}", whole.problems);
        assert_eq!(whole.devices, 1);
    }

    #[test]
    fn a_port_not_active_is_named_with_its_physical_state() {
        let mut hca = efa("mlx5_0", "0000:c1:00.0");
        hca.driver = Some("mlx5_core".into());
        hca.ports = vec![port("1: DOWN", Some(0))];
        let fabric = Fabric {
            devices: vec![hca],
            ..Fabric::default()
        };
        let report = assess(
            &fabric,
            &[],
            &limits(0),
            &mut Flaps::default(),
            Instant::now(),
        );
        assert_eq!(report.problems.len(), 1);
        assert_eq!(report.problems[0].reason, "RDMAPortNotActive");
        assert_eq!(
            report.problems[0].message,
            "mlx5_0 port 1 is DOWN, physical state Disabled"
        );
    }

    #[test]
    fn a_link_flaps_when_it_goes_down_more_than_the_threshold_within_the_window() {
        let t0 = Instant::now();
        let at = |minutes: u64| t0 + Duration::from_secs(60 * minutes);
        let mut flaps = Flaps::default();
        let key = || ("mlx5_0".to_string(), 1);
        let window = Duration::from_secs(600);
        for (link_downed, minute, downs, why) in [
            (5, 0, 0, "history before the first reading"),
            (7, 2, 2, "two within the window"),
            (8, 4, 3, "flapping: more than 2"),
            (8, 13, 1, "the first two fell out of the window"),
            (8, 20, 0, "quiet for a window"),
            (1, 21, 0, "a driver reload starts again"),
        ] {
            assert_eq!(
                flaps.downs(key(), link_downed, at(minute), window),
                downs,
                "{why}"
            );
        }
        let mut hca = efa("mlx5_0", "0000:c1:00.0");
        hca.ports = vec![port("4: ACTIVE", Some(10))];
        let fabric = |downed| Fabric {
            devices: vec![sysfs::Device {
                ports: vec![port("4: ACTIVE", Some(downed))],
                ..hca.clone()
            }],
            ..Fabric::default()
        };
        let mut flaps = Flaps::default();
        assert!(assess(&fabric(10), &[], &limits(0), &mut flaps, at(0))
            .problems
            .is_empty());
        let report = assess(&fabric(13), &[], &limits(0), &mut flaps, at(1));
        assert_eq!(report.problems[0].reason, "RDMALinkFlapping");
        assert!(
            report.problems[0]
                .message
                .contains("went down 3 times in 10m"),
            "{}",
            report.problems[0].message
        );
    }
}
