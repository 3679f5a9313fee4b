//! Kubernetes control planes and what runs against them: kube-apiserver and etcd built from
//! Kubernetes' own Go modules (tests/programs/control-plane), the run's shared one
//! ([`control_plane`]) and a test's private one with etcd a process apart ([`private_control_plane`]),
//! the proxy in front of them for what the real server cannot be made to do ([`fault_proxy`]),
//! their audit log ([`audit`]), the agent installed for a Node that exists only in the API
//! ([`api_only_node`]), API objects shaped as the server returns them ([`pods`]), Karpenter's own
//! repair decision ([`karpenter`]) and a fleet of agents ([`fleet`]).

pub mod api_only_node;
pub mod audit;
pub mod control_plane;
pub mod fault_proxy;
pub mod fleet;
pub mod karpenter;
pub mod pods;
pub mod private_control_plane;
