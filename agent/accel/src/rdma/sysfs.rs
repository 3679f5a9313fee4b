//! Reading `/sys/class/infiniband/` into plain data: every RDMA device the kernel registered (EFA,
//! InfiniBand and RoCE HCAs alike), its ports' state, and the counters their drivers expose.
//!
//! The layout and formats are the RDMA core's, `drivers/infiniband/core/sysfs.c` (torvalds/linux
//! at 0147ebcf): `ports/<n>/state` (`"%d: %s"`, NOP DOWN INIT ARMED ACTIVE ACTIVE_DEFER),
//! `ports/<n>/phys_state` (`"%u: %s"`, 1 Sleep .. 5 LinkUp .. 7 Phy Test), `ports/<n>/rate`
//! (`"%d%s Gb/sec (%dX%s)"`), `ports/<n>/link_layer` (InfiniBand, Ethernet, Unknown),
//! `ports/<n>/counters/` (the PMA port counters, only where the driver answers management
//! datagrams: none for EFA; `N/A (no PMA)` when it stops answering), and `hw_counters/` at the
//! device and at each port (the driver's own statistics, `%llu`, beside a `lifespan` setting that
//! is no counter). Everything below a device is found from the listing, so a counter a newer driver
//! adds is read without a code change.
//!
//! Nothing here panics on what a driver (or a test) writes: a value that does not parse is counted
//! by kind and left out, a device that vanishes while it is read is counted and left out, and each
//! listing is bounded, so a huge tree costs a bounded read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// More than any node has: past these the rest is left out and counted (`too_many`).
pub const MAX_DEVICES: usize = 256;
pub const MAX_PORTS: usize = 16;
pub const MAX_COUNTERS: usize = 256;

/// The value of a port's state file: the number and the kernel's name for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub id: u32,
    pub name: String,
}

impl State {
    /// `IB_PORT_ACTIVE`.
    pub const ACTIVE: u32 = 4;
    /// `phys_state` 5, LinkUp.
    pub const LINK_UP: u32 = 5;

    /// `4: ACTIVE`, `5: LinkUp`, `7: Phy Test`.
    pub fn parse(text: &str) -> Option<State> {
        let (id, name) = text.trim().split_once(": ")?;
        Some(State {
            id: id.parse().ok()?,
            name: name.to_string(),
        })
    }
}

/// `100 Gb/sec (4X EDR)`, `2.5 Gb/sec (1X SDR)`: the port's rate in bytes a second.
pub fn parse_rate(text: &str) -> Option<f64> {
    let gbits: f64 = text.trim().split_once(" Gb/sec")?.0.parse().ok()?;
    (gbits.is_finite() && gbits >= 0.0).then_some(gbits * 1e9 / 8.0)
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Port {
    pub number: u32,
    pub state: Option<State>,
    pub phys_state: Option<State>,
    pub rate_bytes_per_second: Option<f64>,
    pub link_layer: Option<String>,
    /// `counters/`: the PMA port counters, by the kernel's names.
    pub counters: BTreeMap<String, u64>,
    /// `hw_counters/`: the driver's port statistics, by its names.
    pub hw_counters: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Device {
    /// The kernel's name (`rdmap16s27`, `efa_0`, `mlx5_0`).
    pub name: String,
    /// The driver bound to its PCI function (`efa`, `mlx5_core`), from the `device/driver` link.
    pub driver: Option<String>,
    /// Its PCI function (`0000:10:00.0`), from the `device` link.
    pub pci_bus_id: Option<String>,
    pub hw_counters: BTreeMap<String, u64>,
    pub ports: Vec<Port>,
}

/// One read of the tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fabric {
    pub devices: Vec<Device>,
    /// What could not be read, by kind: `vanished` (a device gone while read), `unreadable`,
    /// `parse` (a value in no format the kernel writes), `too_many` (past a bound).
    pub errors: BTreeMap<&'static str, u64>,
}

impl Fabric {
    fn error(&mut self, kind: &'static str) {
        *self.errors.entry(kind).or_default() += 1;
    }
}

/// Which counters to read, by name: a file not read costs nothing.
pub type Wanted<'a> = &'a dyn Fn(&str) -> bool;

/// Reads the devices under `root` (`/sys/class/infiniband`), and of their counters those `wanted`.
/// Err when `root` cannot be listed.
pub fn read(root: &Path, wanted: Wanted) -> Result<Fabric, String> {
    let mut fabric = Fabric::default();
    let names = list(root, MAX_DEVICES, &mut fabric)
        .map_err(|e| format!("cannot list {}: {e}", root.display()))?;
    for name in names {
        let dir = root.join(&name);
        match read_device(&dir, name, wanted, &mut fabric) {
            Some(device) => fabric.devices.push(device),
            None => fabric.error("vanished"),
        }
    }
    Ok(fabric)
}

/// The `uverbs<N>` character devices and the RDMA device each serves, from the kernel's
/// `infiniband_verbs` class beside `root` (drivers/infiniband/core/uverbs_main.c: `ibdev`, the
/// device's name). What cannot be read is left out: it only helps name a device.
pub fn uverbs_devices(root: &Path) -> BTreeMap<String, String> {
    let Some(class) = root.parent().map(|p| p.join("infiniband_verbs")) else {
        return BTreeMap::new();
    };
    let mut scratch = Fabric::default();
    let names = list(&class, MAX_DEVICES, &mut scratch).unwrap_or_default();
    names
        .into_iter()
        .filter_map(|uverbs| {
            let ibdev = text(&class.join(&uverbs).join("ibdev"), 256, &mut scratch)?;
            Some((uverbs, ibdev.trim().to_string()))
        })
        .collect()
}

/// Entry names of `dir`, sorted, at most `max` (past it the rest is left out and counted).
fn list(dir: &Path, max: usize, fabric: &mut Fabric) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_by_key(|n| natural_key(n));
    if names.len() > max {
        fabric.error("too_many");
        names.truncate(max);
    }
    Ok(names)
}

