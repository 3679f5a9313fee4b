//! Reading GPUs through NVML (nvml-wrapper over `libnvidia-ml.so.1`): [`NvmlSource`] turns each
//! GPU's NVML calls into a [`DeviceRead`], with the raw calls nvml-wrapper lacks (the fabric
//! structs by version, field values with their own return codes) and the classification of NVML's
//! errors into device failures. [`threads`] runs it off the async runtime. None of it needs root:
//! NVML's read calls work for any user who can open /dev/nvidia*.

mod threads;

pub use threads::{spawn, Reopen, Stop};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};

use nvml_wrapper::enum_wrappers::device::{PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::gpm::{gpm_metrics_get, GpmSample};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_MEMORY_TEMP;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample;

use super::state::{DeviceRead, GpuFailure};
use super::{
    FabricReading, GpmReading, GpuIdentity, GpuProcess, GpuReading, MemoryReading, MigInstance,
    NvLinkReading, RemappedRows, NVLINK_ERROR_COUNTERS, THERMAL_LIMITS,
};
use mlnode_core::cgroup::CgroupOwner;

const NVML_ERROR_NOT_SUPPORTED: u32 = 3;
const NVML_ERROR_FUNCTION_NOT_FOUND: u32 = 13;
/// A driver older than the struct version asked for (nvml-wrapper 0.13 has no variant for it).
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: u32 = 25;

/// NVML, opened from a configurable library path.
pub struct NvmlSource {
    nvml: Nvml,
}

impl NvmlSource {
    pub fn open(library: &Path) -> Result<NvmlSource, String> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(library.as_os_str()))
            .init()
            .map_err(|e| match e {
                NvmlError::LibloadingError(e) => format!("cannot load {}: {e}", library.display()),
                other => format!("NVML ({}) failed to initialise: {other}", library.display()),
            })?;
        Ok(NvmlSource { nvml })
    }

    pub fn driver_version(&self) -> String {
        self.nvml.sys_driver_version().unwrap_or_default()
    }

    /// The CUDA version the driver supports, as NVML gives it (12040: 12.4).
    pub fn cuda_driver_version(&self) -> Option<i32> {
        self.nvml.sys_cuda_driver_version().ok()
    }

    pub fn device_count(&self) -> Result<u32, String> {
        self.nvml
            .device_count()
            .map_err(|e| format!("cannot count GPUs: {e}"))
    }

    /// Each GPU NVML lists, with its UUID where it can be read.
    pub fn listed(&self) -> Result<Vec<(u32, Option<String>)>, String> {
        Ok((0..self.device_count()?)
            .map(|i| (i, self.nvml.device_by_index(i).and_then(|d| d.uuid()).ok()))
            .collect())
    }

    /// Reads one GPU. `gpm` holds what this GPU's previous read left (GPM samples, the last
    /// process-utilisation timestamp), replaced by this read's: the metrics are the interval
    /// between the two. With `owner_of`, the GPU's processes are read too, each given its owner.
    pub fn read<'a>(
        &'a self,
        index: u32,
        gpm: &mut SinceLast<'a>,
        owner_of: Option<&OwnerOf>,
    ) -> Option<DeviceRead> {
        let device = match self.nvml.device_by_index(index) {
            Ok(device) => device,
            Err(e) => {
                return Some(DeviceRead::Failed(
                    failure_of(&e).unwrap_or(GpuFailure::Unknown),
                ))
            }
        };
        use nvml_wrapper::enum_wrappers::device::Clock;
        let mut failed = None;
        let identity = GpuIdentity {
            index,
            uuid: field(device.uuid(), &mut failed).unwrap_or_default(),
            pci_bus_id: field(device.pci_info().map(|p| p.bus_id), &mut failed).unwrap_or_default(),
            model_name: field(device.name(), &mut failed).unwrap_or_default(),
            minor_number: field(device.minor_number(), &mut failed),
            compute_capability: field(device.cuda_compute_capability(), &mut failed)
                .map(|c| (c.major, c.minor)),
        };
        let utilization = field(device.utilization_rates(), &mut failed);
        let mig_mode = device.mig_mode().ok().map(|m| m.current == 1);
        let gpm_supported = device.gpm_support().unwrap_or(false);
        let mut attribution_trouble = Vec::new();
        let reading = GpuReading {
            memory_copy_util_pct: utilization.as_ref().map(|u| u.memory),
            encoder_util_pct: field(
                device.encoder_utilization().map(|u| u.utilization),
                &mut failed,
            ),
            decoder_util_pct: field(
                device.decoder_utilization().map(|u| u.utilization),
                &mut failed,
            ),
            pcie_replays: field(device.pcie_replay_counter(), &mut failed),
            remapped_rows: field(self.remapped_rows(&device), &mut failed),
            memory_temp_c: field(memory_temperature(&device), &mut failed),
            pcie_bytes_per_second: field(pcie_throughput(&device), &mut failed),
            nvlink_bytes: field(self.nvlink_bytes(&device), &mut failed),
            nvlink: field(self.nvlink(&device), &mut failed),
            thermal_margins: field(self.thermal_margins(&device), &mut failed).unwrap_or_default(),
            gpm: gpm_supported
                .then(|| self.gpm_since(&mut gpm.device, device.gpm_sample()))
                .flatten(),
            mig_mode,
            mig: match mig_mode {
                Some(true) => self.mig_instances(
                    &device,
                    gpm_supported,
                    &mut gpm.instances,
                    owner_of,
                    &mut attribution_trouble,
                ),
                _ => Vec::new(),
            },
            // A MIG-enabled GPU's processes are its MIG devices' (the parent's list is their
            // aggregate, and only for a privileged caller).
            processes: owner_of
                .filter(|_| mig_mode != Some(true))
                .and_then(|owner_of| {
                    processes(
                        &device,
                        Some(&mut gpm.utilization_seen),
                        owner_of,
                        &mut attribution_trouble,
                    )
                }),
            // After the two reads above, which add to it.
            attribution_trouble,
            memory: field(self.memory(&device), &mut failed),
            clock_event_reasons: field(self.clock_event_reasons(&device), &mut failed),
            sm_clock_mhz: field(device.clock_info(Clock::SM), &mut failed),
            mem_clock_mhz: field(device.clock_info(Clock::Memory), &mut failed),
            temperature_c: field(self.temperature(&device), &mut failed),
            power_mw: field(device.power_usage(), &mut failed),
            power_limit_mw: field(device.enforced_power_limit(), &mut failed),
            utilization_gpu_pct: utilization.map(|u| u.gpu),
            energy_mj: field(device.total_energy_consumption(), &mut failed),
            recovery_action: field(recovery_action(&device), &mut failed),
            fabric: field(self.fabric(&device), &mut failed)
                .filter(|f: &FabricReading| f.state != 0),
        };
        Some(match failed {
            Some(failure) => DeviceRead::Failed(failure),
            None => DeviceRead::Read {
                identity,
                reading: Box::new(reading),
            },
        })
    }

    /// The MIG devices of a MIG-enabled `device`. A MIG device that cannot be read is left out;
    /// its siblings are not. Each GPU instance's GPM sample (`nvmlGpmMigSampleGet`, on the parent)
    /// is kept in `gpm` for the next read; those of instances that are gone are dropped.
    fn mig_instances<'a>(
        &'a self,
        device: &Device<'a>,
        gpm_supported: bool,
        gpm: &mut BTreeMap<u32, Option<GpmSample<'a>>>,
        owner_of: Option<&OwnerOf>,
        trouble: &mut Vec<&'static str>,
    ) -> Vec<MigInstance> {
        let slots = device.mig_device_count().unwrap_or(0);
        let instances: Vec<MigInstance> = (0..slots)
            .filter_map(|slot| device.mig_device_by_index(slot).ok())
            .filter_map(|mig| {
                let name = mig.name().ok()?;
                let gpu_instance_id = self.instance_id(&mig, InstanceKind::Gpu).ok()?;
                let previous = gpm.entry(gpu_instance_id).or_default();
                Some(MigInstance {
                    uuid: mig.uuid().ok()?,
                    gpu_instance_id,
                    compute_instance_id: self.instance_id(&mig, InstanceKind::Compute).ok()?,
                    profile: name
                        .rsplit_once(" MIG ")
                        .map(|(_, profile)| profile.to_string())
                        .unwrap_or(name),
                    memory: self.memory(&mig).ok(),
                    gpm: gpm_supported
                        .then(|| self.gpm_since(previous, device.gpm_mig_sample(gpu_instance_id)))
                        .flatten(),
                    processes: owner_of
                        .and_then(|owner_of| processes(&mig, None, owner_of, trouble)),
                })
            })
            .collect();
        gpm.retain(|id, _| instances.iter().any(|i| i.gpu_instance_id == *id));
        instances
    }

    /// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG device handle
    /// (nvml-wrapper has no wrappers for them).
    fn instance_id(&self, mig: &Device, kind: InstanceKind) -> Result<u32, NvmlError> {
        let lib = self.nvml.lib();
        let sym = symbol(match kind {
            InstanceKind::Gpu => &lib.nvmlDeviceGetGpuInstanceId,
            InstanceKind::Compute => &lib.nvmlDeviceGetComputeInstanceId,
        })?;
        let mut id = 0;
        // SAFETY: the handle is valid while `mig` lives; `id` is a plain out-parameter.
        nvml_try(unsafe { sym(mig.handle(), &mut id) })?;
        Ok(id)
    }

    /// `nvmlDeviceGetTemperatureV` (NVML 13; nvml-wrapper has no wrapper for it), else the
    /// deprecated `nvmlDeviceGetTemperature` that older drivers have instead.
    fn temperature(&self, device: &Device) -> Result<u32, NvmlError> {
        if let Ok(sym) = self.nvml.lib().nvmlDeviceGetTemperatureV.as_ref() {
            // SAFETY: the handle is valid while `device` lives; the struct is plain data whose
            // version word says its size, as nvml.h's NVML_STRUCT_VERSION builds it.
            let result = unsafe {
                let mut reading: nvml_wrapper_sys::bindings::nvmlTemperature_v1_t =
                    std::mem::zeroed();
                reading.version = std::mem::size_of_val(&reading) as u32 | (1 << 24);
                reading.sensorType = 0; // NVML_TEMPERATURE_GPU
                nvml_try(sym(device.handle(), &mut reading))
                    .map(|()| reading.temperature.max(0) as u32)
            };
            match result {
                Err(e) if is_older_driver(&e) => {}
                other => return other,
            }
        }
        device.temperature(TemperatureSensor::Gpu)
    }

    /// NVLink data bytes over every link, from the field values
    /// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX` (KiB) with scope UINT_MAX, which nvml.h
    /// defines as the sum over links.
    fn nvlink_bytes(&self, device: &Device) -> Result<(u64, u64), NvmlError> {
        use nvml_wrapper_sys::bindings::field_id::{
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        };
        let mut values = self
            .raw_fields(
                device,
                &[
                    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, u32::MAX),
                    (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, u32::MAX),
                ],
            )?
            .into_iter()
            .map(|kib| kib.map(|kib| u64::try_from(kib).unwrap_or(0) * 1024));
        let mut next = || values.next().unwrap_or(Err(NvmlError::NotSupported));
        Ok((next()?, next()?))
    }

    /// The GPU's NVLink links and their error totals: the link count and the totals in one
    /// field-values call (`NVML_FI_DEV_NVLINK_LINK_COUNT`, 91; the totals of
    /// [`NVLINK_ERROR_COUNTERS`]), then `nvmlDeviceGetNvLinkState` per link. NOT_SUPPORTED (or a
    /// count of 0): a GPU without NVLink.
    fn nvlink(&self, device: &Device) -> Result<NvLinkReading, NvmlError> {
        use nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_NVLINK_LINK_COUNT;
        let requests: Vec<(u32, u32)> = std::iter::once(NVML_FI_DEV_NVLINK_LINK_COUNT)
            .chain(NVLINK_ERROR_COUNTERS.iter().map(|(id, ..)| *id))
            .map(|id| (id, 0))
            .collect();
        let mut values = self
            .raw_fields(device, &requests)?
            .into_iter()
            .map(|v| v.map(|v| u64::try_from(v).unwrap_or(0)));
        let count = values.next().unwrap_or(Err(NvmlError::NotSupported))?;
        if count == 0 {
            return Err(NvmlError::NotSupported);
        }
        let errors = std::array::from_fn(|_| values.next().and_then(Result::ok));
        let mut links = Vec::new();
        for link in 0..count.min(u64::from(NVLINK_MAX_LINKS)) as u32 {
            match device.link_wrapper_for(link).is_active() {
                Ok(active) => links.push((link, active)),
                Err(e) if is_device_wide(&e) => return Err(e),
                // A link NVML cannot give the state of (not present on this board): left out.
                Err(_) => {}
            }
        }
        Ok(NvLinkReading { links, errors })
    }

    /// The T.Limit margins, in one field-values call; a field the driver lacks is None in its
    /// slot.
    fn thermal_margins(&self, device: &Device) -> Result<[Option<i64>; 4], NvmlError> {
        let requests: Vec<(u32, u32)> = THERMAL_LIMITS.iter().map(|(id, _)| (*id, 0)).collect();
        let mut values = self.raw_fields(device, &requests)?.into_iter();
        Ok(std::array::from_fn(|_| values.next().and_then(Result::ok)))
    }

    /// `nvmlDeviceGetFieldValues` through the raw symbol, for what nvml-wrapper's call cannot ask
    /// or read: a scope (the link, or UINT_MAX for all links), and NVML_VALUE_TYPE_SIGNED_INT (5),
    /// which its sample types lack. Each value with its own return code; integers only.
    fn raw_fields(
        &self,
        device: &Device,
        requests: &[(u32, u32)],
    ) -> Result<Vec<Result<i64, NvmlError>>, NvmlError> {
        use nvml_wrapper_sys::bindings::nvmlFieldValue_t;
        let sym = symbol(&self.nvml.lib().nvmlDeviceGetFieldValues)?;
        // SAFETY: the handle is valid while `device` lives; the values are plain in/out data, read
        // by the type NVML says each holds.
        unsafe {
            let mut values: Vec<nvmlFieldValue_t> = requests
                .iter()
                .map(|&(id, scope)| {
                    let mut value: nvmlFieldValue_t = std::mem::zeroed();
                    value.fieldId = id;
                    value.scopeId = scope;
                    value
                })
                .collect();
            nvml_try(sym(
                device.handle(),
                values.len() as i32,
                values.as_mut_ptr(),
            ))?;
            Ok(values
                .iter()
                .map(|v| {
                    nvml_try(v.nvmlReturn)?;
                    // nvml.h's nvmlValueType_t: UNSIGNED_INT 1, UNSIGNED_LONG 2,
                    // UNSIGNED_LONG_LONG 3, SIGNED_LONG_LONG 4, SIGNED_INT 5, UNSIGNED_SHORT 6.
                    match v.valueType {
                        1 => Ok(i64::from(v.value.uiVal)),
                        2 | 3 => Ok(i64::try_from(v.value.ullVal).unwrap_or(i64::MAX)),
                        4 => Ok(v.value.sllVal),
                        5 => Ok(i64::from(v.value.siVal)),
                        6 => Ok(i64::from(v.value.usVal)),
                        _ => Err(NvmlError::NotSupported),
                    }
                })
                .collect())
        }
    }

    /// The GPU's fabric registration: `nvmlDeviceGetGpuFabricInfoV` with the newest struct the
    /// driver accepts (v3, then v2: an older driver answers ARGUMENT_VERSION_MISMATCH), then the
    /// deprecated `nvmlDeviceGetGpuFabricInfo`. nvml-wrapper wraps neither.
    fn fabric(&self, device: &Device) -> Result<FabricReading, NvmlError> {
        use nvml_wrapper_sys::bindings::{
            nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
        };
        let lib = self.nvml.lib();
        if let Ok(sym) = symbol(&lib.nvmlDeviceGetGpuFabricInfoV) {
            // The v2 layout is v3's leading fields: one v3 buffer serves both, its version saying
            // which layout the driver may fill.
            for version in [
                struct_version::<nvmlGpuFabricInfo_v3_t>(3),
                struct_version::<nvmlGpuFabricInfo_v2_t>(2),
            ] {
                // SAFETY: a zeroed struct of plain integers, its version set as nvml.h's
                // NVML_STRUCT_VERSION builds it (size | version << 24); the driver reads
                // `version` first and writes no more than that layout; the handle is valid while
                // `device` lives.
                let mut info: nvmlGpuFabricInfo_v3_t = unsafe { std::mem::zeroed() };
                info.version = version;
                // SAFETY: as above: `info` is a zeroed v3 buffer carrying its version word, and
                // the handle is valid while `device` lives.
                match nvml_try(unsafe { sym(device.handle(), &mut info) }) {
                    Ok(()) => {
                        return Ok(FabricReading {
                            state: info.state,
                            status: info.status,
                            health_mask: Some(info.healthMask),
                        })
                    }
                    Err(e) if !is_older_driver(&e) => return Err(e),
                    Err(_) => {}
                }
            }
        }
        let sym = symbol(&lib.nvmlDeviceGetGpuFabricInfo)?;
        // SAFETY: a zeroed struct of plain integers for the driver to fill; the handle is valid.
        let mut v1: nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `v1` is the unversioned struct this call fills; the handle is valid.
        nvml_try(unsafe { sym(device.handle(), &mut v1) })?;
        Ok(FabricReading {
            state: v1.state,
            status: v1.status,
            health_mask: None,
        })
    }

    /// `nvmlDeviceGetRemappedRows` (nvml-wrapper has no wrapper for it).
    fn remapped_rows(&self, device: &Device) -> Result<RemappedRows, NvmlError> {
        let sym = symbol(&self.nvml.lib().nvmlDeviceGetRemappedRows)?;
        let (mut correctable, mut uncorrectable, mut pending, mut failed) = (0, 0, 0, 0);
        // SAFETY: the handle is valid while `device` lives; the four are plain out-parameters.
        nvml_try(unsafe {
            sym(
                device.handle(),
                &mut correctable,
                &mut uncorrectable,
                &mut pending,
                &mut failed,
            )
        })?;
        Ok(RemappedRows {
            correctable,
            uncorrectable,
            pending: pending != 0,
            failed: failed != 0,
        })
    }

    /// GPM ratios between the `previous` sample and `now`, which replaces it; None on the first
    /// read or when the sample cannot be taken (which forgets the previous one).
    fn gpm_since<'a>(
        &'a self,
        previous: &mut Option<GpmSample<'a>>,
        now: Result<GpmSample<'a>, NvmlError>,
    ) -> Option<GpmReading> {
        let Ok(now) = now else {
            *previous = None;
            return None;
        };
        let before = previous.replace(now)?;
        let ids = [
            GpmMetricId::GraphicsUtil,
            GpmMetricId::SmUtil,
            GpmMetricId::AnyTensorUtil,
            GpmMetricId::DramBwUtil,
        ];
        let values = gpm_metrics_get(&self.nvml, &before, previous.as_ref()?, &ids).ok()?;
        let ratio = |i: usize| {
            values
                .get(i)
                .and_then(|v| v.as_ref().ok())
                .map(|m| (m.value / 100.0).clamp(0.0, 1.0))
        };
        Some(GpmReading {
            graphics_active: ratio(0),
            sm_active: ratio(1),
            tensor_active: ratio(2),
            dram_active: ratio(3),
        })
    }

    /// The v2 call reports reserved memory (R510+); older drivers only answer v1.
    fn memory(&self, device: &Device) -> Result<MemoryReading, NvmlError> {
        match device.memory_info() {
            Ok(m) => Ok(MemoryReading {
                total: m.total,
                used: m.used,
                free: m.free,
                reserved: Some(m.reserved),
            }),
            Err(e) if is_older_driver(&e) => {
                let sym = symbol(&self.nvml.lib().nvmlDeviceGetMemoryInfo)?;
                // SAFETY: the handle is valid while `device` lives; the out-struct is plain data.
                unsafe {
                    let mut memory: nvml_wrapper_sys::bindings::nvmlMemory_t = std::mem::zeroed();
                    nvml_try(sym(device.handle(), &mut memory))?;
                    Ok(MemoryReading {
                        total: memory.total,
                        used: memory.used,
                        free: memory.free,
                        reserved: None,
                    })
                }
            }
            Err(e) => Err(e),
        }
    }

    /// `nvmlDeviceGetCurrentClocksEventReasons` (nvml-wrapper has no wrapper for it), else the
    /// deprecated `nvmlDeviceGetCurrentClocksThrottleReasons` that older drivers have instead.
    fn clock_event_reasons(&self, device: &Device) -> Result<u64, NvmlError> {
        let lib = self.nvml.lib();
        for sym in [
            lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref(),
            lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref(),
        ] {
            let Ok(sym) = sym else { continue };
            let mut mask = 0u64;
            // SAFETY: the handle is valid while `device` lives; `mask` is a plain out-parameter.
            let code = unsafe { sym(device.handle(), &mut mask) };
            match code {
                0 => return Ok(mask),
                NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_FUNCTION_NOT_FOUND => continue,
                other => nvml_try(other)?,
            }
        }
        Err(NvmlError::NotSupported)
    }
}

