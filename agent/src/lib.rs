//! mlnode-agent: a node agent for GPU and AWS Neuron inference nodes.
//!
//! The library holds everything the binary does, so that tests and benchmarks drive the same code
//! paths as `mlnode-agent` itself. `main.rs` only parses the command line.
//!
//! The subsystems are crates of their own, re-exported here under their module names
//! (docs/architecture.md): the verifier core (`mlnode-verify`: [`files`], and [`cache`]'s core),
//! the shared contracts (`mlnode-core`: [`settings`], [`metrics`], [`health`], [`assignments`],
//! [`loads`]), the model monitors that keep each cache verified (`mlnode-cache`: [`cache`]), the
//! accelerator collectors (`mlnode-accel`: [`gpu`], [`neuron`], [`pci`]) and the Kubernetes side
//! (`mlnode-kube`: [`kubelet`], [`startup`], [`readiness`]). This crate is the binary's wiring: the
//! config, the components and the daemon that starts them, the HTTP server, the command line.

pub mod cli;
pub mod components;
pub mod config;
pub mod daemon;
pub mod server;

pub use mlnode_accel::{gpu, kernel_log, neuron, pci, rdma};
pub use mlnode_cache as cache;
pub use mlnode_core::{assignments, health, loads, metrics, settings, shared};
pub use mlnode_files as files;
pub use mlnode_kube::{
    api, kubelet, models, node_pods, readiness, release_request, startup, workloads,
};

/// This binary's version, and the git commit build.rs recorded ("unknown" outside a checkout).
pub const BUILD: metrics::Build = metrics::Build {
    version: env!("CARGO_PKG_VERSION"),
    revision: env!("BUILD_GIT_REVISION"),
};
