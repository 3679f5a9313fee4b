//! The accelerators on the PCI bus, as the kernel lists them in sysfs
//! (`/sys/bus/pci/devices/<domain:bus:device.function>/{vendor,device,class}`, world-readable): what
//! the drivers' own counts are checked against, so a GPU NVML no longer lists, or a Neuron device
//! its driver did not bring up, is missed by name.

use std::path::Path;

/// NVIDIA's PCI vendor id.
pub const NVIDIA_VENDOR: u16 = 0x10de;
/// Amazon's PCI vendor id and the Inferentia/Trainium device ids the Neuron driver binds
/// (`AMZN_VENDOR_ID`, `INF1_DEVICE_ID0`-`3`, `INF2_DEVICE_ID0`, `TRN1_DEVICE_ID0`,
/// `TRN2_DEVICE_ID0` in aws-neuron/aws-neuron-driver `neuron_device.h` at 7c0d02c; its
/// `neuron_pci_dev_ids` table in `neuron_pci.c`).
pub const AMAZON_VENDOR: u16 = 0x1d0f;
pub const NEURON_DEVICE_IDS: [u16; 7] = [0x7064, 0x7065, 0x7066, 0x7067, 0x7264, 0x7164, 0x7364];

/// The EFA device ids the EFA driver binds, all Amazon's (`PCI_DEV_ID_EFA0_VF`-`EFA4_VF` in
/// amzn/amzn-drivers `kernel/linux/efa/src/efa_main.c:27-38` at b99452b70; the kernel's own copy,
/// `drivers/infiniband/hw/efa/efa_main.c`, lists the first four).
pub const EFA_DEVICE_IDS: [u16; 5] = [0xefa0, 0xefa1, 0xefa2, 0xefa3, 0xefa4];

/// What a scan found: the matching devices' addresses, and the entries it could not read (named,
/// so a permission problem is said rather than taken as an absent device).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BusScan {
    /// The physical functions, `0000:18:00.0`, sorted.
    pub devices: Vec<String>,
    /// SR-IOV virtual functions (an entry with a `physfn` link, as the kernel's
    /// `drivers/pci/iov.c` makes it), sorted: slices of a device in `devices`, not more devices.
    pub virtual_functions: Vec<String>,
    pub unreadable: Vec<String>,
    /// The driver each of `devices` is bound to (its `driver` link), where one is.
    pub drivers: std::collections::BTreeMap<String, String>,
}

impl BusScan {
    /// The driver the kernel binds a device to for a VM to take it whole (`vfio-pci`).
    pub const VFIO_DRIVER: &'static str = "vfio-pci";

    /// The devices bound to `driver`.
    pub fn bound_to(&self, driver: &str) -> std::collections::BTreeSet<String> {
        self.drivers
            .iter()
            .filter(|(_, d)| *d == driver)
            .map(|(address, _)| address.clone())
            .collect()
    }
}

/// A display controller (class 0x03xxxx: VGA 0x0300, 3D 0x0302) of NVIDIA's: a GPU, not one of the
/// NVSwitches (bridge class 0x0680) or audio functions it also puts on the bus.
pub fn is_nvidia_gpu(vendor: u16, _device: u16, class: u32) -> bool {
    vendor == NVIDIA_VENDOR && matches!(class >> 8, 0x0300 | 0x0302)
}

pub fn is_neuron_device(vendor: u16, device: u16, _class: u32) -> bool {
    vendor == AMAZON_VENDOR && NEURON_DEVICE_IDS.contains(&device)
}

pub fn is_efa_device(vendor: u16, device: u16, _class: u32) -> bool {
    vendor == AMAZON_VENDOR && EFA_DEVICE_IDS.contains(&device)
}

/// Scans `devices` (`/sys/bus/pci/devices`) for the entries `wanted` accepts. Err when the directory
/// itself cannot be listed.
pub fn scan(devices: &Path, wanted: fn(u16, u16, u32) -> bool) -> Result<BusScan, String> {
    let entries = std::fs::read_dir(devices).map_err(|e| format!("{}: {e}", devices.display()))?;
    let mut found = BusScan::default();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = entry.path();
        let read = |file: &str| -> Option<u32> {
            let text = mlnode_files::read_bounded_text(&dir.join(file), 64).ok()?;
            u32::from_str_radix(text.trim().strip_prefix("0x")?, 16).ok()
        };
        match (read("vendor"), read("device"), read("class")) {
            (Some(vendor), Some(device), Some(class)) => {
                let (Ok(vendor), Ok(device)) = (u16::try_from(vendor), u16::try_from(device))
                else {
                    found.unreadable.push(name);
                    continue;
                };
                if wanted(vendor, device, class) {
                    if std::fs::symlink_metadata(dir.join("physfn")).is_ok() {
                        found.virtual_functions.push(name);
                        continue;
                    }
                    let driver = std::fs::read_link(dir.join("driver")).ok();
                    if let Some(driver) = driver.as_deref().and_then(Path::file_name) {
                        found
                            .drivers
                            .insert(name.clone(), driver.to_string_lossy().into_owned());
                    }
                    found.devices.push(name);
                }
            }
            _ => found.unreadable.push(name),
        }
    }
    found.devices.sort();
    found.virtual_functions.sort();
    found.unreadable.sort();
    Ok(found)
}

/// NVML's bus id (`00000000:18:00.0`, an 8-digit domain, upper-case hex) as sysfs names the device
/// (`0000:18:00.0`).
pub fn sysfs_bus_id(nvml_bus_id: &str) -> Option<String> {
    let (domain, rest) = nvml_bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree as the kernel writes it (`drivers/pci/pci-sysfs.c`: `vendor`, `device` as
    /// "0x%04x\n", `class` as "0x%06x\n"): an H100 (3D controller), an NVSwitch (bridge), an A10G
    /// (VGA), a Trainium2, an ENA NIC, and an entry that cannot be read.
    #[test]
    fn gpus_and_neuron_devices_are_found_by_vendor_class_and_id() {
        let dir = tempfile::tempdir().unwrap();
        let add = |bdf: &str, vendor: &str, device: &str, class: &str| {
            let d = dir.path().join(bdf);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("device"), format!("{device}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        };
        add("0000:18:00.0", "0x10de", "0x2330", "0x030200");
        add("0000:05:00.0", "0x10de", "0x22a3", "0x068000");
        add("0000:00:1e.0", "0x10de", "0x2237", "0x030000");
        add("0000:cc:00.0", "0x1d0f", "0x7364", "0x088000");
        add("0000:00:05.0", "0x1d0f", "0xec20", "0x020000");
        std::fs::create_dir(dir.path().join("0000:ff:00.0")).unwrap();
        let gpus = scan(dir.path(), is_nvidia_gpu).unwrap();
        assert_eq!(gpus.devices, ["0000:00:1e.0", "0000:18:00.0"]);
        assert_eq!(gpus.unreadable, ["0000:ff:00.0"]);
        let neuron = scan(dir.path(), is_neuron_device).unwrap();
        assert_eq!(neuron.devices, ["0000:cc:00.0"]);
        assert!(scan(&dir.path().join("none"), is_nvidia_gpu).is_err());
    }

    #[test]
    fn nvml_bus_ids_become_sysfs_names() {
        assert_eq!(
            sysfs_bus_id("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            sysfs_bus_id("00000001:07:00.0").as_deref(),
            Some("0001:07:00.0")
        );
        assert_eq!(sysfs_bus_id("garbage"), None);
    }
}
