//! Reading `/sys/devices/virtual/neuron_device/` into plain data.
//!
//! Everything below a device is discovered from the directory listing, so categories and counters
//! that a driver adds or moves are read without a code change; what is absent is skipped. A file
//! that exists but cannot be read or parsed is counted by kind (`path_kind`) and skipped; nothing
//! here panics on what the driver (or a test) writes.
//!
//! Each value file is read with a single `read(2)`: sysfs produces a file's whole content in one
//! call, so a value is never seen half old, half new.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::index_after;

/// total/present/peak of one memory category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStat {
    /// Current usage (the driver calls it `total`).
    pub total: Option<u64>,
    pub peak: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PowerReading {
    pub status: String,
    pub timestamp: u64,
    pub min_percent: f64,
    pub max_percent: f64,
    pub avg_percent: f64,
}

impl PowerReading {
    /// The driver marks a sample it could not take; only valid samples are exported.
    pub fn is_valid(&self) -> bool {
        let status = self.status.to_ascii_uppercase();
        status == "POWER_STATUS_VALID" || status == "VALID"
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoreSnapshot {
    /// Index within the device.
    pub index: u32,
    pub device_memory: BTreeMap<String, MemoryStat>,
    /// `stats/status/<name>/total`: execution outcomes.
    pub status: BTreeMap<String, u64>,
    /// `stats/other_info/<name>`: model_load_count, inference_count, reset_req_count, ...
    pub other: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSnapshot {
    pub index: u32,
    pub instance_type: Option<String>,
    pub arch_type: Option<String>,
    pub device_name: Option<String>,
    /// `stats/hardware/<event>`: ECC events.
    pub hardware: BTreeMap<String, u64>,
    pub power: Option<PowerReading>,
    pub host_memory: BTreeMap<String, MemoryStat>,
    pub cores: Vec<CoreSnapshot>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub devices: Vec<DeviceSnapshot>,
    /// Files that exist but could not be read or parsed, per kind of path.
    pub read_errors: BTreeMap<&'static str, u64>,
}

/// The `neuron<N>` directories under `root`, sorted by N.
pub fn device_indexes(root: &Path) -> std::io::Result<Vec<u32>> {
    let mut indexes: Vec<u32> = std::fs::read_dir(root)?
        .filter_map(|e| e.ok())
        .filter_map(|e| index_after(&e.file_name().to_string_lossy(), "neuron"))
        .collect();
    indexes.sort_unstable();
    Ok(indexes)
}

/// Reads the whole tree.
pub fn read(root: &Path) -> Snapshot {
    let mut snapshot = Snapshot::default();
    let Ok(indexes) = device_indexes(root) else {
        return snapshot;
    };
    for index in indexes {
        let dir = root.join(format!("neuron{index}"));
        let device = read_device(&dir, index, &mut snapshot.read_errors);
        snapshot.devices.push(device);
    }
    snapshot
}

fn read_device(dir: &Path, index: u32, errors: &mut BTreeMap<&'static str, u64>) -> DeviceSnapshot {
    let arch = dir.join("info/architecture");
    let mut device = DeviceSnapshot {
        index,
        instance_type: read_text(&arch.join("instance_type"), "info", errors),
        arch_type: read_text(&arch.join("arch_type"), "info", errors),
        device_name: read_text(&arch.join("device_name"), "info", errors),
        ..DeviceSnapshot::default()
    };
    device.hardware = read_counters(&dir.join("stats/hardware"), "hardware", errors);
    device.power =
        read_text(&dir.join("stats/power/utilization"), "power", errors).and_then(|text| {
            match parse_power(&text) {
                Some(power) => Some(power),
                None => {
                    *errors.entry("power").or_default() += 1;
                    None
                }
            }
        });
    device.host_memory = read_memory(&dir.join("stats/memory_usage/host_mem"), "host_mem", errors);
    let mut cores: Vec<CoreSnapshot> = list_dir(dir)
        .into_iter()
        .filter_map(|(name, _)| index_after(&name, "neuron_core"))
        .map(|core| {
            let stats = dir.join(format!("neuron_core{core}/stats"));
            CoreSnapshot {
                index: core,
                device_memory: read_memory(
                    &stats.join("memory_usage/device_mem"),
                    "device_mem",
                    errors,
                ),
                status: read_counters(&stats.join("status"), "status", errors),
                other: read_counters(&stats.join("other_info"), "other_info", errors),
            }
        })
        .collect();
    cores.sort_by_key(|c| c.index);
    device.cores = cores;
    device
}

/// `<status>,<unix_ts>,<min>,<max>,<avg>`, percentages.
pub fn parse_power(text: &str) -> Option<PowerReading> {
    let parts: Vec<&str> = text.trim().split(',').map(str::trim).collect();
    let [status, timestamp, min, max, avg] = parts.as_slice() else {
        return None;
    };
    // A percentage of the device's maximum: NaN, infinities and negatives are not readings.
    let percent = |text: &str| {
        text.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
    };
    Some(PowerReading {
        status: status.to_string(),
        timestamp: timestamp.parse().ok()?,
        min_percent: percent(min)?,
        max_percent: percent(max)?,
        avg_percent: percent(avg)?,
    })
}

/// Entry names and whether each is a directory, from the listing itself (no stat per entry).
fn list_dir(dir: &Path) -> Vec<(String, bool)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<(String, bool)> = entries
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.file_type().is_ok_and(|t| t.is_dir()),
            )
        })
        .collect();
    names.sort();
    names
}

