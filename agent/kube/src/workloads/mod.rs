//! Per-workload model trust: each pod on the node that waits for its model gets a readiness gate
//! that follows that model's verification, and each pod mounting a model cache writable is
//! warned about.
//!
//! [`gate`] decides a pod's `mlnode.dev/ModelVerified` condition and when to write it (pure);
//! [`exposure`] finds the writable mounts of a cache (pure); [`controller`] watches the node's pods
//! and performs the writes.

pub mod controller;
pub mod exposure;
pub mod gate;
