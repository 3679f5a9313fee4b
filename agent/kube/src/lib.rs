//! mlnode-kube: the agent's Kubernetes side, what it learns from and tells the cluster.
//!
//! - [`api`]: the one client of the API server, its requests counted and its push-back honoured;
//! - [`kubelet`]: which container holds which device (the pod-resources API, DRA slices);
//! - [`startup`]: each inference pod's startup phases, from its Pod and Events;
//! - [`readiness`]: the node's conditions, its startup taint and the repair condition;
//! - [`workloads`]: each pod's readiness gate on its own model, and writable cache mounts;
//! - [`models`]: where each configured model's cache is, as pods mount it;
//! - [`node_pods`]: the node's pods by UID, for naming a process's pod;
//! - [`release_request`]: the node annotation asking the agent to let go of the GPUs.

pub mod api;
mod events;
pub mod kubelet;
pub mod models;
pub mod node_pods;
pub mod readiness;
pub mod release_request;
pub mod startup;
mod watch;
pub mod workloads;
