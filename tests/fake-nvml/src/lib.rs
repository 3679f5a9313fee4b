//! A fake `libnvidia-ml.so`: the NVML C functions the agent calls through nvml-wrapper, answering
//! from the JSON scenario named by `FAKE_NVML_SCENARIO` (else `/run/fake-nvml/scenario.json`), re-read on every call so a test can change
//! a GPU's state while the agent runs. Struct layouts come from nvml-wrapper-sys, the same bindings
//! the agent is built with, so the agent's FFI path is exactly the one a real GPU takes.
//!
//! Scenario: `{"driver_version": "...", "devices": [{"uuid", "name", "pci_bus_id", "memory": {"total",
//! "used", "free", "reserved"}, "clocks_event_reasons", "sm_clock_mhz", "mem_clock_mhz",
//! "temperature_c", "power_mw", "utilization": {"gpu", "memory"}, "energy_mj", "xid_events": [..],
//! "lost": false, "unsupported": ["reserved", "clocks_event_reasons", "power", ...]}]}`.
//! `cuda_driver_version` (top level, 12040 for 12.4), and per device `pci_device_id`,
//! `minor_number`, `cuda_compute_capability` (`[9, 0]`) and `power_limit_mw`: each absent answers
//! NOT_SUPPORTED
//! (the device id: an H100 SXM5's).
//! `init_delay_ms` (top level) makes `nvmlInit` block that long, as on a wedged driver.
//! `bound: false` (per device) is a GPU unbound from the driver: an NVML initialised after it does not
//! list it, one initialised before keeps listing it (NVML enumerates at init). `FAKE_NVML_LEDGER`
//! names a JSON file the library keeps current with its inits, shutdowns and attached GPUs;
//! `FAKE_NVML_DEVICE_DIR` a directory where it holds one file open per attached GPU (`nvidia<N>`), as
//! NVML holds `/dev/nvidia<N>`.
//! `handle_error` (per device) is the NVML code the handle call answers instead of a handle.
//! `call_delay_ms` (per device) makes every call on the device block that long first.
//! Built with feature `old-driver`, the library lacks the symbols drivers after R450 added.
//! `version_mismatch` (per device) names versioned calls that answer ARGUMENT_VERSION_MISMATCH
//! (`memory`: the v2 struct; `temperature_v`), as a driver older than the caller's header does.
//! `mig: {"enabled", "monitor_capability", "instances": [{"uuid", "gpu_instance_id",
//! "compute_instance_id", "profile", "memory"}]}` makes the GPU MIG-enabled (see `Mig`).
//! `unsupported` names fields whose call answers NVML_ERROR_NOT_SUPPORTED (`reserved`: the v2 memory
//! call, so a caller must fall back to v1; `clocks_event_reasons`: the new call only, so a caller
//! must fall back to the deprecated throttle-reasons call; `throttle_reasons`: both). `lost: true`
//! makes every call on the device answer NVML_ERROR_GPU_IS_LOST. Each entry of `xid_events` is
//! delivered once through `nvmlEventSetWait_v2` to an event set registered for critical XIDs.
//! dcgm-exporter's default fields: `encoder_util_pct`, `decoder_util_pct`, `pcie_replay_count`,
//! `recovery_action` (field value 230, the driver's recovery action; absent: NOT_SUPPORTED, as on a
//! driver before R565),
//! `remapped_rows: {"correctable", "uncorrectable", "pending", "failed"}`, `memory_temp_c` (field
//! value 82), `pcie_tx_kbps`/`pcie_rx_kbps`, `nvlink_kib: [tx, rx]` (field values 138/139 over all
//! links), `nvlink: {"links": [true, ...], "crc_flit", "crc_data", "replay", "recovery"}` (each
//! link's state for `nvmlDeviceGetNvLinkState`, their count for field value 91, the error totals
//! for field values 38/45/52/59; a total left out answers NOT_SUPPORTED in its slot; absent: a GPU
//! without NVLink), `thermal_margins: {"shutdown", "slowdown", "memory_max", "gpu_max"}` (the T.Limit
//! field values 193-196, signed °C; one left out answers NOT_SUPPORTED), and `gpm: {"graphics_util", "sm_util",
//! "any_tensor_util", "dram_bw_util"}` (percent; absent: no GPM, as before Hopper); a MIG
//! instance's own `gpm` answers `nvmlGpmMigSampleGet` for its GPU instance.
//! `processes: [{"pid", "used_memory", "graphics", "sm_util"}]` (per device, and per MIG instance)
//! are what `nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3` list (`used_memory` absent:
//! NVML_VALUE_NOT_AVAILABLE), and `nvmlDeviceGetProcessUtilization` gives each process with a
//! non-zero `sm_util` one sample per 100 ms period (its CPU timestamp in µs) newer than the
//! caller's `lastSeenTimeStamp`, NOT_FOUND when there is none, NOT_SUPPORTED on MIG devices and
//! on a MIG-enabled GPU (nvml.h). `no_permission` names fields whose call answers
//! NVML_ERROR_NO_PERMISSION (`processes`: as for a caller outside the host's pid namespace).

#![allow(non_snake_case, clippy::missing_safety_doc)]
// Without the newer calls, their types and codes go unused.
#![cfg_attr(feature = "old-driver", allow(unused))]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_uint, c_ulonglong};
use std::sync::Mutex;
use std::time::Duration;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t, nvmlGpmMetricsGet_t,
    nvmlGpmSample_t, nvmlGpmSupport_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
    nvmlProcessInfo_t, nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlUtilization_t,
};
use serde::Deserialize;

