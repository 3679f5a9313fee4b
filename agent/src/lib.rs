//! mlnode-agent: a node agent for GPU and AWS Neuron inference nodes.
//!
//! The library holds everything the binary does, so that tests and benchmarks drive the same code
//! paths as `mlnode-agent` itself. `main.rs` only parses the command line.

pub mod cache;
pub mod cli;
pub mod config;
pub mod daemon;
pub use mlnode_verify::files;
pub mod gpu;
pub mod health;
pub mod kubelet;
pub mod metrics;
pub mod neuron;
pub mod pci;
pub mod readiness;
pub mod server;
pub mod settings;
pub mod startup;
