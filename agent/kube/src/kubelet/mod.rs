//! What the kubelet tells a node agent without an API server round trip: which container holds which
//! device (the pod-resources API on its local socket), and, for devices allocated through DRA, what
//! the API server's ResourceSlices add to name them.

pub mod dra;
pub mod pod_resources;
pub mod settings;
