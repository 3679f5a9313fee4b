//! Devices as their drivers show them, each shaped from its source: NVML through the fake library
//! ([`fake_nvml`]), NVIDIA's own mock profiles ([`nvml_profiles`]) and mock servers and PCI trees
//! ([`nvidia_mocks`]), the Neuron driver's sysfs ([`neuron_sysfs`]), the RDMA core's
//! ([`rdma_sysfs`]), journals written by systemd's own tools ([`journal`]) and the ttar archives
//! procfs keeps sysfs fixtures in ([`ttar`]).

pub mod fake_nvml;
pub mod journal;
pub mod neuron_sysfs;
pub mod nvidia_mocks;
pub mod nvml_profiles;
pub mod rdma_sysfs;
pub mod ttar;
