//! The compiled fake NVML library (tests/fake-nvml).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// Builds tests/fake-nvml once and returns the path of `libfake_nvml.so`.
pub fn fake_nvml() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| build(&[]))
}

/// The fake as an R450-era driver's library: without the symbols later drivers added (feature
/// `old-driver` of tests/fake-nvml), built in a target directory of its own.
pub fn fake_nvml_old_driver() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let target = crate::target_tmpdir().join("fake-nvml-old-driver");
        build(&[
            "--features",
            "old-driver",
            "--target-dir",
            target.to_str().unwrap(),
        ])
    })
}

fn build(extra: &[&str]) -> PathBuf {
    {
        let output = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "fake-nvml", "--message-format=json"])
            .args(extra)
            .current_dir(crate::repo_root())
            .output()
            .expect("cargo runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "fake_nvml")
            .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
            .filter_map(|f| f.as_str().map(PathBuf::from))
            .find(|f| f.extension().is_some_and(|e| e == "so"))
            .expect("cargo reports libfake_nvml.so")
    }
}

/// One fake H100 80GB, in the scenario format tests/fake-nvml reads.
pub fn device(i: usize) -> Value {
    json!({
        "uuid": format!("GPU-0000000{i}-1111-2222-3333-44444444444{i}"),
        "name": "NVIDIA H100 80GB HBM3",
        "minor_number": i,
        "cuda_compute_capability": [9, 0],
        "pci_bus_id": format!("00000000:{:02X}:00.0", 0x07 + i * 0x10),
        "memory": {"total": 85520809984u64, "used": 1048576000u64 + i as u64, "free": 83935952896u64, "reserved": 536281088u64},
        "clocks_event_reasons": 1,
        "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
        "temperature_c": 40 + i, "power_mw": 312500 + i * 1000, "power_limit_mw": 700000,
        "utilization": {"gpu": 87, "memory": 40},
        "energy_mj": 123456789u64 + i as u64,
        "xid_events": [], "lost": false, "unsupported": [],
        // dcgm-exporter's default fields; GPM as on an H100 (Hopper).
        "encoder_util_pct": 0, "decoder_util_pct": 3,
        "pcie_replay_count": 2 + i,
        "remapped_rows": {"correctable": 1, "uncorrectable": i, "pending": false, "failed": false},
        "memory_temp_c": 52 + i,
        "pcie_tx_kbps": 1024, "pcie_rx_kbps": 2048,
        "nvlink_kib": [1_048_576 + i as u64, 2_097_152],
        // An H100 SXM5 has 18 NVLink 4 links (NVIDIA's H100 datasheet), all up on a healthy HGX.
        // nvidia-smi's "T.Limit Temp" on an idle H100: tens of degrees below each limit.
        "thermal_margins": {"shutdown": 45 - i as i64, "slowdown": 38 - i as i64, "memory_max": 30, "gpu_max": 41},
        "nvlink": {"links": vec![true; 18], "crc_flit": 0, "crc_data": 0, "replay": i, "recovery": 0},
        "gpm": {"graphics_util": 91.5, "sm_util": 80.0, "any_tensor_util": 62.25, "dram_bw_util": 45.0},
        // Driver 580 reports the GPU recovery action (field 230, R565 and later): none.
        "recovery_action": 0
    })
}

/// The scenario file, replaced atomically: the fake re-reads it on every call.
pub struct Scenario {
    dir: tempfile::TempDir,
    pub value: Value,
}

impl Scenario {
    /// `gpus` fake H100s on driver 580.95.05.
    pub fn new(gpus: usize) -> Scenario {
        Scenario::of(
            json!({"driver_version": "580.95.05", "cuda_driver_version": 13000, "devices": (0..gpus).map(device).collect::<Vec<_>>()}),
        )
    }

    /// A scenario written whole elsewhere (NVIDIA's mocks, a profile).
    pub fn of(value: Value) -> Scenario {
        let scenario = Scenario {
            dir: tempfile::tempdir().unwrap(),
            value,
        };
        scenario.write();
        scenario
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("scenario.json")
    }

    pub fn write(&self) {
        let tmp = self.dir.path().join("scenario.json.tmp");
        std::fs::write(&tmp, self.value.to_string()).unwrap();
        std::fs::rename(tmp, self.path()).unwrap();
    }

    pub fn set(&mut self, gpu: usize, key: &str, value: Value) {
        self.value["devices"][gpu][key] = value;
        self.write();
    }