/// nvml.h's `NVML_STRUCT_VERSION(name, ver)`: the struct's size, and the version in the top byte.
fn struct_version<T>(version: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | version << 24
}

/// A raw NVML symbol, or the error nvml-wrapper gives for one the library lacks.
fn symbol<T, E: std::fmt::Display>(loaded: &Result<T, E>) -> Result<&T, NvmlError> {
    loaded
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))
}

/// An answer that means "this driver predates the call or its struct": try the older one.
fn is_older_driver(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::FunctionNotFound
            | NvmlError::UnexpectedVariant(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    )
}

/// Which of a MIG device's two instance ids.
enum InstanceKind {
    Gpu,
    Compute,
}

/// One field value of `device` (`nvmlDeviceGetFieldValues`): the value's own `nvmlReturn` (a
/// field the driver does not have is NOT_SUPPORTED there) is that field's error, not the GPU's.
fn field_value(device: &Device, id: u32) -> Result<SampleValue, NvmlError> {
    device
        .field_values_for(&[FieldId(id)])?
        .into_iter()
        .next()
        .ok_or(NvmlError::NotSupported)??
        .value
}

/// HBM temperature, through the field-values call.
fn memory_temperature(device: &Device) -> Result<u32, NvmlError> {
    match field_value(device, NVML_FI_DEV_MEMORY_TEMP)? {
        SampleValue::U32(celsius) => Ok(celsius),
        SampleValue::U64(celsius) => Ok(celsius.min(u64::from(u32::MAX)) as u32),
        SampleValue::I64(celsius) => Ok(celsius.clamp(0, i64::from(u32::MAX)) as u32),
        SampleValue::F64(celsius) => Ok(celsius.max(0.0) as u32),
    }
}

