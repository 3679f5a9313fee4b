//! What the kubelet tells a node agent without an API server round trip: which container holds which
//! device (the pod-resources API on its local socket).

pub mod pod_resources;
