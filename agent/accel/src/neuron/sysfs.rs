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

/// Tensor-engine cycles of one physical core, summed over the row groups of
/// `stats/tensor_engine/pe_cntrs` (`vc/neuron_dhal_vc.c:92-133`). Read live from hardware
/// counters at each read, unlike the execution counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeCycles {
    pub matmul: u64,
    pub weight_load: u64,
    pub idle: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoreSnapshot {
    /// Physical index within the device (`neuron_core<M>`).
    pub index: u32,
    /// `info/architecture/arch_type`: `NCv2`, `NCv3`.
    pub arch_type: Option<String>,
    /// `stats/memory_usage/device_mem/{total,peak}`: the core's whole device memory.
    pub device_memory_total: MemoryStat,
    /// `stats/memory_usage/device_mem/<category>/{total,peak}`.
    pub device_memory: BTreeMap<String, MemoryStat>,
    /// `stats/memory_usage/host_mem/{total,peak}`: host memory charged to the core.
    pub host_memory: MemoryStat,
    /// `stats/status/<name>/total`: execution outcomes, added when a runtime releases the core.
    pub status: BTreeMap<String, u64>,
    /// `stats/other_info/<name>/total`: model_load_count, inference_count, reset_req_count, ...
    pub other: BTreeMap<String, u64>,
    pub pe_cycles: Option<PeCycles>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSnapshot {
    pub index: u32,
    /// The chip family (`Inf2`, `Trn2`), not the EC2 instance type.
    pub instance_type: Option<String>,
    /// The device version (`NDv3`), not the NeuronCore's.
    pub arch_type: Option<String>,
    pub device_name: Option<String>,
    /// `info/serial_number`, 16 hex digits; absent on Inf1 and when the firmware read failed.
    pub serial_number: Option<String>,
    /// `stats/hardware/<name>`: the firmware's uncorrected ECC counts, read at each read
    /// (16-bit, summed per HBM channel; not counters: see docs/neuron.md).
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

/// This node's id in a 4-node UltraServer, from the driver's class attribute `node_id_4`
/// (`neuron_cdev.c:3210-3216`, `v3/neuron_pelect.c:1700-1724`): -1 outside one, `busy` while the
/// nodes elect; None when absent or not a number.
pub fn ultraserver_node_id(class_root: &Path) -> Option<i32> {
    read_once(&class_root.join("node_id_4")).ok()?.parse().ok()
}

/// Each device's firmware ECC counts alone, by device index: what the readiness gate needs, a few
/// files per device where the whole tree of a trn2.48xlarge is 8,000. Read errors are the
/// collector's to count.
pub fn read_ecc(root: &Path) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut errors = BTreeMap::new();
    device_indexes(root)
        .unwrap_or_default()
        .into_iter()
        .map(|index| {
            let dir = root.join(format!("neuron{index}"));
            (index, read_hardware(&dir, &mut errors))
        })
        .collect()
}

/// `stats/hardware/<name>` of the device at `dir`.
fn read_hardware(dir: &Path, errors: &mut BTreeMap<&'static str, u64>) -> BTreeMap<String, u64> {
    read_counters(&dir.join("stats/hardware"), "hardware", errors)
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
        // The driver writes an empty line when the firmware read fails
        // (`neuron_sysfs_metrics.c:364-376`): no serial, not a read error.
        serial_number: read_once(&dir.join("info/serial_number")).ok(),
        ..DeviceSnapshot::default()
    };
    device.hardware = read_hardware(dir, errors);
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
            let core_dir = dir.join(format!("neuron_core{core}"));
            let stats = core_dir.join("stats");
            let device_mem = stats.join("memory_usage/device_mem");
            CoreSnapshot {
                index: core,
                arch_type: read_text(
                    &core_dir.join("info/architecture/arch_type"),
                    "info",
                    errors,
                ),
                device_memory_total: read_stat(&device_mem, "device_mem", errors),
                device_memory: read_memory(&device_mem, "device_mem", errors),
                host_memory: read_stat(&stats.join("memory_usage/host_mem"), "host_mem", errors),
                status: read_counters(&stats.join("status"), "status", errors),
                other: read_counters(&stats.join("other_info"), "other_info", errors),
                pe_cycles: read_text(&stats.join("tensor_engine/pe_cntrs"), "pe_cntrs", errors)
                    .and_then(|text| match parse_pe_cntrs(&text) {
                        Some(cycles) => Some(cycles),
                        None => {
                            *errors.entry("pe_cntrs").or_default() += 1;
                            None
                        }
                    }),
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

/// `xrow_grp,mm_active,wl_active,idle` then one `<group>,<mm>,<wl>,<idle>` line per row group
/// (`vc/neuron_dhal_vc.c:101,123`), summed over the groups.
pub fn parse_pe_cntrs(text: &str) -> Option<PeCycles> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    if lines.next()? != "xrow_grp,mm_active,wl_active,idle" {
        return None;
    }
    let mut sum = PeCycles::default();
    let mut groups = 0;
    for line in lines {
        let fields: Vec<u64> = line
            .split(',')
            .map(|f| f.trim().parse().ok())
            .collect::<Option<_>>()?;
        let [_, matmul, weight_load, idle] = fields.as_slice() else {
            return None;
        };
        sum.matmul = sum.matmul.checked_add(*matmul)?;
        sum.weight_load = sum.weight_load.checked_add(*weight_load)?;
        sum.idle = sum.idle.checked_add(*idle)?;
        groups += 1;
    }
    (groups > 0).then_some(sum)
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

/// `<dir>/{total,peak}`.
fn read_stat(
    dir: &Path,
    kind: &'static str,
    errors: &mut BTreeMap<&'static str, u64>,
) -> MemoryStat {
    MemoryStat {
        total: read_u64(&dir.join("total"), kind, errors),
        peak: read_u64(&dir.join("peak"), kind, errors),
    }
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
            let stat = read_stat(&dir.join(&name), kind, errors);
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
    fn pe_counters_sum_the_row_groups() {
        // The driver's format, four row groups on v2/v3 (`pe_row_grp_count = 4`).
        let text = "xrow_grp,mm_active,wl_active,idle\n0,10,1,89\n1,20,2,78\n2,0,0,100\n3,5,5,90\n";
        assert_eq!(
            parse_pe_cntrs(text),
            Some(PeCycles {
                matmul: 35,
                weight_load: 8,
                idle: 357
            })
        );
        assert_eq!(
            parse_pe_cntrs("xrow_grp,mm_active,wl_active,idle\n"),
            None,
            "no rows"
        );
        assert_eq!(parse_pe_cntrs("0,1,2,3\n"), None, "no header");
        assert_eq!(
            parse_pe_cntrs("xrow_grp,mm_active,wl_active,idle\n0,1,2\n"),
            None,
            "short row"
        );
        assert_eq!(
            parse_pe_cntrs("xrow_grp,mm_active,wl_active,idle\n0,-1,2,3\n"),
            None
        );
    }

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