const SUCCESS: nvmlReturn_t = 0;
const NO_PERMISSION: nvmlReturn_t = 4;
const NOT_FOUND: nvmlReturn_t = 6;
const UNINITIALIZED: nvmlReturn_t = 1;
const INVALID_ARGUMENT: nvmlReturn_t = 2;
const NOT_SUPPORTED: nvmlReturn_t = 3;
const INSUFFICIENT_SIZE: nvmlReturn_t = 7;
const TIMEOUT: nvmlReturn_t = 10;
const GPU_IS_LOST: nvmlReturn_t = 15;
const ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
const UNKNOWN: nvmlReturn_t = 999;

const CLOCK_SM: c_uint = 1;
const CLOCK_MEM: c_uint = 2;
const TEMPERATURE_GPU: c_uint = 0;
const EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 0x8;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Scenario {
    driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2`: the CUDA version the driver supports, 1000 × major +
    /// 10 × minor (12040: 12.4); absent: NOT_SUPPORTED.
    cuda_driver_version: Option<i32>,
    devices: Vec<Device>,
    /// `nvmlInit` blocks this long first, as it does on a wedged driver.
    init_delay_ms: u64,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Device {
    /// Whether the GPU is bound to the driver; false: unbound (or given to vfio), and an NVML
    /// initialised from then on does not list it.
    #[serde(default = "yes")]
    bound: bool,
    uuid: String,
    name: String,
    pci_bus_id: String,
    /// `nvmlPciInfo_t.pciDeviceId`: device id << 16 | vendor id; absent: an H100 SXM5's.
    pci_device_id: Option<u32>,
    /// `nvmlDeviceGetMinorNumber`, the N of `/dev/nvidiaN`; absent: NOT_SUPPORTED.
    minor_number: Option<u32>,
    /// `nvmlDeviceGetCudaComputeCapability` as (major, minor); absent: NOT_SUPPORTED.
    cuda_compute_capability: Option<(i32, i32)>,
    memory: Memory,
    clocks_event_reasons: u64,
    sm_clock_mhz: u32,
    mem_clock_mhz: u32,
    temperature_c: u32,
    power_mw: u32,
    /// `nvmlDeviceGetEnforcedPowerLimit`; absent: NOT_SUPPORTED.
    power_limit_mw: Option<u32>,
    utilization: Utilization,
    energy_mj: u64,
    xid_events: Vec<XidEvent>,
    lost: bool,
    /// An NVML return code the handle call answers instead of a handle (16: RESET_REQUIRED,
    /// 11: IRQ_ISSUE, 4: NO_PERMISSION, 999: UNKNOWN); 0: none.
    handle_error: nvmlReturn_t,
    unsupported: Vec<String>,
    encoder_util_pct: u32,
    decoder_util_pct: u32,
    pcie_replay_count: u32,
    remapped_rows: RemappedRows,
    memory_temp_c: u32,
    pcie_tx_kbps: u32,
    pcie_rx_kbps: u32,
    /// NVLink data KiB transmitted and received over all links since the driver loaded; absent: a
    /// GPU without NVLink.
    nvlink_kib: Option<(u64, u64)>,
    nvlink: Option<NvLink>,
    thermal_margins: ThermalMargins,
    /// GPU Performance Monitoring (Hopper and later); absent: the device does not support it.
    gpm: Option<Gpm>,
    /// Every call on the device blocks this long first, as NVML does on a dying GPU.
    call_delay_ms: u64,
    /// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (field 230): the `nvmlDeviceGpuRecoveryAction_t` the
    /// driver reports; absent, the field answers NOT_SUPPORTED in its slot, as before R565.
    recovery_action: Option<u32>,
    /// NVLink fabric registration (NVSwitch systems); absent: both fabric calls answer
    /// NOT_SUPPORTED, as on a GPU without NVSwitch.
    fabric: Option<Fabric>,
    mig: Mig,
    /// Fields whose versioned call answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH, as a driver older
    /// than the caller's header does: `memory` (the v2 struct), `temperature_v`.
    version_mismatch: Vec<String>,
    /// Fields whose call answers NVML_ERROR_NO_PERMISSION (and, for MIG, see `view`).
    no_permission: Vec<String>,
    processes: Vec<Process>,
    /// (GPU instance id, compute instance id) when this is a MIG device's view.
    #[serde(skip)]
    instance: Option<(u32, u32)>,
}

/// Multi-Instance GPU. With `enabled`, NVML answers as on a MIG-enabled H100 (nvml.h): the parent's
/// utilisation is NOT_SUPPORTED, its aggregate memory NO_PERMISSION unless the caller holds the
/// `mig/monitor` capability (`monitor_capability`), and each instance is a MIG device handle with its
/// own UUID (`MIG-...`), name (`<parent> MIG <profile>`), memory and instance ids.
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Mig {
    enabled: bool,
    monitor_capability: bool,
    instances: Vec<MigInstance>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct MigInstance {
    uuid: String,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    profile: String,
    memory: Memory,
    /// The GPU instance's GPM percentages (`nvmlGpmMigSampleGet` on the parent); absent: none.
    gpm: Option<Gpm>,
    processes: Vec<Process>,
}

/// A process with a context on the device (nvml.h `nvmlProcessInfo_t`).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Process {
    pid: c_uint,
    /// Bytes; absent: NVML_VALUE_NOT_AVAILABLE, as under MPS or WDDM.
    used_memory: Option<u64>,
    /// A graphics context (listed by the graphics call) rather than a compute one.
    graphics: bool,
    /// Percent of the SMs it used in each sample period.
    sm_util: c_uint,
}

/// The calls a MIG device handle answers; the rest are NOT_SUPPORTED on it.
const MIG_DEVICE_FIELDS: [&str; 5] = ["uuid", "name", "memory", "mig_ids", "processes"];

impl Device {
    /// What `handle` sees: the GPU with its MIG-mode refusals, or one of its MIG devices.
    fn view(&self, mig: Option<usize>) -> Option<Device> {
        let mut view = self.clone();
        match mig {
            None if self.mig.enabled => {
                view.unsupported.push("utilization".into());
                view.unsupported.push("process_utilization".into());
                if !self.mig.monitor_capability {
                    view.no_permission.push("memory".into());
                }
            }
            None => {}
            Some(i) => {
                let instance = self.mig.instances.get(i)?;
                view.uuid = instance.uuid.clone();
                view.name = format!("{} MIG {}", self.name, instance.profile);
                view.memory = instance.memory;
                view.instance = Some((instance.gpu_instance_id, instance.compute_instance_id));
                view.gpm = None;
                view.processes = instance.processes.clone();
            }
        }
        Some(view)
    }
}

/// An XID, for the whole GPU (a number) or for a MIG instance (`{"xid", "gpu_instance_id",
/// "compute_instance_id"}`), as `nvmlEventData_t` carries them (0xFFFFFFFF: no instance).
#[derive(Deserialize, Clone, Copy)]
#[serde(untagged)]
enum XidEvent {
    Gpu(u64),
    Instance {
        xid: u64,
        gpu_instance_id: c_uint,
        compute_instance_id: c_uint,
    },
}

/// nvml.h's T.Limit field values (193-196), °C below each limit; one left out answers
/// NOT_SUPPORTED in its slot.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct ThermalMargins {
    shutdown: Option<i32>,
    slowdown: Option<i32>,
    memory_max: Option<i32>,
    gpu_max: Option<i32>,
}

/// A GPU's NVLink links (nvml.h): whether each is active, and the error totals over them.
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct NvLink {
    links: Vec<bool>,
    crc_flit: Option<u64>,
    crc_data: Option<u64>,
    replay: Option<u64>,
    recovery: Option<u64>,
}

/// `nvmlGpuFabricInfo*` (nvml.h): what the driver reports, and the newest struct version this
/// driver's `nvmlDeviceGetGpuFabricInfoV` accepts (3: 13.0 headers and later; 2: 12.4 to 12.9; 0:
/// none, so only the v1 call answers, as before 12.4).
#[derive(Deserialize, Clone, Copy)]
#[serde(default)]
struct Fabric {
    state: u8,
    status: u32,
    health_mask: u32,
    health_summary: u8,
    max_version: u32,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric {
            state: 3,
            status: 0,
            health_mask: 0,
            health_summary: 0,
            max_version: 3,
        }
    }
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct RemappedRows {
    correctable: u32,
    uncorrectable: u32,
    pending: bool,
    failed: bool,
}

/// Percentages, as `nvmlGpmMetricsGet` reports them.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct Gpm {
    graphics_util: f64,
    sm_util: f64,
    any_tensor_util: f64,
    dram_bw_util: f64,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct Memory {
    total: u64,
    used: u64,
    free: u64,
    reserved: u64,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct Utilization {
    gpu: u32,
    memory: u32,
}

struct State {
    initialized: u32,
    /// GPM sample handles (their value is the key), and what each was last taken of: a device
    /// index, with the GPU instance id for a MIG sample.
    gpm_samples: BTreeMap<usize, Option<(usize, Option<u32>)>>,
    next_sample: usize,
    /// Per device UUID, how many of its `xid_events` were delivered.
    delivered: BTreeMap<String, usize>,
    /// Per event set, the device indexes registered for critical XIDs.
    sets: BTreeMap<usize, Vec<usize>>,
    next_set: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    initialized: 0,
    gpm_samples: BTreeMap::new(),
    next_sample: 1,
    delivered: BTreeMap::new(),
    sets: BTreeMap::new(),
    next_set: 1,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the scenario is when `FAKE_NVML_SCENARIO` is not set: the as-deployed test mounts it there
/// beside the library, as the NVIDIA container toolkit mounts the driver's files, so the agent runs
/// with exactly the container's environment.
const MOUNTED_SCENARIO: &str = "/run/fake-nvml/scenario.json";

/// The scenario as NVML sees it: the devices bound to the driver when NVML was initialised (the
/// UUIDs [`nvmlInit_v2`] took), as a real NVML enumerates its GPUs once, at init.
fn scenario() -> Option<Scenario> {
    let mut scenario = whole_scenario()?;
    if let Some(visible) = &*attached() {
        scenario.devices.retain(|d| visible.contains(&d.uuid));
    }
    Some(scenario)
}

fn whole_scenario() -> Option<Scenario> {
    let path = std::env::var_os("FAKE_NVML_SCENARIO").unwrap_or_else(|| MOUNTED_SCENARIO.into());
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// What an initialised NVML holds: the UUIDs of the GPUs it enumerated, and the device files it
/// keeps open for them (`FAKE_NVML_DEVICE_DIR/nvidia<N>`, as the real one holds `/dev/nvidia<N>`:
/// what `nvidia-smi --gpu-reset` and `fuser` look for). None while not initialised.
static ATTACHED: Mutex<Option<Vec<String>>> = Mutex::new(None);
static DEVICE_FILES: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());

fn attached() -> std::sync::MutexGuard<'static, Option<Vec<String>>> {
    ATTACHED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every init and shutdown so far, written to `FAKE_NVML_LEDGER` (JSON) as they happen, so a test
/// can check they balance and see what is open. The counts outlive the library: a caller that
/// unloads it at shutdown (nvml-wrapper does) and loads it again continues them.
#[derive(serde::Serialize, Deserialize, Default)]
struct Ledger {
    inits: u64,
    shutdowns: u64,
    initialized: u32,
    attached: Vec<String>,
}

static LEDGER: Mutex<Option<Ledger>> = Mutex::new(None);

fn record(change: impl FnOnce(&mut Ledger)) {
    let path = std::env::var_os("FAKE_NVML_LEDGER");
    let mut guard = LEDGER.lock().unwrap_or_else(|p| p.into_inner());
    let ledger = guard.get_or_insert_with(|| {
        path.as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    });
    change(ledger);
    if let Some(path) = path {
        let tmp = std::path::PathBuf::from(&path).with_extension("tmp");
        if let Ok(text) = serde_json::to_string(&*ledger) {
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
}

/// The first init enumerates the GPUs bound to the driver (`"bound": false` is one unbound, or
/// given to vfio) and opens their device files.
fn attach() {
    let bound: Vec<Device> = whole_scenario()
        .map(|s| s.devices.into_iter().filter(|d| d.bound).collect())
        .unwrap_or_default();
    let mut files = DEVICE_FILES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(dir) = std::env::var_os("FAKE_NVML_DEVICE_DIR") {
        for index in 0..bound.len() {
            let path = std::path::Path::new(&dir).join(format!("nvidia{index}"));
            if let Ok(file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                files.push(file);
            }
        }
    }
    let uuids: Vec<String> = bound.into_iter().map(|d| d.uuid).collect();
    record(|l| l.attached = uuids.clone());
    *attached() = Some(uuids);
}

/// The last shutdown closes every device file and forgets the GPUs.
fn detach() {
    DEVICE_FILES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    *attached() = None;
    record(|l| l.attached.clear());
}

/// Device handles are the index plus one, so a null handle is never valid; a MIG device's handle
/// carries its parent's handle in the high bits and its own index plus one in the low 16.
fn handle_of(index: usize) -> nvmlDevice_t {
    (index + 1) as nvmlDevice_t
}

fn mig_handle_of(parent: usize, index: usize) -> nvmlDevice_t {
    (((parent + 1) << 16) | (index + 1)) as nvmlDevice_t
}

/// The GPU index of a handle, and the MIG device index when it is a MIG device's.
fn indexes_of(device: nvmlDevice_t) -> (usize, Option<usize>) {
    let raw = device as usize;
    match raw >> 16 {
        0 => (raw.wrapping_sub(1), None),
        parent => (parent - 1, Some((raw & 0xffff).wrapping_sub(1))),
    }
}

fn index_of(device: nvmlDevice_t) -> usize {
    indexes_of(device).0
}

/// Runs `answer` on the device behind `device`, with NVML's errors for the cases around it.
fn with_device(
    device: nvmlDevice_t,
    field: &str,
    answer: impl FnOnce(&Device) -> nvmlReturn_t,
) -> nvmlReturn_t {
    if state().initialized == 0 {
        return UNINITIALIZED;
    }
    let Some(scenario) = scenario() else {
        return UNKNOWN;
    };
    let (gpu, mig) = indexes_of(device);
    let Some(dev) = scenario.devices.get(gpu).and_then(|d| d.view(mig)) else {
        return INVALID_ARGUMENT;
    };
    let dev = &dev;
    if dev.call_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(dev.call_delay_ms));
    }
    if dev.lost {
        return GPU_IS_LOST;
    }
    if dev.unsupported.iter().any(|u| u == field)
        || (dev.instance.is_some() && !MIG_DEVICE_FIELDS.contains(&field))
    {
        return NOT_SUPPORTED;
    }
    if dev.no_permission.iter().any(|u| u == field) {
        return NO_PERMISSION;
    }
    answer(dev)
}

unsafe fn write_str(text: &str, out: *mut c_char, length: c_uint) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, out, bytes.len());
    *out.add(bytes.len()) = 0;
    SUCCESS
}

unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    *out = value;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    if let Some(delay) = scenario().map(|s| s.init_delay_ms).filter(|d| *d > 0) {
        std::thread::sleep(Duration::from_millis(delay));
    }
    let first = {
        let mut state = state();
        state.initialized += 1;
        state.initialized == 1
    };
    if first {
        attach();
    }
    record(|l| {
        l.inits += 1;
        l.initialized += 1;
    });
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let last = {
        let mut state = state();
        if state.initialized == 0 {
            return UNINITIALIZED;
        }
        state.initialized -= 1;
        state.initialized == 0
    };
    if last {
        detach();
    }
    record(|l| {
        l.shutdowns += 1;
        l.initialized -= 1;
    });
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(_result: nvmlReturn_t) -> *const c_char {
    c"fake NVML error".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    match scenario() {
        Some(s) => write_str(&s.driver_version, version, length),
        None => UNKNOWN,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(
    version: *mut std::ffi::c_int,
) -> nvmlReturn_t {
    match scenario() {
        Some(s) => s
            .cuda_driver_version
            .map_or(NOT_SUPPORTED, |v| put(version, v)),
        None => UNKNOWN,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "minor_number", |d| {
        d.minor_number.map_or(NOT_SUPPORTED, |m| put(minor, m))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut std::ffi::c_int,
    minor: *mut std::ffi::c_int,
) -> nvmlReturn_t {
    with_device(device, "cuda_compute_capability", |d| {
        match d.cuda_compute_capability {
            Some((ma, mi)) => {
                let status = put(major, ma);
                if status != SUCCESS {
                    return status;
                }
                put(minor, mi)
            }
            None => NOT_SUPPORTED,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    if state().initialized == 0 {
        return UNINITIALIZED;
    }
    match scenario() {
        Some(s) => put(count, s.devices.len() as c_uint),
        None => UNKNOWN,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    if state().initialized == 0 {
        return UNINITIALIZED;
    }
    match scenario() {
        Some(s) if (index as usize) < s.devices.len() => {
            match s.devices[index as usize].handle_error {
                0 => put(device, handle_of(index as usize)),
                code => code,
            }
        }
        Some(_) => INVALID_ARGUMENT,
        None => UNKNOWN,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, "uuid", |d| write_str(&d.uuid, uuid, length))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, "name", |d| write_str(&d.name, name, length))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "index", |_| put(index, index_of(device) as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_device(device, "pci", |d| {
        if pci.is_null() {
            return INVALID_ARGUMENT;
        }
        let mut info: nvmlPciInfo_t = std::mem::zeroed();
        // "00000000:07:00.0": domain, bus, device.function
        let parts: Vec<&str> = d.pci_bus_id.split([':', '.']).collect();
        let hex = |i: usize| {
            parts
                .get(i)
                .and_then(|p| u32::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        info.domain = hex(0);
        info.bus = hex(1);
        info.device = hex(2);
        info.pciDeviceId = d.pci_device_id.unwrap_or(0x2330_10de);
        info.pciSubSystemId = 0x16c1_10de;
        let status = write_str(
            &d.pci_bus_id,
            info.busId.as_mut_ptr(),
            info.busId.len() as c_uint,
        );
        if status != SUCCESS {
            return status;
        }
        let legacy = d.pci_bus_id.get(4..).unwrap_or("");
        let _ = write_str(
            legacy,
            info.busIdLegacy.as_mut_ptr(),
            info.busIdLegacy.len() as c_uint,
        );
        *pci = info;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    with_device(device, "memory", |d| {
        // v1 counts reserved memory as used, as the real library does.
        put(
            memory,
            nvmlMemory_t {
                total: d.memory.total,
                free: d.memory.free,
                used: d.memory.used + d.memory.reserved,
            },
        )
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_device(device, "memory", |d| {
        if d.unsupported.iter().any(|u| u == "reserved") {
            return NOT_SUPPORTED;
        }
        if d.version_mismatch.iter().any(|u| u == "memory") {
            return ARGUMENT_VERSION_MISMATCH;
        }
        if memory.is_null() {
            return INVALID_ARGUMENT;
        }
        let version = (*memory).version;
        put(
            memory,
            nvmlMemory_v2_t {
                version,
                total: d.memory.total,
                reserved: d.memory.reserved,
                free: d.memory.free,
                used: d.memory.used,
            },
        )
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(device, "clocks_event_reasons", |d| {
        if d.unsupported.iter().any(|u| u == "throttle_reasons") {
            return NOT_SUPPORTED;
        }
        put(reasons, d.clocks_event_reasons)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(device, "throttle_reasons", |d| {
        put(reasons, d.clocks_event_reasons)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock: c_uint,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    match clock {
        CLOCK_SM => with_device(device, "sm_clock", |d| put(mhz, d.sm_clock_mhz)),
        CLOCK_MEM => with_device(device, "mem_clock", |d| put(mhz, d.mem_clock_mhz)),
        _ => with_device(device, "clock", |_| NOT_SUPPORTED),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    celsius: *mut c_uint,
) -> nvmlReturn_t {
    if sensor != TEMPERATURE_GPU {
        return INVALID_ARGUMENT;
    }
    with_device(device, "temperature", |d| put(celsius, d.temperature_c))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    milliwatts: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "power_limit", |d| {
        d.power_limit_mw
            .map_or(NOT_SUPPORTED, |limit| put(milliwatts, limit))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    milliwatts: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "power", |d| put(milliwatts, d.power_mw))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_device(device, "utilization", |d| {
        put(
            utilization,
            nvmlUtilization_t {
                gpu: d.utilization.gpu,
                memory: d.utilization.memory,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    millijoules: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(device, "energy", |d| put(millijoules, d.energy_mj))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    let mut state = state();
    if state.initialized == 0 {
        return UNINITIALIZED;
    }
    let id = state.next_set;
    state.next_set += 1;
    state.sets.insert(id, Vec::new());
    put(set, id as nvmlEventSet_t)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    // Its own name, so that a scenario can refuse the registration of a GPU that says it
    // supports XID events (`unsupported: ["register_events"]`).
    with_device(device, "register_events", |_| {
        if types & !EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
            return NOT_SUPPORTED;
        }
        match state().sets.get_mut(&(set as usize)) {
            Some(devices) => {
                devices.push(index_of(device));
                SUCCESS
            }
            None => INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(device, "events", |_| {
        put(types, EVENT_TYPE_XID_CRITICAL_ERROR)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms.into());
    loop {
        if let Some(scenario) = scenario() {
            let mut state = state();
            let Some(devices) = state.sets.get(&(set as usize)).cloned() else {
                return INVALID_ARGUMENT;
            };
            for index in devices {
                let Some(device) = scenario.devices.get(index) else {
                    continue;
                };
                let delivered = state.delivered.entry(device.uuid.clone()).or_insert(0);
                if let Some(&event) = device.xid_events.get(*delivered) {
                    *delivered += 1;
                    let (xid, gpu_instance, compute_instance) = match event {
                        XidEvent::Gpu(xid) => (xid, 0xFFFF_FFFF, 0xFFFF_FFFF),
                        XidEvent::Instance {
                            xid,
                            gpu_instance_id,
                            compute_instance_id,
                        } => (xid, gpu_instance_id, compute_instance_id),
                    };
                    return put(
                        data,
                        nvmlEventData_t {
                            device: handle_of(index),
                            eventType: EVENT_TYPE_XID_CRITICAL_ERROR,
                            eventData: xid,
                            gpuInstanceId: gpu_instance,
                            computeInstanceId: compute_instance,
                        },
                    );
                }
            }
        }
        if std::time::Instant::now() >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    match state().sets.remove(&(set as usize)) {
        Some(_) => SUCCESS,
        None => INVALID_ARGUMENT,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    engine_utilization(device, "encoder", utilization, sampling_period_us, |d| {
        d.encoder_util_pct
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    engine_utilization(device, "decoder", utilization, sampling_period_us, |d| {
        d.decoder_util_pct
    })
}

/// The video engines' answer: a percentage and the period it was sampled over.
unsafe fn engine_utilization(
    device: nvmlDevice_t,
    field: &str,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
    percent: impl FnOnce(&Device) -> u32,
) -> nvmlReturn_t {
    with_device(device, field, |d| {
        put(sampling_period_us, 167_000);
        put(utilization, percent(d))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "pcie_replay", |d| put(value, d.pcie_replay_count))
}

/// `nvmlPcieUtilCounter_t`: 0 TX, 1 RX, in KB/s.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: c_uint,
    value: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "pcie_throughput", |d| match counter {
        0 => put(value, d.pcie_tx_kbps),
        1 => put(value, d.pcie_rx_kbps),
        _ => INVALID_ARGUMENT,
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> nvmlReturn_t {
    if [corr_rows, unc_rows, is_pending, failure_occurred]
        .iter()
        .any(|p| p.is_null())
    {
        return INVALID_ARGUMENT;
    }
    with_device(device, "remapped_rows", |d| {
        let rows = d.remapped_rows;
        put(corr_rows, rows.correctable);
        put(unc_rows, rows.uncorrectable);
        put(is_pending, c_uint::from(rows.pending));
        put(failure_occurred, c_uint::from(rows.failed))
    })
}

/// `NVML_FI_DEV_MEMORY_TEMP` (82, nvml.h); any other field answers NOT_SUPPORTED in its slot.
const FI_DEV_MEMORY_TEMP: c_uint = 82;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (230, nvml.h 13.3 line 2808): an unsigned int holding an
/// `nvmlDeviceGpuRecoveryAction_t`.
const FI_DEV_GET_GPU_RECOVERY_ACTION: c_uint = 230;
/// `NVML_FI_DEV_NVLINK_LINK_COUNT` (91, nvml.h): an unsigned int.
const FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;
/// `NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL` (nvml.h).
const FI_DEV_NVLINK_CRC_FLIT_TOTAL: c_uint = 38;
const FI_DEV_NVLINK_CRC_DATA_TOTAL: c_uint = 45;
const FI_DEV_NVLINK_REPLAY_TOTAL: c_uint = 52;
const FI_DEV_NVLINK_RECOVERY_TOTAL: c_uint = 59;
/// `NVML_FI_DEV_TEMPERATURE_{SHUTDOWN,SLOWDOWN,MEM_MAX,GPU_MAX}_TLIMIT` (nvml.h).
const FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: c_uint = 193;
const FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: c_uint = 196;
/// `NVML_VALUE_TYPE_SIGNED_INT`.
const VALUE_TYPE_SIGNED_INT: c_uint = 5;
/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
/// `NVML_VALUE_TYPE_UNSIGNED_LONG_LONG`.
const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX` (nvml.h 2614-2615), KiB; scope UINT_MAX sums
/// every link.
const FI_DEV_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
const FI_DEV_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: std::ffi::c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    if values.is_null() || count < 0 {
        return INVALID_ARGUMENT;
    }
    with_device(device, "field_values", |d| {
        let values = std::slice::from_raw_parts_mut(values, count as usize);
        for value in values {
            match value.fieldId {
                FI_DEV_MEMORY_TEMP if !d.unsupported.iter().any(|u| u == "memory_temp") => {
                    value.valueType = VALUE_TYPE_UNSIGNED_INT;
                    value.value.uiVal = d.memory_temp_c;
                    value.nvmlReturn = SUCCESS;
                }
                FI_DEV_NVLINK_THROUGHPUT_DATA_TX | FI_DEV_NVLINK_THROUGHPUT_DATA_RX
                    if value.scopeId == c_uint::MAX && d.nvlink_kib.is_some() =>
                {
                    let (tx, rx) = d.nvlink_kib.unwrap_or_default();
                    value.valueType = VALUE_TYPE_UNSIGNED_LONG_LONG;
                    value.value.ullVal = if value.fieldId == FI_DEV_NVLINK_THROUGHPUT_DATA_TX {
                        tx
                    } else {
                        rx
                    };
                    value.nvmlReturn = SUCCESS;
                }
                FI_DEV_NVLINK_LINK_COUNT if d.nvlink.is_some() => {
                    value.valueType = VALUE_TYPE_UNSIGNED_INT;
                    value.value.uiVal = d.nvlink.as_ref().map_or(0, |n| n.links.len() as c_uint);
                    value.nvmlReturn = SUCCESS;
                }
                FI_DEV_NVLINK_CRC_FLIT_TOTAL
                | FI_DEV_NVLINK_CRC_DATA_TOTAL
                | FI_DEV_NVLINK_REPLAY_TOTAL
                | FI_DEV_NVLINK_RECOVERY_TOTAL => {
                    let total = d.nvlink.as_ref().and_then(|n| match value.fieldId {
                        FI_DEV_NVLINK_CRC_FLIT_TOTAL => n.crc_flit,
                        FI_DEV_NVLINK_CRC_DATA_TOTAL => n.crc_data,
                        FI_DEV_NVLINK_REPLAY_TOTAL => n.replay,
                        _ => n.recovery,
                    });
                    match total {
                        Some(total) => {
                            value.valueType = VALUE_TYPE_UNSIGNED_LONG_LONG;
                            value.value.ullVal = total;
                            value.nvmlReturn = SUCCESS;
                        }
                        None => value.nvmlReturn = NOT_SUPPORTED,
                    }
                }
                FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT..=FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT => {
                    let t = d.thermal_margins;
                    let margin = [t.shutdown, t.slowdown, t.memory_max, t.gpu_max]
                        [(value.fieldId - FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT) as usize];
                    match margin {
                        Some(margin) => {
                            value.valueType = VALUE_TYPE_SIGNED_INT;
                            value.value.siVal = margin;
                            value.nvmlReturn = SUCCESS;
                        }
                        None => value.nvmlReturn = NOT_SUPPORTED,
                    }
                }
                FI_DEV_GET_GPU_RECOVERY_ACTION if d.recovery_action.is_some() => {
                    value.valueType = VALUE_TYPE_UNSIGNED_INT;
                    value.value.uiVal = d.recovery_action.unwrap_or_default();
                    value.nvmlReturn = SUCCESS;
                }
                _ => value.nvmlReturn = NOT_SUPPORTED,
            }
        }
        SUCCESS
    })
}

/// nvml.h: INVALID_ARGUMENT for a link the device does not have, NOT_SUPPORTED on a device
/// without NVLink; `isActive` is an `nvmlEnableState_t` (1 enabled).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    is_active: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "nvlink", |d| match &d.nvlink {
        None => NOT_SUPPORTED,
        Some(nvlink) => match nvlink.links.get(link as usize) {
            Some(active) => put(is_active, c_uint::from(*active)),
            None => INVALID_ARGUMENT,
        },
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    if support.is_null() || (*support).version != 1 {
        return ARGUMENT_VERSION_MISMATCH;
    }
    with_device(device, "gpm", |d| {
        (*support).isSupportedDevice = c_uint::from(d.gpm.is_some());
        SUCCESS
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    let mut state = state();
    let id = state.next_sample;
    state.next_sample += 1;
    state.gpm_samples.insert(id, None);
    put(sample, id as nvmlGpmSample_t)
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    match state().gpm_samples.remove(&(sample as usize)) {
        Some(_) => SUCCESS,
        None => INVALID_ARGUMENT,
    }
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    with_device(device, "gpm", |d| {
        if d.gpm.is_none() {
            return NOT_SUPPORTED;
        }
        take_gpm_sample(sample, (index_of(device), None))
    })
}

fn take_gpm_sample(sample: nvmlGpmSample_t, of: (usize, Option<u32>)) -> nvmlReturn_t {
    match state().gpm_samples.get_mut(&(sample as usize)) {
        Some(taken) => {
            *taken = Some(of);
            SUCCESS
        }
        None => INVALID_ARGUMENT,
    }
}

/// A GPU instance's sample, taken on its parent GPU (nvml.h: Hopper or newer with MIG on).
#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    with_device(device, "gpm", |d| {
        if d.gpm.is_none() || !d.mig.enabled {
            return NOT_SUPPORTED;
        }
        if !d
            .mig
            .instances
            .iter()
            .any(|i| i.gpu_instance_id == gpu_instance_id)
        {
            return NOT_FOUND;
        }
        take_gpm_sample(sample, (index_of(device), Some(gpu_instance_id)))
    })
}

/// The scenario's percentages for the device both samples were taken of.
#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    if request.is_null() || (*request).version != 1 {
        return ARGUMENT_VERSION_MISMATCH;
    }
    let request = &mut *request;
    let taken = {
        let state = state();
        let of = |s: nvmlGpmSample_t| state.gpm_samples.get(&(s as usize)).copied().flatten();
        (of(request.sample1), of(request.sample2))
    };
    let (Some(first), Some(second)) = taken else {
        return INVALID_ARGUMENT;
    };
    if first != second || request.numMetrics as usize > request.metrics.len() {
        return INVALID_ARGUMENT;
    }
    let (device, gpu_instance) = second;
    let Some(gpm) = scenario()
        .and_then(|s| s.devices.get(device).cloned())
        .and_then(|d| match gpu_instance {
            None => d.gpm,
            Some(id) => d
                .mig
                .instances
                .iter()
                .find(|i| i.gpu_instance_id == id)
                .and_then(|i| i.gpm),
        })
    else {
        return NOT_SUPPORTED;
    };
    for metric in &mut request.metrics[..request.numMetrics as usize] {
        // NVML_GPM_METRIC_GRAPHICS_UTIL 1, SM_UTIL 2, ANY_TENSOR_UTIL 5, DRAM_BW_UTIL 10.
        let value = match metric.metricId {
            1 => Some(gpm.graphics_util),
            2 => Some(gpm.sm_util),
            5 => Some(gpm.any_tensor_util),
            10 => Some(gpm.dram_bw_util),
            _ => None,
        };
        match value {
            Some(v) => {
                metric.value = v;
                metric.nvmlReturn = SUCCESS;
            }
            None => metric.nvmlReturn = NOT_SUPPORTED,
        }
    }
    SUCCESS
}

/// `NVML_DEVICE_MIG_ENABLE` is 1 (nvml.h); the pending mode equals the current one.
#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "mig_mode", |d| {
        let mode = c_uint::from(d.mig.enabled);
        put(pending, mode);
        put(current, mode)
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    // An H100 has at most seven instances.
    with_device(device, "mig_mode", |_| put(count, 7))
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_device(device, "mig_mode", |d| {
        if !d.mig.enabled {
            return NOT_SUPPORTED;
        }
        if index as usize >= d.mig.instances.len() {
            return NOT_FOUND;
        }
        put(mig_device, mig_handle_of(index_of(device), index as usize))
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "mig_ids", |d| match d.instance {
        Some((gpu_instance, _)) => put(id, gpu_instance),
        None => NOT_SUPPORTED,
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, "mig_ids", |d| match d.instance {
        Some((_, compute_instance)) => put(id, compute_instance),
        None => NOT_SUPPORTED,
    })
}

/// `nvmlTemperature_v1`: `NVML_STRUCT_VERSION(Temperature, 1)`, sizeof | 1 << 24 (nvml.h).
const TEMPERATURE_V1: c_uint =
    std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlTemperature_v1_t>() as c_uint | (1 << 24);

/// NVML 13's replacement for the deprecated `nvmlDeviceGetTemperature`.
#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureV(
    device: nvmlDevice_t,
    temperature: *mut nvml_wrapper_sys::bindings::nvmlTemperature_v1_t,
) -> nvmlReturn_t {
    if temperature.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(device, "temperature_v", |d| {
        if (*temperature).version != TEMPERATURE_V1
            || d.version_mismatch.iter().any(|u| u == "temperature_v")
        {
            return ARGUMENT_VERSION_MISMATCH;
        }
        if (*temperature).sensorType != TEMPERATURE_GPU {
            return INVALID_ARGUMENT;
        }
        (*temperature).temperature = d.temperature_c as std::ffi::c_int;
        SUCCESS
    })
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)` and `(…, 3)`: sizeof | version << 24 (nvml.h 141), with
/// sizeof 36 and 40 for the v2 and v3 layouts (nvml.h 3834-3979).
#[cfg(not(feature = "old-driver"))]
const FABRIC_INFO_V2: c_uint = 0x0200_0024;
#[cfg(not(feature = "old-driver"))]
const FABRIC_INFO_V3: c_uint = 0x0300_0028;

/// The deprecated v1 call: no version, no health mask.
#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    info: *mut nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t,
) -> nvmlReturn_t {
    if info.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(device, "fabric", |d| {
        let Some(fabric) = d.fabric else {
            return NOT_SUPPORTED;
        };
        (*info).state = fabric.state;
        (*info).status = fabric.status;
        SUCCESS
    })
}

/// The versioned call: the caller's `version` says which layout it passed; a version newer than
/// the driver's answers ARGUMENT_VERSION_MISMATCH and writes nothing.
#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: nvmlDevice_t,
    info: *mut nvml_wrapper_sys::bindings::nvmlGpuFabricInfoV_t,
) -> nvmlReturn_t {
    if info.is_null() {
        return INVALID_ARGUMENT;
    }
    with_device(device, "fabric", |d| {
        let Some(fabric) = d.fabric else {
            return NOT_SUPPORTED;
        };
        let version = (*info).version;
        let accepted = match version {
            FABRIC_INFO_V3 => fabric.max_version >= 3,
            FABRIC_INFO_V2 => fabric.max_version >= 2,
            _ => false,
        };
        if !accepted {
            return ARGUMENT_VERSION_MISMATCH;
        }
        // The v2 layout is v3's leading fields: a v2 caller's struct ends before healthSummary.
        let v2 = info.cast::<nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v2_t>();
        (*v2).state = fabric.state;
        (*v2).status = fabric.status;
        (*v2).healthMask = fabric.health_mask;
        if version == FABRIC_INFO_V3 {
            (*info).healthSummary = fabric.health_summary;
        }
        SUCCESS
    })
}

/// nvml.h's `NVML_VALUE_NOT_AVAILABLE` in `usedGpuMemory`.
const VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// The list calls' contract (nvml.h): `*count` in is the array's size; too small (a null array
/// with 0 included) is INSUFFICIENT_SIZE with `*count` set to what is needed.
unsafe fn running_processes(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    graphics: bool,
) -> nvmlReturn_t {
    with_device(device, "processes", |d| {
        if count.is_null() {
            return INVALID_ARGUMENT;
        }
        let listed: Vec<&Process> = d
            .processes
            .iter()
            .filter(|p| p.graphics == graphics)
            .collect();
        let room = *count as usize;
        *count = listed.len() as c_uint;
        if listed.is_empty() {
            return SUCCESS;
        }
        if room < listed.len() || infos.is_null() {
            return INSUFFICIENT_SIZE;
        }
        let (gi, ci) = d.instance.unwrap_or((0xFFFF_FFFF, 0xFFFF_FFFF));
        for (i, p) in listed.iter().enumerate() {
            *infos.add(i) = nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory.unwrap_or(VALUE_NOT_AVAILABLE),
                gpuInstanceId: gi,
                computeInstanceId: ci,
            };
        }
        SUCCESS
    })
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    running_processes(device, count, infos, false)
}

#[cfg(not(feature = "old-driver"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    running_processes(device, count, infos, true)
}

/// One sample per process that used the SMs, for the driver's current 100 ms period, if it is
/// newer than `last_seen` (nvml.h `nvmlDeviceGetProcessUtilization`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    with_device(device, "process_utilization", |d| {
        if count.is_null() {
            return INVALID_ARGUMENT;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_micros() as c_ulonglong);
        let period = now - now % 100_000;
        let samples: Vec<&Process> = d
            .processes
            .iter()
            .filter(|p| p.sm_util > 0 && period > last_seen)
            .collect();
        if samples.is_empty() {
            return NOT_FOUND;
        }
        let room = *count as usize;
        *count = samples.len() as c_uint;
        if utilization.is_null() || room < samples.len() {
            return INSUFFICIENT_SIZE;
        }
        for (i, p) in samples.iter().enumerate() {
            *utilization.add(i) = nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: period,
                smUtil: p.sm_util,
                memUtil: 0,
                encUtil: 0,
                decUtil: 0,
            };
        }
        SUCCESS
    })
}
