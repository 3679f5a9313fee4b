//! A kubelet pod-resources server on a unix socket, answering `List` as a real kubelet does.

use std::path::PathBuf;

use fake_kubelet::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use fake_kubelet::api::*;

/// The fake, serving on a unix socket of its own until dropped.
pub struct FakeKubelet {
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
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
    /// Serves `response` to every `List`.
    pub fn serve(response: ListPodResourcesResponse) -> FakeKubelet {
        let temp = tempfile::tempdir().unwrap();
        let mut kubelet = FakeKubelet::serve_in(temp.path(), response);
        kubelet._temp = Some(temp);
        kubelet
    }

    /// Serves `kubelet.sock` in `dir`, with the permissions the kubelet gives them: the directory
    /// 0750 and the socket 0755 (net.Listen under the kubelet's umask 022), both root's.
    pub fn serve_in(dir: &std::path::Path, response: ListPodResourcesResponse) -> FakeKubelet {
        use std::os::unix::fs::PermissionsExt;
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let socket = dir.join("kubelet.sock");
        let listener = runtime
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Lister(response)))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        FakeKubelet {
            dir: dir.to_path_buf(),
            _temp: None,
            _runtime: runtime,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("kubelet.sock")
    }
}

/// One pod per entry (name, resource, device ids), in namespace `inference`, container named
/// after the pod's first word, shaped as the kubelet reports it (topology and CPU ids included).
pub fn response(pods: &[(&str, &str, &[&str])]) -> ListPodResourcesResponse {
    response_in("inference", pods)
}

/// [`response`] with the pods in `namespace`.
pub fn response_in(namespace: &str, pods: &[(&str, &str, &[&str])]) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: pods
            .iter()
            .map(|(pod, resource, ids)| PodResources {
                name: pod.to_string(),
                namespace: namespace.into(),
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
                    dynamic_resources: vec![],
                }],
            })
            .collect(),
    }
}

/// A pod whose container holds `devices` of NVIDIA's DRA driver (pool `node`) through one
/// ResourceClaim, as the kubelet reports it since 1.34 (api.proto `DynamicResource`), with the CDI
/// device names that driver writes (`k8s.gpu.nvidia.com/claim=<claim uid>-<device>`).
pub fn dra_claim(pod: &str, node: &str, devices: &[&str]) -> PodResources {
    PodResources {
        name: pod.to_string(),
        namespace: "inference".into(),
        containers: vec![ContainerResources {
            name: pod.split('-').next().unwrap_or(pod).to_string(),
            dynamic_resources: vec![DynamicResource {
                claim_name: format!("{pod}-gpu-9x2fz"),
                claim_namespace: "inference".into(),
                claim_resources: devices
                    .iter()
                    .map(|device| ClaimResource {
                        cdi_devices: vec![CdiDevice {
                            name: format!("k8s.gpu.nvidia.com/claim=5f1c7e2a-{device}"),
                        }],
                        driver_name: "gpu.nvidia.com".into(),
                        pool_name: node.to_string(),
                        device_name: device.to_string(),
                        share_id: None,
                    })
                    .collect(),
            }],
            ..Default::default()
        }],
    }
}
