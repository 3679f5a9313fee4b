//! The kubelet pod-resources API (v1 `List`) over its unix socket: which container each GPU or
//! Neuron device is assigned to, for dcgm-exporter's `pod`/`namespace`/`container` labels. Read-only;
//! needs the socket's directory mounted, nothing else.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Endpoint, Uri};

use super::dra::{DraIndex, DraSlices};
use mlnode_core::assignments::{Assignment, Assignments, SharedAssignments};
use mlnode_core::state::{NodeWorkload, Workload};

/// The generated protobuf types and gRPC client for `v1.PodResourcesLister`.
pub mod api {
    tonic::include_proto!("v1");
}

/// What the poller publishes from each answer: who holds which device, for the device series'
/// pod labels, and whether any pod holds one, for the hashing priority.
pub struct Published {
    pub assignments: SharedAssignments,
    pub workload: NodeWorkload,
}

/// Bounds one List call: a wedged kubelet must not stall the poller.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The kubelet's `List` answer.
pub async fn list(socket: &Path) -> Result<api::ListPodResourcesResponse, String> {
    let path = socket.to_path_buf();
    // The URI is required by the API and ignored by the connector.
    let channel = Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .map_err(|e| {
            format!(
                "cannot connect to {}: {}",
                socket.display(),
                error_chain(&e)
            )
        })?;
    let mut client = api::pod_resources_lister_client::PodResourcesListerClient::new(channel);
    let response = client
        .list(api::ListPodResourcesRequest {})
        .await
        .map_err(|status| format!("List on {} failed: {}", socket.display(), status.message()))?
        .into_inner();
    Ok(response)
}

/// Whether resource `name` is one `pattern` names: exactly, or by prefix where the pattern ends in
/// `*` (`nvidia.com/mig-*`: the device plugin's mixed MIG strategy names a resource per profile).
fn names(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Picks out the devices of the wanted resources, each kept under the pattern that named it, and
/// the DRA devices `dra` resolves. A device shared between containers (GPU time-slicing hands out
/// replicas `GPU-<uuid>::<n>`, EKS MIG devices `MIG-<uuid>::<n>`, a DRA claim shared by several
/// containers or a `share_id`) is attributed to the first container listed; each container's
/// replica is kept too, for the per-process series' `vgpu`.
pub fn assignments(
    response: &api::ListPodResourcesResponse,
    resource_names: &[String],
    dra: &DraIndex,
) -> Assignments {
    let mut out = Assignments::default();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            let holder = || Assignment {
                pod: pod.name.clone(),
                namespace: pod.namespace.clone(),
                container: container.name.clone(),
            };
            for device in container
                .dynamic_resources
                .iter()
                .flat_map(|claim| &claim.claim_resources)
            {
                let pool = (&device.driver_name, &device.pool_name);
                if let Some(uuid) = dra.uuid(pool.0, pool.1, &device.device_name) {
                    out.assign(&device.driver_name, uuid, holder);
                }
            }
            for devices in &container.devices {
                let Some(pattern) = resource_names
                    .iter()
                    .find(|p| names(p, &devices.resource_name))
                else {
                    continue;
                };
                for id in &devices.device_ids {
                    let (device, replica) = match id.split_once("::") {
                        Some((device, replica)) => (device, Some(replica)),
                        None => (id.as_str(), None),
                    };
                    out.assign(pattern, device, holder);
                    if let Some(replica) = replica {
                        out.assign_replica(device, replica, holder());
                    }
                }
            }
        }
    }
    out
}

