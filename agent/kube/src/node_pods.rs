//! The one watch of the pods bound to the node ([`NodePods`]): their store, for the pod gates, and
//! the directory of what names them by UID ([`PodDirectory`]), for a GPU process's cgroup and a
//! device's holder. [`identity`] is the pure part (a Pod to what names it); [`run`] the watch.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::api::Recoveries;
use crate::watch::watch_config;
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

/// One watch of the pods bound to the node, shared by everything that needs them: the pods
/// themselves (a reflector store: the pod gates), the directory of what names them (GPU
/// processes' owners, devices' holders), and word of each change.
#[derive(Clone)]
pub struct NodePods {
    pub store: Store<Pod>,
    /// The number of changes seen so far; Err while the watch fails (retried with backoff).
    pub changes: tokio::sync::watch::Receiver<Result<u64, String>>,
}

/// Where the one watch is kept once a component has started it, for the others; and whether
/// anything reads the pod directory (where nothing does, the watch keeps none: no work per pod
/// event for it).
#[derive(Clone, Default)]
pub struct NodePodsSlot {
    watch: std::sync::Arc<std::sync::OnceLock<NodePods>>,
    keeps_directory: bool,
}

impl NodePodsSlot {
    pub fn new(keeps_directory: bool) -> NodePodsSlot {
        NodePodsSlot {
            watch: Default::default(),
            keeps_directory,
        }
    }
}

impl NodePods {
    /// The node's watch from `slot`, started (on `tasks`, until `shutdown`) by the first caller;
    /// it keeps `directory` current where the slot says something reads it. After a failure the
    /// watch backs off, and retries at once when `recoveries` says the API server answers again.
    pub fn shared(
        slot: &NodePodsSlot,
        client: kube::Client,
        recoveries: Recoveries,
        node_name: &str,
        directory: SharedPods,
        tasks: &mut tokio::task::JoinSet<()>,
        shutdown: CancellationToken,
    ) -> NodePods {
        slot.watch
            .get_or_init(|| {
                let (store, writer) = reflector::store();
                let (tell, changes) = tokio::sync::watch::channel(Ok(0));
                let api: Api<Pod> = Api::all(client);
                let config = watch_config(&format!("spec.nodeName={node_name}"));
                let stream = reflector::reflector(writer, watcher(api, config));
                let directory = slot.keeps_directory.then_some(directory);
                let watch = Watch {
                    store: store.clone(),
                    directory,
                    tell,
                    recoveries,
                };
                tasks.spawn(watch.run(stream, shutdown));
                NodePods { store, changes }
            })
            .clone()
    }
}

/// The task of the one watch: where its events go, and what ends its back-off early.
struct Watch {
    /// The reflector's.
    store: Store<Pod>,
    directory: Option<SharedPods>,
    tell: tokio::sync::watch::Sender<Result<u64, String>>,
    recoveries: Recoveries,
}

impl Watch {
    /// Applies each event of the watch: the store is the reflector's; the directory follows it pod
    /// by pod (rebuilt whole after a relist), and each change is told. A failure is said once and
    /// told, and leaves both as they were; the watch is polled again (which retries it) after kube's
    /// back-off (0.8 s doubling to 30 s, started over after two minutes without an error; a relist's
    /// events do not start it over, so a server answering every watch with 410 is not relisted each
    /// second), or at once when the API server is seen answering again.
    async fn run(
        mut self,
        stream: impl futures_util::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>>,
        shutdown: CancellationToken,
    ) {
        let mut stream = std::pin::pin!(stream);
        let mut seen = 0u64;
        let mut trouble = mlnode_core::trouble::Trouble::default();
        let mut backoff = watcher::DefaultBackoff::default();
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = stream.next() => event,
            };
            match event {
                None => return,
                Some(Err(e)) => {
                    let message = e.to_string();
                    if let Some(message) = trouble.failed(message.clone()) {
                        tracing::warn!(error = %message, "the node's pod watch failed; the pods last seen are used until it resumes (retrying with backoff)");
                    }
                    self.tell.send_modify(|told| *told = Err(message));
                    // A recovery said before this failure is old news.
                    self.recoveries.mark_unchanged();
                    let wait = backoff.next().unwrap_or(std::time::Duration::from_secs(30));
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                        Ok(()) = self.recoveries.changed() => {}
                    }
                }
                Some(Ok(event)) => {
                    if trouble.recovered() {
                        tracing::info!("the node's pod watch works again");
                    }
                    // A relist is applied whole at its end.
                    if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
                        continue;
                    }
                    if let Some(directory) = &self.directory {
                        keep(directory, &self.store, event);
                    }
                    seen += 1;
                    self.tell.send_modify(|told| *told = Ok(seen));
                }
            }
        }
    }
}

/// The directory after `event`: the pod's identity in or out, or all of them after a relist.
fn keep(directory: &SharedPods, store: &Store<Pod>, event: watcher::Event<Pod>) {
    match event {
        watcher::Event::Init | watcher::Event::InitApply(_) => {}
        watcher::Event::InitDone => directory.set(PodDirectory::from_pods(
            store.state().iter().filter_map(|pod| identity(pod)),
        )),
        watcher::Event::Apply(pod) => {
            if let Some(identity) = identity(&pod) {
                directory.update(|d| d.insert(identity));
            }
        }
        watcher::Event::Delete(pod) => {
            if let Some(uid) = pod.metadata.uid.as_deref() {
                directory.update(|d| d.remove(uid));
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