    /// The PCI devices directory the kernel would show for these GPUs (`nvml.pci_devices`), made
    /// on the first call:
    /// one `0000:bb:dd.f` entry each, with `vendor` and `device` as "0x%04x\n" and `class` as
    /// "0x%06x\n" (linux `drivers/pci/pci-sysfs.c`), an H100 SXM being vendor 0x10de, device
    /// 0x2330, class 0x030200 (3D controller); plus a NIC, which is no GPU.
    pub fn pci_devices(&self) -> PathBuf {
        let root = self.dir.path().join("pci-devices");
        if root.exists() {
            return root;
        }
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir_all(self.dir.path().join("drivers/nvidia")).unwrap();
        for device in self.value["devices"].as_array().unwrap() {
            let bdf = kernel_pci_name(device["pci_bus_id"].as_str().unwrap());
            pci_function(&root, &bdf, ["0x10de", "0x2330", "0x030200"]);
            self.bind(&bdf);
        }
        pci_function(&root, "0000:00:05.0", ["0x1d0f", "0xec20", "0x020000"]);
        root
    }

    /// Binds the GPU at `bdf` to the nvidia driver: its `driver` link, as the kernel makes it.
    pub fn bind(&self, bdf: &str) {
        std::os::unix::fs::symlink(
            self.dir.path().join("drivers/nvidia"),
            self.dir.path().join("pci-devices").join(bdf).join("driver"),
        )
        .unwrap();
    }

    /// Unbinds the GPU at `bdf` from its driver (`echo <bdf> > .../nvidia/unbind`).
    pub fn unbind(&self, bdf: &str) {
        std::fs::remove_file(self.dir.path().join("pci-devices").join(bdf).join("driver")).unwrap();
    }

    /// Takes the GPU at `bdf` off the bus (a hot reset's remove), keeping it to put back.
    pub fn remove_pci_gpu(&self, bdf: &str) {
        let devices = self.dir.path().join("pci-devices");
        std::fs::rename(devices.join(bdf), self.dir.path().join(bdf)).unwrap();
    }

    /// Puts a GPU [`Self::remove_pci_gpu`] took off back on the bus (the rescan).
    pub fn restore_pci_gpu(&self, bdf: &str) {
        let devices = self.dir.path().join("pci-devices");
        std::fs::rename(self.dir.path().join(bdf), devices.join(bdf)).unwrap();
    }

    /// What the fake library's ledger says (`FAKE_NVML_LEDGER`): inits, shutdowns, attached GPUs.
    pub fn ledger(&self) -> Value {
        std::fs::read_to_string(self.ledger_path())
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null)
    }

    pub fn ledger_path(&self) -> PathBuf {
        self.dir.path().join("ledger.json")
    }

    /// Where the fake library holds a file open per attached GPU (`FAKE_NVML_DEVICE_DIR`).
    pub fn device_dir(&self) -> PathBuf {
        let dir = self.dir.path().join("dev");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Puts one more H100 on the fake bus at `bdf` that NVML does not list.
    pub fn add_pci_gpu(&self, bdf: &str) {
        pci_function(
            &self.dir.path().join("pci-devices"),
            bdf,
            ["0x10de", "0x2330", "0x030200"],
        );
    }
}

/// One PCI function under `devices` (`/sys/bus/pci/devices`): its `vendor`, `device` and `class`
/// as the kernel writes them (`drivers/pci/pci-sysfs.c`: "0x%04x\n", "0x%04x\n", "0x%06x\n").
pub fn pci_function(devices: &Path, bdf: &str, [vendor, device, class]: [&str; 3]) {
    let dir = devices.join(bdf);
    std::fs::create_dir(&dir).unwrap();
    for (file, value) in [("vendor", vendor), ("device", device), ("class", class)] {
        std::fs::write(dir.join(file), format!("{value}\n")).unwrap();
    }
}

/// The kernel's name for the PCI function NVML calls `nvml_bus_id` ("00000000:1B:00.0"): the
/// domain in four hex digits, all in lower case, as linux `drivers/pci/probe.c` names a device
/// ("%04x:%02x:%02x.%d").
fn kernel_pci_name(nvml_bus_id: &str) -> String {
    let (domain, rest) = nvml_bus_id
        .split_once(':')
        .expect("NVML's domain:bus:device.function");
    let domain = u32::from_str_radix(domain, 16).expect("a hex PCI domain");
    format!("{domain:04x}:{}", rest.to_ascii_lowercase())
}