/// Whether the kubelet reports any device of `drivers` allocated to a container through DRA.
fn reports_dra(response: &api::ListPodResourcesResponse, drivers: &[String]) -> bool {
    response
        .pod_resources
        .iter()
        .flat_map(|pod| &pod.containers)
        .flat_map(|container| &container.dynamic_resources)
        .flat_map(|claim| &claim.claim_resources)
        .any(|device| drivers.contains(&device.driver_name))
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Keeps `shared` current until `shutdown`. A socket that is absent or failing logs once (and once
/// more when it recovers) and leaves the devices unlabelled; nothing else depends on it.
/// `mlnode_kubelet_pod_resources_errors_total`: failed `List` calls. While they fail, device series
/// carry no pod labels; the log says so once per distinct reason, this counts every one.
pub fn register_errors(
    registry: &prometheus::Registry,
) -> prometheus::Result<prometheus::IntCounter> {
    let errors = prometheus::IntCounter::new(
        "mlnode_kubelet_pod_resources_errors_total",
        "Failed List calls to the kubelet pod-resources API; while they fail, device series carry no pod labels.",
    )?;
    registry.register(Box::new(errors.clone()))?;
    Ok(errors)
}

/// `dra`, where the API server is reachable, names the devices allocated through DRA.
pub async fn poll(
    socket: PathBuf,
    resource_names: Vec<String>,
    dra: Option<DraSlices>,
    interval: Duration,
    published: Published,
    errors: prometheus::IntCounter,
    shutdown: CancellationToken,
) {
    let mut trouble = mlnode_core::trouble::Trouble::default();
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match list(&socket).await {
            Ok(response) => {
                if trouble.recovered() {
                    tracing::info!(socket = %socket.display(), "kubelet pod-resources API answers again");
                }
                let dra = match &dra {
                    Some(dra) if reports_dra(&response, dra.drivers()) => dra.index().await,
                    _ => DraIndex::default(),
                };
                let found = assignments(&response, &resource_names, &dra);
                published.workload.set(if found.is_empty() {
                    Workload::NoAcceleratorPods
                } else {
                    Workload::AcceleratorPods
                });
                published.assignments.set(found);
            }
            Err(reason) => {
                errors.inc();
                if let Some(reason) = trouble.failed(reason) {
                    tracing::warn!(error = %reason, "no pod labels on devices: the kubelet pod-resources API is not available");
                }
                published.workload.set(Workload::Unknown);
                published.assignments.set(Assignments::default());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::api::*;
    use super::*;

    fn pod(name: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: "inference".into(),
            containers: vec![ContainerResources {
                name: container.into(),
                devices: vec![ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                }],
                cpu_ids: vec![],
                memory: vec![],
                dynamic_resources: vec![],
            }],
        }
    }

    #[test]
    fn only_wanted_resources_and_replicas_fold_to_their_gpu() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "vllm-0",
                    "vllm",
                    "nvidia.com/gpu",
                    &["GPU-aaa", "GPU-bbb::3"],
                ),
                pod("other", "c", "example.com/fpga", &["fpga-1"]),
                pod("vllm-1", "vllm", "nvidia.com/gpu", &["GPU-bbb::4"]),
            ],
        };
        let gpus = ["nvidia.com/gpu".to_string()];
        let found = assignments(&response, &gpus, &DraIndex::default());
        assert_eq!(found.len(), 2);
        assert_eq!(found.find(&gpus, "GPU-aaa").unwrap().pod, "vllm-0");
        assert_eq!(
            found.find(&gpus, "GPU-bbb").unwrap().pod,
            "vllm-0",
            "first listed container wins for a shared GPU"
        );
        let holder = |pod: &str| Assignment {
            pod: pod.into(),
            namespace: "inference".into(),
            container: "vllm".into(),
        };
        assert_eq!(found.replica("GPU-bbb", &holder("vllm-0")), Some("3"));
        assert_eq!(found.replica("GPU-bbb", &holder("vllm-1")), Some("4"));
        assert_eq!(found.replica("GPU-aaa", &holder("vllm-0")), None);
        assert!(
            found
                .find(&["example.com/fpga".to_string()], "fpga-1")
                .is_none(),
            "only resources asked for"
        );
    }

    #[test]
    fn a_trailing_star_names_every_mig_profile_resource() {
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod("small", "vllm", "nvidia.com/mig-1g.10gb", &["MIG-aaa::0"]),
                pod("mid", "vllm", "nvidia.com/mig-3g.40gb", &["MIG-bbb"]),
                pod("other", "c", "nvidia.com/migrate", &["x"]),
            ],
        };
        let wanted = ["nvidia.com/gpu".to_string(), "nvidia.com/mig-*".to_string()];
        let found = assignments(&response, &wanted, &DraIndex::default());
        assert_eq!(found.find(&wanted, "MIG-aaa").unwrap().pod, "small");
        assert_eq!(found.find(&wanted, "MIG-bbb").unwrap().pod, "mid");
        assert_eq!(found.len(), 2, "nvidia.com/migrate is not a MIG profile");
    }

    /// A container holding claimed devices, as the kubelet reports them (api.proto
    /// `DynamicResource`, `ClaimResource` with the CDI device names the NVIDIA driver writes).
    fn claimed(pod: &str, devices: &[(&str, &str)]) -> PodResources {
        PodResources {
            name: pod.into(),
            namespace: "inference".into(),
            containers: vec![ContainerResources {
                name: "vllm".into(),
                dynamic_resources: vec![DynamicResource {
                    claim_name: format!("{pod}-gpu-claim-9x2fz"),
                    claim_namespace: "inference".into(),
                    claim_resources: devices
                        .iter()
                        .map(|(driver, device)| ClaimResource {
                            cdi_devices: vec![CdiDevice {
                                name: format!("k8s.{driver}/claim=0b7f5a4e-{device}"),
                            }],
                            driver_name: driver.to_string(),
                            pool_name: "gpu-node-1".into(),
                            device_name: device.to_string(),
                            share_id: None,
                        })
                        .collect(),
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn claimed_gpus_are_attributed_under_their_driver_and_uuid() {
        let drivers = ["gpu.nvidia.com".to_string()];
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                claimed("vllm-0", &[("gpu.nvidia.com", "gpu-0")]),
                claimed("vllm-1", &[("gpu.nvidia.com", "gpu-1-mig-1g10gb-19-0")]),
                claimed("nic", &[("dra.net", "eth1")]),
            ],
        };
        assert!(reports_dra(&response, &drivers));
        assert!(!reports_dra(&response, &["gpu.example.com".to_string()]));
        let slice = crate::kubelet::dra::tests::nvidia_slice("gpu-node-1");
        let index = DraIndex::of(&[slice], &drivers);
        let found = assignments(&response, &["nvidia.com/gpu".to_string()], &index);
        assert_eq!(found.len(), 2, "{found:?}");
        let lookup = ["nvidia.com/gpu".to_string(), "gpu.nvidia.com".to_string()];
        assert_eq!(
            found
                .find(&lookup, "GPU-00000000-1111-2222-3333-444444444440")
                .map(|a| a.pod.as_str()),
            Some("vllm-0")
        );
        assert_eq!(
            found
                .find(&lookup, "MIG-11111111-2222-3333-4444-555555555555")
                .map(|a| a.pod.as_str()),
            Some("vllm-1")
        );
        assert!(
            assignments(&response, &[], &DraIndex::default()).is_empty(),
            "unresolved devices name nothing"
        );
    }
}
