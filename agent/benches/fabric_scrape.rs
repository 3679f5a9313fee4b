//! Cost of one scrape of a p5.48xlarge's fabric: the RDMA collector reading a sysfs tree of 32 EFA
//! devices shaped from the kernel's and the EFA driver's sources (the tests' generator), beside the
//! GPU collector encoding the same node's 8 H100s (read from memory: NVML is sampled elsewhere).
//! Prints one Markdown table: series, microseconds and bytes per scrape, and the ratio.
//!
//! `cargo bench --bench fabric_scrape -- [SCRAPES]`

// The tests' tree generator; the bench uses only part of it.
use mlnode_testbed::devices::rdma_sysfs as tree;

#[path = "support/scrape.rs"]
mod scrape;

use std::time::{Duration, Instant};

use mlnode_agent::gpu::collector::GpuCollector;
use mlnode_agent::gpu::state::{DeviceRead, GpuState};
use mlnode_agent::gpu::{GpmReading, GpuIdentity, GpuReading, MemoryReading, NvLinkReading};
use mlnode_agent::rdma::collector::Holders;
use mlnode_agent::rdma::settings::RdmaSettings;
use mlnode_agent::shared::Shared;
use mlnode_core::assignments::{Assignment, Assignments};

/// Eight H100s with every device field a sampling round reads.
fn h100s() -> GpuState {
    let mut state = GpuState {
        last_round: Some(Instant::now()),
        stall_after: Duration::from_secs(3600),
        ..GpuState::default()
    };
    for index in 0..8u32 {
        let reading = GpuReading {
            memory: Some(MemoryReading {
                total: 80 << 30,
                used: 70 << 30,
                free: 10 << 30,
                reserved: Some(1 << 28),
            }),
            clock_event_reasons: Some(0),
            sm_clock_mhz: Some(1980),
            mem_clock_mhz: Some(2619),
            temperature_c: Some(60),
            power_mw: Some(500_000),
            utilization_gpu_pct: Some(90),
            energy_mj: Some(1 << 40),
            memory_copy_util_pct: Some(40),
            pcie_replays: Some(0),
            memory_temp_c: Some(70),
            pcie_bytes_per_second: Some((1 << 30, 1 << 30)),
            nvlink_bytes: Some((1 << 40, 1 << 40)),
            // An H100 SXM's 18 NVLink links, all up.
            nvlink: Some(NvLinkReading {
                links: (0..18).map(|link| (link, true)).collect(),
                errors: [Some(0); 4],
            }),
            gpm: Some(GpmReading {
                graphics_active: Some(0.9),
                sm_active: Some(0.8),
                tensor_active: Some(0.5),
                dram_active: Some(0.6),
            }),
            recovery_action: Some(0),
            ..GpuReading::default()
        };
        let identity = GpuIdentity {
            index,
            uuid: format!("GPU-{index:08x}-0000-0000-0000-000000000000"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index * 0x10),
            model_name: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        };
        state.apply(
            index,
            DeviceRead::Read {
                identity,
                reading: Box::new(reading),
            },
            1.0,
            Instant::now(),
        );
    }
    state
}

fn main() {
    let scrapes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(500);
    let tree = tree::Tree::new();
    let efa = tree.p5();
    let devices = efa.len();
    let rdma = mlnode_agent::metrics::registry("bench");
    let settings = RdmaSettings {
        sysfs_root: tree.class(),
        pci_devices: tree.pci_devices(),
        ..RdmaSettings::default()
    };
    // One inference pod holding every EFA device, as a p5 serving one model across nodes does.
    let mut held = Assignments::default();
    for device in &efa {
        held.assign("vpc.amazonaws.com/efa", device, || Assignment {
            pod: "vllm-0".into(),
            namespace: "inference".into(),
            container: "vllm".into(),
        });
    }
    let holders = Holders {
        assignments: Shared::new(held),
        exclusive: vec!["vpc.amazonaws.com/efa".into()],
        shared: Vec::new(),
    };
    mlnode_agent::rdma::start(&settings, Some(holders), &rdma).expect("the RDMA collector");
    let gpu = mlnode_agent::metrics::registry("bench");
    let collector = GpuCollector::new(
        Shared::new(h100s()),
        Default::default(),
        Default::default(),
        Vec::new(),
        Default::default(),
        false,
        None,
    )
    .expect("the GPU collector");
    gpu.register(Box::new(collector)).expect("register");
    let (rdma_series, rdma_us, rdma_bytes) = scrape::measure(&rdma, scrapes);
    let (gpu_series, gpu_us, gpu_bytes) = scrape::measure(&gpu, scrapes);
    println!(
        "p5.48xlarge-shaped node, {scrapes} scrapes each, {} cores:",
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!();
    println!("| collector | what | series | us per scrape | bytes per scrape |");
    println!("| --- | --- | --- | --- | --- |");
    println!(
        "| rdma | {devices} EFA devices from sysfs | {rdma_series} | {rdma_us:.0} | {rdma_bytes} |"
    );
    println!("| nvml | 8 H100s from memory | {gpu_series} | {gpu_us:.0} | {gpu_bytes} |");
    println!(
        "| ratio rdma / nvml | | {:.2}x | {:.2}x | {:.2}x |",
        rdma_series as f64 / gpu_series as f64,
        rdma_us / gpu_us,
        rdma_bytes as f64 / gpu_bytes as f64
    );
}