/// `rdmap2s27` before `rdmap10s27`, port `2` before `10`.
fn natural_key(name: &str) -> (String, u64, String) {
    let digits_at = name
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(name.len());
    let rest = &name[digits_at..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    (
        name[..digits_at].to_string(),
        rest[..end].parse().unwrap_or(0),
        rest[end..].to_string(),
    )
}

/// A value file's text; None when it does not exist, or cannot be read (counted).
fn text(path: &Path, limit: u64, fabric: &mut Fabric) -> Option<String> {
    match mlnode_files::read_bounded_text(path, limit) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => {
            fabric.error("unreadable");
            None
        }
    }
}

/// A port file's value; one in no format the kernel writes is counted and left out.
fn value<T>(
    dir: &Path,
    file: &str,
    parse: impl Fn(&str) -> Option<T>,
    fabric: &mut Fabric,
) -> Option<T> {
    let parsed = parse(&text(&dir.join(file), 256, fabric)?);
    if parsed.is_none() {
        fabric.error("parse");
    }
    parsed
}

/// None when the device's directory is gone.
fn read_device(dir: &Path, name: String, wanted: Wanted, fabric: &mut Fabric) -> Option<Device> {
    let ports_dir = dir.join("ports");
    let ports = list(&ports_dir, MAX_PORTS, fabric).ok()?;
    let link_name = |link: PathBuf| {
        std::fs::read_link(link)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    let mut device = Device {
        driver: link_name(dir.join("device/driver")),
        pci_bus_id: link_name(dir.join("device")),
        hw_counters: counters(&dir.join("hw_counters"), wanted, fabric),
        name,
        ports: Vec::new(),
    };
    for port in ports {
        let Ok(number) = port.parse() else {
            fabric.error("parse");
            continue;
        };
        device
            .ports
            .push(read_port(&ports_dir.join(&port), number, wanted, fabric));
    }
    Some(device)
}

fn read_port(dir: &Path, number: u32, wanted: Wanted, fabric: &mut Fabric) -> Port {
    Port {
        number,
        state: value(dir, "state", State::parse, fabric),
        phys_state: value(dir, "phys_state", State::parse, fabric),
        rate_bytes_per_second: value(dir, "rate", parse_rate, fabric),
        link_layer: value(dir, "link_layer", |l| Some(l.trim().to_string()), fabric),
        counters: counters(&dir.join("counters"), wanted, fabric),
        hw_counters: counters(&dir.join("hw_counters"), wanted, fabric),
    }
}

/// The counters in `dir` (none when it does not exist): `lifespan` (how long the driver caches
/// the values, a setting) and `N/A (no PMA)` (a PMA counter the device cannot give now) are no
/// values; anything else that is not a number is counted.
fn counters(dir: &Path, wanted: Wanted, fabric: &mut Fabric) -> BTreeMap<String, u64> {
    let mut values = BTreeMap::new();
    let Ok(names) = list(dir, MAX_COUNTERS, fabric) else {
        return values;
    };
    for name in names.into_iter().filter(|n| n != "lifespan" && wanted(n)) {
        let Some(text) = text(&dir.join(&name), 64, fabric) else {
            continue;
        };
        match text.trim().parse() {
            Ok(value) => {
                values.insert(name, value);
            }
            Err(_) if text.starts_with("N/A") => {}
            Err(_) => fabric.error("parse"),
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_rates_are_read_as_the_kernel_prints_them() {
        assert_eq!(
            State::parse("4: ACTIVE\n"),
            Some(State {
                id: 4,
                name: "ACTIVE".into()
            })
        );
        assert_eq!(State::parse("7: Phy Test\n").unwrap().name, "Phy Test");
        assert_eq!(State::parse("ACTIVE"), None);
        assert_eq!(parse_rate("100 Gb/sec (4X EDR)\n"), Some(12.5e9));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)\n"), Some(2.5e9 / 8.0));
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)"), Some(50e9));
        assert_eq!(parse_rate("fast"), None);
    }

    #[test]
    fn names_sort_as_numbers() {
        let mut names = vec!["rdmap10s27", "rdmap2s27", "mlx5_0", "rdmap1s27"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["mlx5_0", "rdmap1s27", "rdmap2s27", "rdmap10s27"]);
    }
}
