//! Per-workload gates: each pod on the node that waits for its model gets a readiness gate that
//! follows that model's verification, each pod that waits on its accelerators one that follows
//! the devices it holds, and each pod mounting a model cache writable is warned about.
//!
//! [`gate`] decides a pod's `mlnode.dev/ModelVerified` condition and when to write either gate
//! (pure); [`device_gate`] decides its `mlnode.dev/AcceleratorHealthy` (pure);
//! [`exposure`] finds the writable mounts of a cache (pure); [`controller`] watches the node's pods
//! and performs the writes.

pub mod controller;
pub mod device_gate;
pub mod exposure;
pub mod gate;
