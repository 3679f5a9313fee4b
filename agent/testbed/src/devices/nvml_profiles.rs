//! NVIDIA's mock NVML profiles (k8s-test-infra v0.3.0, `pkg/gpu/mocknvml/configs`, copied under
//! tests/fixtures/k8s-test-infra with SOURCES) as fake-NVML scenarios. Where a profile leaves an
//! answer to the mock's engine, the scenario answers as that engine does at the same commit
//! (`pkg/gpu/mocknvml/engine`): GPM on Hopper and later, fabric state `auto` as COMPLETED with
//! no fabric manager to wait for, `links_per_gpu` active NVLink links. Where the engine answers a
//! GPU without the hardware with a value rather than NOT_SUPPORTED (MIG mode 0 and inactive NVLink
//! links on a T4), the scenario answers as the driver does: NOT_SUPPORTED.

use std::path::PathBuf;

use serde_json::{json, Map, Value};

/// Every profile k8s-test-infra ships.
pub const PROFILES: [&str; 7] = ["a100", "b200", "gb200", "gb300", "h100", "l40s", "t4"];

/// Where `profile`'s file is, under tests/fixtures.
pub fn path(profile: &str) -> PathBuf {
    crate::repo_root()
        .join("tests/fixtures/k8s-test-infra")
        .join(format!("mock-nvml-config-{profile}.yaml"))
}

/// The profile as its YAML says, every device's defaults merged under its overrides (the
/// engine's `device_defaults` and `devices[]`). Err names the file and what is wrong with it.
pub fn load(profile: &str) -> Result<Value, String> {
    let file = path(profile);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut value: Value =
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let defaults = value["device_defaults"].clone();
    let devices = value["devices"]
        .as_array_mut()
        .ok_or_else(|| format!("{}: no devices list", file.display()))?;
    for device in devices.iter_mut() {
        let mut merged = defaults.clone();
        merge(&mut merged, device);
        *device = merged;
    }
    Ok(value)
}

fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                merge(base.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (base, over) => *base = over.clone(),
    }
}

/// nvml.h's `nvmlClocksEventReasons` bits, by the profile's names for them.
const CLOCK_EVENT_BITS: [(&str, u64); 9] = [
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clocks_setting", 0x100),
];