/// The driver's recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, field 230, nvml.h):
/// NOT_SUPPORTED on a driver before R565.
fn recovery_action(device: &Device) -> Result<u32, NvmlError> {
    const NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: u32 = 230;
    match field_value(device, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)? {
        SampleValue::U32(action) => Ok(action),
        SampleValue::U64(action) => Ok(u32::try_from(action).unwrap_or(u32::MAX)),
        SampleValue::I64(action) => Ok(u32::try_from(action).unwrap_or(u32::MAX)),
        SampleValue::F64(_) => Err(NvmlError::NotSupported),
    }
}

/// `NVML_NVLINK_MAX_LINKS` of nvml.h 13.3 (18 in the headers before): a link count past it is a
/// wrong answer, not more links to ask about.
const NVLINK_MAX_LINKS: u32 = 36;

/// NVML reports KB/s over a 20 ms sample.
fn pcie_throughput(device: &Device) -> Result<(u64, u64), NvmlError> {
    let tx = device.pcie_throughput(PcieUtilCounter::Send)?;
    let rx = device.pcie_throughput(PcieUtilCounter::Receive)?;
    Ok((u64::from(tx) * 1024, u64::from(rx) * 1024))
}

/// The device-wide failure an NVML error reports, if it reports one (NOT_SUPPORTED, say, concerns
/// one call only).
fn failure_of(error: &NvmlError) -> Option<GpuFailure> {
    match error {
        NvmlError::GpuLost => Some(GpuFailure::Lost),
        NvmlError::ResetRequired => Some(GpuFailure::ResetRequired),
        NvmlError::IrqIssue => Some(GpuFailure::IrqIssue),
        NvmlError::NoPermission => Some(GpuFailure::NoPermission),
        NvmlError::Unknown => Some(GpuFailure::Unknown),
        _ => None,
    }
}