/// Each entry of `dir` is a counter: a file holding the value, or (newer drivers) a directory
/// holding `total` (cumulative) and `present`.
fn read_counters(
    dir: &Path,
    kind: &'static str,
    errors: &mut BTreeMap<&'static str, u64>,
) -> BTreeMap<String, u64> {
    list_dir(dir)
        .into_iter()
        .filter_map(|(name, is_dir)| {
            let path = dir.join(&name);
            let file = if is_dir { path.join("total") } else { path };
            read_u64(&file, kind, errors).map(|v| (name, v))
        })
        .collect()
}

/// `<dir>/<category>/{total,peak}`.
fn read_memory(
    dir: &Path,
    kind: &'static str,
    errors: &mut BTreeMap<&'static str, u64>,
) -> BTreeMap<String, MemoryStat> {
    list_dir(dir)
        .into_iter()
        .filter(|(_, is_dir)| *is_dir)
        .map(|(name, _)| {
            let category = dir.join(&name);
            let stat = MemoryStat {
                total: read_u64(&category.join("total"), kind, errors),
                peak: read_u64(&category.join("peak"), kind, errors),
            };
            (name, stat)
        })
        .filter(|(_, stat)| stat.total.is_some() || stat.peak.is_some())
        .collect()
}

fn read_u64(
    path: &Path,
    kind: &'static str,
    errors: &mut BTreeMap<&'static str, u64>,
) -> Option<u64> {
    let text = read_text(path, kind, errors)?;
    match text.parse() {
        Ok(value) => Some(value),
        Err(_) => {
            *errors.entry(kind).or_default() += 1;
            None
        }
    }
}

/// One file's trimmed content: None when absent (not an error: the driver may not have it) or
/// unreadable (counted).
fn read_text(
    path: &Path,
    kind: &'static str,
    errors: &mut BTreeMap<&'static str, u64>,
) -> Option<String> {
    // An empty read is retried once: a file being rewritten in place (tests; never sysfs) is
    // briefly empty.
    let first = read_once(path);
    let result = match &first {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => read_once(path),
        _ => first,
    };
    match result {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => {
            *errors.entry(kind).or_default() += 1;
            None
        }
    }
}

/// A single read of up to 4 KiB: sysfs attributes are at most a page, produced whole per read.
/// Opened non-blocking, so that a FIFO where a value should be cannot hang a scrape.
fn read_once(path: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut buffer = [0u8; 4096];
    let n = file.read(&mut buffer)?;
    let text = std::str::from_utf8(&buffer[..n])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "empty",
        ));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_lines() {
        let p = parse_power("POWER_STATUS_VALID,1732924800,12.5,61.0,40.25\n").unwrap();
        assert!(p.is_valid());
        assert_eq!(
            (p.timestamp, p.min_percent, p.max_percent, p.avg_percent),
            (1732924800, 12.5, 61.0, 40.25)
        );
        assert!(!parse_power("POWER_STATUS_NO_DATA,1732924800,0,0,0")
            .unwrap()
            .is_valid());
        assert_eq!(parse_power("garbage"), None);
        assert_eq!(parse_power("VALID,notatime,1,2,3"), None);
        for avg in ["NaN", "inf", "1e309", "-5", "100.5"] {
            assert_eq!(
                parse_power(&format!("POWER_STATUS_VALID,1732924800,1,2,{avg}")),
                None,
                "{avg} is not a power percentage"
            );
        }
    }
}
