//! The GPU's links: its NVLink fabric registration and health checks (NVSwitch systems), its
//! NVLink links, their errors and traffic, and PCIe's throughput and replays.

use prometheus::proto::MetricType;

use super::{Group, Series};
use crate::gpu::{GpuReading, NVLINK_ERROR_COUNTERS};

pub(super) const SERIES: Group = Group {
    ours: &[
        ("mlnode_gpu_fabric_state", "The GPU's NVLink fabric registration with Fabric Manager (nvmlGpuFabricState_t): 1 not started, 2 in progress, 3 completed; absent without a fabric (no NVSwitch).", MetricType::GAUGE),
        ("mlnode_gpu_fabric_healthy", "1 when the GPU's fabric registration completed with success (CUDA can use it), else 0; absent without a fabric.", MetricType::GAUGE),
        ("mlnode_gpu_fabric_health", "1 while a fabric health check of nvml.h's healthMask is bad (degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery), 0 while good; absent where the driver reports none.", MetricType::GAUGE),
        ("mlnode_gpu_nvlink_link_active", "1 while the NVLink link is active, else 0 (nvmlDeviceGetNvLinkState), per link NVML counts (NVML_FI_DEV_NVLINK_LINK_COUNT); absent on GPUs without NVLink.", MetricType::GAUGE),
        ("mlnode_gpu_nvlink_errors_total", "NVLink errors over every link since the driver loaded, per counter (crc_flit, crc_data, replay, recovery; nvml.h's *_ERROR_COUNT_TOTAL field values); absent where the driver does not count one.", MetricType::COUNTER),
        ("mlnode_gpu_nvlink_bytes_total", "NVLink data bytes over every link since the driver loaded, per direction (tx, rx).", MetricType::COUNTER),
        ("mlnode_gpu_pcie_bytes_per_second", "PCIe throughput over NVML's last 20 ms sample, per direction (tx, rx).", MetricType::GAUGE),
        ("mlnode_gpu_pcie_replays_total", "PCIe replays (retries after link errors) since the driver loaded.", MetricType::COUNTER),
    ],
    dcgm: &[
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.", MetricType::COUNTER),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors.", MetricType::COUNTER),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", MetricType::COUNTER),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.", MetricType::COUNTER),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", MetricType::GAUGE),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", MetricType::GAUGE),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", MetricType::COUNTER),
    ],
};

pub(super) fn collect(reading: &GpuReading, series: &mut Series) {
    if let Some(fabric) = reading.fabric {
        series.gauge("mlnode_gpu_fabric_state", f64::from(fabric.state));
        series.gauge(
            "mlnode_gpu_fabric_healthy",
            f64::from(u8::from(fabric.is_ready())),
        );
        for (check, bad) in fabric.health_checks() {
            series.gauge_by(
                "mlnode_gpu_fabric_health",
                ("check", check),
                f64::from(u8::from(bad)),
            );
        }
    }
    if let Some(nvlink) = &reading.nvlink {
        for (link, active) in &nvlink.links {
            series.gauge_by(
                "mlnode_gpu_nvlink_link_active",
                ("link", &link.to_string()),
                f64::from(u8::from(*active)),
            );
        }
        for ((_, counter, dcgm), count) in NVLINK_ERROR_COUNTERS.iter().zip(nvlink.errors) {
            let Some(count) = count else { continue };
            series.counter_by(
                "mlnode_gpu_nvlink_errors_total",
                ("counter", counter),
                count as f64,
            );
            series.dcgm_counter(dcgm, count as f64);
        }
    }
    if let Some((tx, rx)) = reading.nvlink_bytes {
        for (direction, bytes) in [("tx", tx), ("rx", rx)] {
            series.counter_by(
                "mlnode_gpu_nvlink_bytes_total",
                ("direction", direction),
                bytes as f64,
            );
        }
    }
    if let Some((tx, rx)) = reading.pcie_bytes_per_second {
        for (direction, bytes, dcgm) in [
            ("tx", tx, "DCGM_FI_PROF_PCIE_TX_BYTES"),
            ("rx", rx, "DCGM_FI_PROF_PCIE_RX_BYTES"),
        ] {
            series.gauge_by(
                "mlnode_gpu_pcie_bytes_per_second",
                ("direction", direction),
                bytes as f64,
            );
            series.dcgm_gauge(dcgm, bytes as f64);
        }
    }
    if let Some(replays) = reading.pcie_replays {
        series.counter("mlnode_gpu_pcie_replays_total", f64::from(replays));
        series.dcgm_counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", f64::from(replays));
    }
}
