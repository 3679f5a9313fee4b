//! mlnode-core: what the agent's subsystems share, so that none depends on another to talk to it.
//!
//! - [`settings`]: the value types settings are read into (bounded durations and counts, toggles);
//! - [`metrics`]: the registry every series is registered in, and the agent's own series;
//! - [`health`]: the contract between the accelerator collectors and the readiness gate;
//! - [`assignments`]: which container holds each device, from the kubelet to the collectors;
//! - [`pods`]: the node's pods by UID, from the API server to whoever names a pod;
//! - [`cgroup`]: which pod and container a process belongs to, from its cgroup;
//! - [`loads`]: when each model's weight files were last opened, from the monitors to the startup
//!   tracker;
//! - [`state`]: the model caches' and the node's state, from the monitors to the server and gates;
//! - [`shared`]: the one shape of state one part writes and others read;
//! - [`component`]: how every subsystem starts, and says whether it runs;
//! - [`trouble`]: what a retrying loop says of its failures: each new one once, its recovery once.

pub mod assignments;
pub mod cgroup;
pub mod component;
pub mod health;
pub mod loads;
pub mod metrics;
pub mod pods;
pub mod settings;
pub mod shared;
pub mod state;
pub mod trouble;
