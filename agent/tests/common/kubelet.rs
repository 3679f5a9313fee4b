//! A kubelet pod-resources server on a unix socket, answering `List` as a real kubelet does.

use std::path::PathBuf;

use mlnode_agent::kubelet::pod_resources::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use mlnode_agent::kubelet::pod_resources::api::*;

pub struct FakeKubelet {
    dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

struct Lister(ListPodResourcesResponse);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

impl FakeKubelet {
    pub fn serve(response: ListPodResourcesResponse) -> FakeKubelet {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let listener = runtime
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .unwrap();
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Lister(response)))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        FakeKubelet {
            dir,
            _runtime: runtime,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kubelet.sock")
    }
}

/// One pod per entry (name, resource, device ids), in namespace `inference`, container named
/// after the pod's first word, shaped as the kubelet reports it (topology and CPU ids included).
pub fn response(pods: &[(&str, &str, &[&str])]) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: pods
            .iter()
            .map(|(pod, resource, ids)| PodResources {
                name: pod.to_string(),
                namespace: "inference".into(),
                containers: vec![ContainerResources {
                    name: pod.split('-').next().unwrap_or(pod).to_string(),
                    devices: vec![ContainerDevices {
                        resource_name: resource.to_string(),
                        device_ids: ids.iter().map(|s| s.to_string()).collect(),
                        topology: Some(TopologyInfo {
                            nodes: vec![NumaNode { id: 0 }],
                        }),
                    }],
                    cpu_ids: vec![2, 3],
                    memory: vec![],
                }],
            })
            .collect(),
    }
}
