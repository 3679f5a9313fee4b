//! A real node: its container runtime in namespaces of its own ([`runtime`]: containerd, runc,
//! CNI, the registry, SOCI), the one-node cluster that puts a real kubelet, scheduler and
//! controller manager on it ([`one_node_cluster`]), and the tests' inference server and the agent
//! running there ([`workload`]); the run's tests share it under one lock, which also keeps the
//! install one test leaves for the next ([`resident`]). Beside it, for tests that need no
//! kubelet: a container started as the kubelet would start it ([`emulated_container`]) and a fake
//! of the kubelet's pod-resources API ([`pod_resources`]). containerd's own record of a pull,
//! from its log, is the image pull's ground truth ([`containerd_log`]).

pub mod containerd_log;
pub mod emulated_container;
pub mod one_node_cluster;
pub mod pod_resources;
pub mod resident;
pub mod runtime;
pub mod workload;