/// A field's value; None when unsupported or unreadable. A device-wide failure on any call (lost,
/// reset required, IRQ trouble) fails the whole read; NO_PERMISSION or UNKNOWN on one field is
/// that field's alone (MIG hides some fields from unprivileged callers).
fn field<T>(result: Result<T, NvmlError>, failed: &mut Option<GpuFailure>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(e) => {
            if let Some(failure) = failure_of(&e).filter(|_| is_device_wide(&e)) {
                failed.get_or_insert(failure);
            }
            None
        }
    }
}

/// Whether an error says the GPU itself is in trouble (lost, reset required, IRQ trouble) rather
/// than one call.
fn is_device_wide(error: &NvmlError) -> bool {
    matches!(
        error,
        NvmlError::GpuLost | NvmlError::ResetRequired | NvmlError::IrqIssue
    )
}

/// What one GPU's previous read leaves for the next: GPM samples, of the whole GPU and of each
/// MIG GPU instance, and the newest process-utilisation sample's timestamp.
#[derive(Default)]
pub struct SinceLast<'a> {
    device: Option<GpmSample<'a>>,
    instances: BTreeMap<u32, Option<GpmSample<'a>>>,
    /// nvml.h's `lastSeenTimeStamp`: the CPU timestamp (µs) of the newest sample read; 0 before
    /// the first, which asks for every sample the driver holds.
    utilization_seen: u64,
}

