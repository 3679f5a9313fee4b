//! mlnode-accel: the accelerator collectors. Each reads its devices with the least privilege that
//! gives the data, exports them under the names their peers' dashboards use, and judges their
//! health for the readiness gate (`mlnode_core::health`).
//!
//! - [`gpu`]: NVIDIA GPUs through NVML, labelled as dcgm-exporter labels them;
//! - [`neuron`]: AWS Neuron devices from the driver's sysfs, as neuron-monitor names them;
//! - [`pci`]: the PCI bus, which both drivers' device counts are checked against;
//! - [`kernel_log`]: the node's journal, for the faults only the drivers' log lines show;
//! - [`rdma`]: the RDMA devices (EFA, InfiniBand) from the RDMA core's sysfs class.

pub mod counters;
pub mod gpu;
pub mod kernel_log;
pub mod neuron;
pub mod pci;
pub mod rdma;
