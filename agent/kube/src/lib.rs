//! mlnode-kube: the agent's Kubernetes side, what it learns from and tells the cluster.
//!
//! - [`kubelet`]: which container holds which device (the pod-resources API, DRA slices);
//! - [`startup`]: each inference pod's startup phases, from its Pod and Events;
//! - [`readiness`]: the node's conditions, its startup taint and the repair condition.

pub mod kubelet;
pub mod readiness;
pub mod startup;