/// Whose a process is, by its pid; Err says why that cannot be told.
pub type OwnerOf = dyn Fn(u32) -> Result<CgroupOwner, &'static str>;

/// The processes NVML lists on `device` (compute and graphics, the v3 calls), with their
/// framebuffer use and, given `utilization_seen`, their SM use since that timestamp (advanced
/// to the newest sample's). None when NVML refuses the list (said in `trouble`).
fn processes(
    device: &Device,
    utilization_seen: Option<&mut u64>,
    owner_of: &OwnerOf,
    trouble: &mut Vec<&'static str>,
) -> Option<Vec<GpuProcess>> {
    let mut memory: BTreeMap<u32, Option<u64>> = BTreeMap::new();
    for list in [
        device.running_compute_processes(),
        device.running_graphics_processes(),
    ] {
        match list {
            Ok(list) => {
                for p in list {
                    let used = match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes),
                        UsedGpuMemory::Unavailable => None,
                    };
                    // A process with both a compute and a graphics context is one holder of
                    // one allocation: NVML reports the same figure in both lists.
                    let entry = memory.entry(p.pid).or_insert(used);
                    *entry = (*entry).max(used);
                }
            }
            Err(e) => {
                trouble.push(refusal(
                    &e,
                    [
                        "processes_no_permission",
                        "processes_not_supported",
                        "processes_failed",
                    ],
                ));
                return None;
            }
        }
    }
    let sm = utilization_seen.and_then(|seen| match device.process_utilization_stats(*seen) {
        Ok(samples) => Some(mean_sm_since(&samples, seen)),
        // nvml.h: NOT_FOUND when there is no sample since `lastSeenTimeStamp`: no use.
        Err(NvmlError::NotFound) => Some(BTreeMap::new()),
        Err(e) => {
            trouble.push(refusal(
                &e,
                [
                    "utilization_no_permission",
                    "utilization_not_supported",
                    "utilization_failed",
                ],
            ));
            None
        }
    });
    Some(
        memory
            .into_iter()
            .map(|(pid, memory_bytes)| GpuProcess {
                pid,
                memory_bytes,
                sm_ratio: sm.as_ref().map(|sm| sm.get(&pid).copied().unwrap_or(0.0)),
                owner: owner_of(pid),
            })
            .collect(),
    )
}

