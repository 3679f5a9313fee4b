//! The kubelet pod-resources server API, generated for the tests' fake kubelet
//! (agent/tests/common/kubelet.rs). The agent's library carries only the client.

pub mod api {
    tonic::include_proto!("v1");
}
