//! The node's pods by UID ([`PodDirectory`]), kept current from one watch of the pods bound to the
//! node: what names the pod and container a GPU process's cgroup points at. [`identity`] is the
//! pure part (a Pod to what names it); [`run`] the watch.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use tokio_util::sync::CancellationToken;

use crate::watch::ErrorsOnlyBackoff;
use mlnode_core::pods::{PodDirectory, PodIdentity, SharedPods};

/// What names `pod` and its containers: each container's runtime id (`containerd://<id>`,
/// `cri-o://<id>`, `docker://<id>` in `containerStatuses`, init and ephemeral containers' too)
/// without its runtime, to the container's name. None without a UID.
pub fn identity(pod: &Pod) -> Option<PodIdentity> {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    let statuses = status.into_iter().flat_map(|s| {
        [
            &s.container_statuses,
            &s.init_container_statuses,
            &s.ephemeral_container_statuses,
        ]
        .into_iter()
        .flatten()
        .flatten()
    });
    Some(PodIdentity {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone()?,
        containers: statuses.filter_map(container_id).collect(),
        labels: meta.labels.clone().unwrap_or_default(),
    })
}

fn container_id(status: &ContainerStatus) -> Option<(String, String)> {
    let (_runtime, id) = status.container_id.as_deref()?.split_once("://")?;
    Some((id.to_string(), status.name.clone()))
}

/// Keeps `pods` current with the pods bound to `node_name` until `shutdown`. A watch that fails
/// is said once, retried with backoff, and leaves the directory as it was.
pub async fn run(
    client: kube::Client,
    node_name: String,
    pods: SharedPods,
    shutdown: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = std::pin::pin!(watcher(api, config).backoff(ErrorsOnlyBackoff::default()));
    // A relist builds the directory afresh, then replaces the old one whole.
    let mut relisting: Option<Vec<PodIdentity>> = None;
    let mut failing = String::new();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                let message = e.to_string();
                if message != failing {
                    tracing::warn!(error = %message, "the node's pod watch failed; GPU processes keep the pod names last seen (retrying with backoff)");
                    failing = message;
                }
            }
            Some(Ok(event)) => {
                if !failing.is_empty() {
                    tracing::info!("the node's pod watch works again");
                    failing.clear();
                }
                match event {
                    watcher::Event::Init => relisting = Some(Vec::new()),
                    watcher::Event::InitApply(pod) => {
                        relisting
                            .get_or_insert_with(Vec::new)
                            .extend(identity(&pod));
                    }
                    watcher::Event::InitDone => {
                        let listed = relisting.take().unwrap_or_default();
                        pods.set(PodDirectory::from_pods(listed));
                    }
                    watcher::Event::Apply(pod) => {
                        if let Some(identity) = identity(&pod) {
                            pods.update(|d| d.insert(identity));
                        }
                    }
                    watcher::Event::Delete(pod) => {
                        if let Some(uid) = pod.metadata.uid.as_deref() {
                            pods.update(|d| d.remove(uid));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as the API server returns it once its containers run (containerStatuses written by
    /// the kubelet, `containerID` as `<runtime>://<id>`).
    #[test]
    fn a_pods_containers_are_named_by_their_runtime_ids() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vllm-0", "namespace": "inference", "uid": "3f9a1c2e-7b4d-4e8f-9a0b-1c2d3e4f5a6b", "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
            "status": {
                "containerStatuses": [{"name": "vllm", "containerID": "containerd://0b2f6c", "image": "", "imageID": "", "ready": true, "restartCount": 0}],
                "initContainerStatuses": [{"name": "fetch", "containerID": "cri-o://77aa", "image": "", "imageID": "", "ready": false, "restartCount": 0}]
            }
        }))
        .unwrap();
        let found = identity(&pod).unwrap();
        assert_eq!(found.name, "vllm-0");
        assert_eq!(found.containers["0b2f6c"], "vllm");
        assert_eq!(found.containers["77aa"], "fetch");
        assert_eq!(found.labels["app"], "vllm");
        let mut pending = pod.clone();
        pending.status = None;
        assert!(identity(&pending).unwrap().containers.is_empty());
        pending.metadata.uid = None;
        assert!(identity(&pending).is_none());
    }
}
