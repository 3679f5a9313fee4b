//! What GPUs the node has and how the agent holds them: NVML's count and each GPU's identity, the
//! kernel's PCI bus beside it, the sampler's freshness, and the NVML handle let go for resets.

use std::time::Instant;

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::state::GpuState;
use crate::gpu::GpuIdentity;
use crate::kernel_log::parse::PciAddress;
use crate::pci::BusScan;
use mlnode_core::metrics::family::{Families, Labels};

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_count", "GPUs NVML reports on the node.", MetricType::GAUGE),
        ("mlnode_gpu_info", "One per GPU NVML lists, always 1: its labels, and minor_number (the N of /dev/nvidiaN), cuda_compute_capability and cuda_driver_version where NVML gives them.", MetricType::GAUGE),
        ("mlnode_gpu_pci_devices", "NVIDIA GPUs (display and 3D controllers of vendor 0x10de) the kernel lists on the PCI bus, physical functions only; compare with mlnode_gpu_count, NVML's.", MetricType::GAUGE),
        ("mlnode_gpu_pci_virtual_functions", "SR-IOV virtual functions of the NVIDIA GPUs on the PCI bus (entries with a physfn link): slices of the GPUs in mlnode_gpu_pci_devices, not more GPUs.", MetricType::GAUGE),
        ("mlnode_gpu_pci_passthrough", "1 for each NVIDIA GPU on the PCI bus bound to vfio-pci, handed whole to a VM: not for the host's NVML to list.", MetricType::GAUGE),
        ("mlnode_gpu_readings_age_seconds", "Time since the NVML sampler last finished reading every GPU; past five sample intervals (at least 3 s) the readings are dropped as not current.", MetricType::GAUGE),
        ("mlnode_gpu_nvml_released", "1 while the agent holds no NVML handle so that a GPU the driver asked to reset can be (nvml.release_timeout at most), else 0; the GPUs' series are absent meanwhile.", MetricType::GAUGE),
        ("mlnode_gpu_nvml_reattaches_total", "Times NVML was taken back after a release, by how: reset (the GPU left the driver and came back), annotation_removed (mlnode.dev/release-gpus removed), mig_config_done (the MIG manager's nvidia.com/mig.config.state left pending), timeout (nvml.release_timeout passed first).", MetricType::COUNTER),
        ("mlnode_gpu_nvml_reinits_total", "Times NVML was initialised again because the GPUs bound to the driver changed (one unbound for a reset or given to vfio, or bound again).", MetricType::COUNTER),
    ],
    dcgm: &[],
};

/// The node's series, of no one GPU.
pub(super) fn collect_node(state: &GpuState, now: Instant, out: &mut Families) {
    // While NVML cannot count them, there is no current count.
    if state.failing.is_none() {
        out.gauge("mlnode_gpu_count", &[], state.gpus.len() as f64);
    }
    if let Some(bus) = &state.pci {
        out.gauge("mlnode_gpu_pci_devices", &[], bus.devices.len() as f64);
        out.gauge(
            "mlnode_gpu_pci_virtual_functions",
            &[],
            bus.virtual_functions.len() as f64,
        );
        for address in bus.bound_to(BusScan::VFIO_DRIVER) {
            let bus_id = PciAddress::from_nvml(&address).map_or(address, |a| a.nvml_bus_id());
            out.gauge("mlnode_gpu_pci_passthrough", &[("pci_bus_id", bus_id)], 1.0);
        }
    }
    if let Some(last) = state.last_round {
        out.gauge(
            "mlnode_gpu_readings_age_seconds",
            &[],
            now.saturating_duration_since(last).as_secs_f64(),
        );
    }
    out.gauge(
        "mlnode_gpu_nvml_released",
        &[],
        f64::from(u8::from(state.released.is_some())),
    );
    for (after, n) in &state.reattached {
        out.counter(
            "mlnode_gpu_nvml_reattaches_total",
            &[("after", after.to_string())],
            *n as f64,
        );
    }
    out.counter("mlnode_gpu_nvml_reinits_total", &[], state.reinits as f64);
}

/// `mlnode_gpu_info`: the GPU's own labels (`series`' are its device's, without a holder), and
/// what NVML says of it that no other series carries (each left out where NVML does not say).
pub(super) fn collect_info(
    identity: &GpuIdentity,
    cuda_driver_version: Option<i32>,
    series: &mut Series,
) {
    let mut labels: Labels = series.labels.to_vec();
    if let Some(minor) = identity.minor_number {
        labels.push(("minor_number", minor.to_string()));
    }
    if let Some((major, minor)) = identity.compute_capability {
        labels.push(("cuda_compute_capability", format!("{major}.{minor}")));
    }
    // NVML's 1000 × major + 10 × minor, as nvidia-smi prints it ("12.4").
    if let Some(version) = cuda_driver_version {
        labels.push((
            "cuda_driver_version",
            format!("{}.{}", version / 1000, version % 1000 / 10),
        ));
    }
    series.out.gauge("mlnode_gpu_info", &labels, 1.0);
}