/// Why a per-process call failed, as one of its `[no permission, not supported, other]` reasons:
/// NO_PERMISSION is a caller outside the host's PID namespace, NOT_SUPPORTED (or a driver without
/// the call) the GPU or driver.
fn refusal(error: &NvmlError, reasons: [&'static str; 3]) -> &'static str {
    match error {
        NvmlError::NoPermission => reasons[0],
        NvmlError::NotSupported | NvmlError::FunctionNotFound => reasons[1],
        _ => reasons[2],
    }
}

/// Each process's mean SM use (0-1) over the samples newer than `seen`, which becomes the newest
/// sample's timestamp.
fn mean_sm_since(samples: &[ProcessUtilizationSample], seen: &mut u64) -> BTreeMap<u32, f64> {
    let since = *seen;
    let mut sums: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
    for sample in samples.iter().filter(|s| s.timestamp > since) {
        let sum = sums.entry(sample.pid).or_default();
        sum.0 += f64::from(sample.sm_util.min(100)) / 100.0;
        sum.1 += 1;
        *seen = (*seen).max(sample.timestamp);
    }
    sums.into_iter()
        .map(|(pid, (sum, n))| (pid, sum / f64::from(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nvml.h's `lastSeenTimeStamp`: only samples newer than the last one read count, each
    /// process's SM use is their mean, and the next read starts after the newest.
    #[test]
    fn per_process_sm_use_is_the_mean_of_the_samples_since_the_last_read() {
        let sample = |pid, timestamp, sm_util| ProcessUtilizationSample {
            pid,
            timestamp,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        };
        let samples = [
            sample(10, 100, 90),
            sample(10, 200, 40),
            sample(10, 300, 20),
            sample(11, 300, 250),
        ];
        let mut seen = 100;
        let sm = mean_sm_since(&samples, &mut seen);
        assert!(
            (sm[&10] - 0.3).abs() < 1e-12,
            "the sample at the last timestamp read is not counted again: {sm:?}"
        );
        assert_eq!(sm[&11], 1.0, "a percentage past 100 is the whole GPU");
        assert_eq!(seen, 300);
        assert!(mean_sm_since(&samples, &mut seen).is_empty());
        assert_eq!(refusal(&NvmlError::NoPermission, ["a", "b", "c"]), "a");
        assert_eq!(refusal(&NvmlError::NotSupported, ["a", "b", "c"]), "b");
        assert_eq!(refusal(&NvmlError::Unknown, ["a", "b", "c"]), "c");
    }

    /// The versions nvml.h's NVML_STRUCT_VERSION gives the fabric structs (0x02000024, 0x03000028),
    /// from the layouts nvml-wrapper-sys binds.
    #[test]
    fn fabric_struct_versions_are_nvml_hs() {
        use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t};
        assert_eq!(struct_version::<nvmlGpuFabricInfo_v2_t>(2), 0x0200_0024);
        assert_eq!(struct_version::<nvmlGpuFabricInfo_v3_t>(3), 0x0300_0028);
    }

    /// nvml.h's error classes: LOST, RESET_REQUIRED and IRQ_ISSUE on any call fail the whole
    /// read of the GPU; NO_PERMISSION or UNKNOWN on one field (MIG hides fields from unprivileged
    /// callers) and NOT_SUPPORTED cost only that field.
    #[test]
    fn device_wide_errors_fail_the_read_and_the_others_only_their_field() {
        let mut failed = None;
        assert_eq!(field(Ok(7), &mut failed), Some(7));
        assert_eq!(
            field::<u32>(Err(NvmlError::NotSupported), &mut failed),
            None
        );
        assert_eq!(
            field::<u32>(Err(NvmlError::NoPermission), &mut failed),
            None
        );
        assert_eq!(field::<u32>(Err(NvmlError::Unknown), &mut failed), None);
        assert_eq!(failed, None, "one field's trouble is that field's");
        assert_eq!(
            field::<u32>(Err(NvmlError::ResetRequired), &mut failed),
            None
        );
        assert_eq!(field::<u32>(Err(NvmlError::GpuLost), &mut failed), None);
        assert_eq!(
            failed,
            Some(GpuFailure::ResetRequired),
            "the first device-wide failure is kept"
        );
        assert_eq!(
            failure_of(&NvmlError::NoPermission),
            Some(GpuFailure::NoPermission)
        );
        assert_eq!(failure_of(&NvmlError::InvalidArg), None);
    }

    /// What sends a call back to its older form: NOT_SUPPORTED, a symbol the library lacks,
    /// FUNCTION_NOT_FOUND, and ARGUMENT_VERSION_MISMATCH (25, a struct version newer than the
    /// driver's); a device failure never does.
    #[test]
    fn older_driver_answers_are_told_from_failures() {
        for older in [
            NvmlError::NotSupported,
            NvmlError::FunctionNotFound,
            NvmlError::FailedToLoadSymbol("nvmlDeviceGetGpuFabricInfoV".into()),
            NvmlError::UnexpectedVariant(NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        ] {
            assert!(is_older_driver(&older), "{older:?}");
        }
        for failure in [
            NvmlError::GpuLost,
            NvmlError::Unknown,
            NvmlError::UnexpectedVariant(999),
        ] {
            assert!(!is_older_driver(&failure), "{failure:?}");
        }
    }
}