/// The loaded profile (see [`load`]) as tests/fake-nvml's scenario.
pub fn scenario(profile: &Value) -> Value {
    let system = &profile["system"];
    let cuda = system["cuda_version_major"].as_i64().unwrap() * 1000
        + system["cuda_version_minor"].as_i64().unwrap() * 10;
    let links = profile["nvlink"]["links_per_gpu"].as_u64().unwrap_or(0) as usize;
    let devices: Vec<Value> = profile["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| device(d, links))
        .collect();
    json!({
        "driver_version": system["driver_version"],
        "cuda_driver_version": cuda,
        "devices": devices,
    })
}

fn device(d: &Value, nvlink_links: usize) -> Value {
    let memory = &d["memory"];
    let reasons: u64 = CLOCK_EVENT_BITS
        .iter()
        .filter(|(name, _)| d["clocks_throttle_reasons"][name] == true)
        .map(|(_, bit)| bit)
        .sum();
    let mut scenario = Map::new();
    // A value the profile leaves out is the engine's Go zero value, as the fake's default is.
    let mut set = |key: &str, value: Value| {
        if !value.is_null() {
            scenario.insert(key.to_string(), value);
        }
    };
    set("uuid", d["uuid"].clone());
    set("name", d["name"].clone());
    set(
        "pci_bus_id",
        json!(nvml_bus_id(d["pci"]["bus_id"].as_str().unwrap())),
    );
    set("pci_device_id", d["pci"]["device_id"].clone());
    set("minor_number", d["minor_number"].clone());
    set(
        "cuda_compute_capability",
        json!([
            d["compute_capability"]["major"],
            d["compute_capability"]["minor"]
        ]),
    );
    set(
        "memory",
        json!({"total": memory["total_bytes"], "used": memory["used_bytes"],
               "free": memory["free_bytes"], "reserved": memory["reserved_bytes"]}),
    );
    set("clocks_event_reasons", json!(reasons));
    set("sm_clock_mhz", d["clocks"]["sm_current"].clone());
    set("mem_clock_mhz", d["clocks"]["memory_current"].clone());
    set("temperature_c", d["thermal"]["temperature_gpu_c"].clone());
    set(
        "memory_temp_c",
        d["thermal"]["temperature_memory_c"].clone(),
    );
    set("power_mw", d["power"]["current_draw_mw"].clone());
    set("power_limit_mw", d["power"]["enforced_limit_mw"].clone());
    set(
        "energy_mj",
        d["power"]["total_energy_consumption_mj"].clone(),
    );
    set(
        "utilization",
        json!({"gpu": d["utilization"]["gpu"], "memory": d["utilization"]["memory"]}),
    );
    set("encoder_util_pct", d["utilization"]["encoder"].clone());
    set("decoder_util_pct", d["utilization"]["decoder"].clone());
    set("pcie_replay_count", d["pcie"]["replay_counter"].clone());
    set("pcie_tx_kbps", d["pcie"]["tx_throughput_kbps"].clone());
    set("pcie_rx_kbps", d["pcie"]["rx_throughput_kbps"].clone());
    let rows = &d["remapped_rows"];
    set(
        "remapped_rows",
        json!({"correctable": rows["correctable"], "uncorrectable": rows["uncorrectable"],
               "pending": rows["pending"], "failed": rows["failure_occurred"]}),
    );
    if nvlink_links > 0 {
        set(
            "nvlink",
            json!({"links": vec![true; nvlink_links], "crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0}),
        );
    }
    if let Some(fabric) = d["fabric"].as_object() {
        set(
            "fabric",
            json!({"state": 3, "status": 0, "health_mask": fabric["health_mask"]}),
        );
    }
    if matches!(d["architecture"].as_str(), Some("hopper" | "blackwell")) {
        let utilization = d["utilization"]["gpu"].clone();
        set(
            "gpm",
            json!({"graphics_util": utilization, "sm_util": utilization, "any_tensor_util": 0.0, "dram_bw_util": 0.0}),
        );
    }
    let mut unsupported = vec![];
    if d["mig"]["max_gpu_instances"].as_u64().unwrap_or(0) == 0 {
        unsupported.push("mig_mode");
    } else {
        set(
            "mig",
            json!({"enabled": d["mig"]["mode_current"] == "enabled", "instances": []}),
        );
    }
    set("unsupported", json!(unsupported));
    apply_failure(&d["failure"], &mut scenario);
    Value::Object(scenario)
}

/// The engine's failure modes (its README, "Failure Injection"): `lost` and `fallen_off_bus`
/// answer ERROR_GPU_IS_LOST to the handle lookup and every call, with no event; a GPU with
/// `ecc_uncorrectable` stays addressable and delivers its `xid.code` once through the event set.
fn apply_failure(failure: &Value, scenario: &mut Map<String, Value>) {
    const GPU_IS_LOST: u32 = 15;
    match failure["mode"].as_str() {
        Some("lost" | "fallen_off_bus") => {
            scenario.insert("lost".into(), json!(true));
            scenario.insert("handle_error".into(), json!(GPU_IS_LOST));
        }
        Some("ecc_uncorrectable") => {
            if let Some(xid) = failure["xid"]["code"].as_u64() {
                scenario.insert("xid_events".into(), json!([xid]));
            }
        }
        _ => {}
    }
}

/// `0000:1A:00.0` as nvml.h's `NVML_DEVICE_PCI_BUS_ID_FMT` writes it: `00000000:1A:00.0`.
fn nvml_bus_id(bus_id: &str) -> String {
    let (domain, rest) = bus_id.split_once(':').unwrap();
    format!(
        "{:08X}:{}",
        u32::from_str_radix(domain, 16).unwrap(),
        rest.to_uppercase()
    )
}
