//! GPUs allocated through Dynamic Resource Allocation. The kubelet's pod-resources answer names a
//! claimed device by driver, pool and device (`gpu.nvidia.com`, the node's name, `gpu-0`); only the
//! driver's ResourceSlices say which GPU that is, by the device's `uuid` attribute, as NVIDIA's DRA
//! driver publishes it (NVIDIA/k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go`: full GPUs
//! `gpu-<minor>`, static MIG devices `gpu-<minor>-mig-<profile>-<id>-<start>` with their own
//! `MIG-` uuid). dcgm-exporter resolves them the same way (`internal/pkg/transformation/dra.go`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// (driver, pool, device) → that device's NVML UUID (`GPU-…` or `MIG-…`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraIndex(BTreeMap<(String, String, String), String>);

impl DraIndex {
    /// The devices of `drivers` in `slices` that carry a `uuid` attribute. A device without one
    /// (a dynamic-MIG placement before the MIG device exists, a VFIO passthrough GPU NVML cannot
    /// see) has no series to label.
    pub fn of<'a>(slices: impl IntoIterator<Item = &'a ResourceSlice>, drivers: &[String]) -> Self {
        let mut index = BTreeMap::new();
        for slice in slices {
            let spec = &slice.spec;
            if !drivers.contains(&spec.driver) {
                continue;
            }
            for device in spec.devices.iter().flatten() {
                if let Some(uuid) = uuid_attribute(device, &spec.driver) {
                    index.insert(
                        (
                            spec.driver.clone(),
                            spec.pool.name.clone(),
                            device.name.clone(),
                        ),
                        uuid.to_string(),
                    );
                }
            }
        }
        DraIndex(index)
    }

    pub fn uuid(&self, driver: &str, pool: &str, device: &str) -> Option<&str> {
        self.0
            .get(&(driver.to_string(), pool.to_string(), device.to_string()))
            .map(String::as_str)
    }
}

/// A device's `uuid`, written as the driver publishes it (unqualified, meaning the driver's own
/// domain) or fully qualified: the API accepts both spellings for the same attribute.
fn uuid_attribute<'a>(device: &'a Device, driver: &str) -> Option<&'a str> {
    let attributes = device.attributes.as_ref()?;
    attributes
        .get("uuid")
        .or_else(|| attributes.get(&format!("{driver}/uuid")))?
        .string
        .as_deref()
}

/// How long the first resolution waits for the ResourceSlices' initial list.
const FIRST_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// This node's ResourceSlices, kept current by a watch (list, watch, relist on 410 Gone) that starts
/// only when the kubelet first reports a device of one of `drivers` ([`DraSlices::index`]): a
/// cluster without DRA sees no request for them and needs no RBAC for them.
#[derive(Clone)]
pub struct DraSlices {
    drivers: Vec<String>,
    store: Store<ResourceSlice>,
    start: Arc<Notify>,
    started: Arc<AtomicBool>,
}

impl DraSlices {
    /// Spawns the watch task, idle until [`DraSlices::index`] first needs it.
    pub fn spawn(
        client: kube::Client,
        node_name: &str,
        drivers: Vec<String>,
        tasks: &mut tokio::task::JoinSet<()>,
        shutdown: CancellationToken,
    ) -> DraSlices {
        let (store, writer) = reflector::store();
        let start = Arc::new(Notify::new());
        tasks.spawn(watch(
            Api::all(client),
            format!("spec.nodeName={node_name}"),
            writer,
            start.clone(),
            shutdown,
        ));
        DraSlices {
            drivers,
            store,
            start,
            started: Arc::default(),
        }
    }

    pub fn drivers(&self) -> &[String] {
        &self.drivers
    }

    /// The devices of this node's slices, starting the watch on the first call and waiting a
    /// little for its first list then only: a watch the API server refuses must not hold up every
    /// later round of pod labels.
    pub async fn index(&self) -> DraIndex {
        if !self.started.swap(true, Ordering::Relaxed) {
            // A stored permit: the task starts even if it was not waiting yet.
            self.start.notify_one();
            let _ = tokio::time::timeout(FIRST_LIST_TIMEOUT, self.store.wait_until_ready()).await;
        }
        DraIndex::of(self.store.state().iter().map(Arc::as_ref), &self.drivers)
    }
}

async fn watch(
    slices: Api<ResourceSlice>,
    on_this_node: String,
    writer: reflector::store::Writer<ResourceSlice>,
    start: Arc<Notify>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = start.notified() => {}
    }
    tracing::info!("the kubelet reports GPUs allocated through DRA: watching this node's ResourceSlices to name them");
    let config = crate::watch::watch_config(&on_this_node);
    let events = reflector::reflector(writer, watcher(slices, config)).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut trouble = mlnode_core::trouble::Trouble::default();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Ok(_)) => {
                if trouble.recovered() {
                    tracing::info!("ResourceSlices can be watched again");
                }
            }
            Some(Err(e)) => {
                if let Some(reason) = trouble.failed(e.to_string()) {
                    tracing::warn!(error = %reason, "GPUs allocated through DRA carry no pod labels: cannot watch ResourceSlices (resource.k8s.io/v1, Kubernetes 1.34+; RBAC list and watch)");
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ResourceSlice as NVIDIA's DRA driver publishes it for node `gpu-node-1` (the fixture's
    /// SOURCES entry cites the driver code each field comes from).
    pub(crate) fn nvidia_slice(node: &str) -> ResourceSlice {
        let fixture = include_str!("../../../../tests/fixtures/dra/nvidia-resourceslice.json");
        serde_json::from_str(&fixture.replace("gpu-node-1", node)).unwrap()
    }

    #[test]
    fn devices_resolve_to_their_uuids_in_either_attribute_spelling() {
        let mut other = nvidia_slice("gpu-node-1");
        other.spec.driver = "gpu.example.com".into();
        let slices = [nvidia_slice("gpu-node-1"), other];
        let index = DraIndex::of(&slices, &["gpu.nvidia.com".to_string()]);
        let node = "gpu-node-1";
        assert_eq!(
            index.uuid("gpu.nvidia.com", node, "gpu-0"),
            Some("GPU-00000000-1111-2222-3333-444444444440")
        );
        assert_eq!(
            index.uuid("gpu.nvidia.com", node, "gpu-1-mig-1g10gb-19-0"),
            Some("MIG-11111111-2222-3333-4444-555555555555"),
            "a qualified attribute name is the same attribute"
        );
        assert_eq!(
            index.uuid("gpu.nvidia.com", node, "gpu-1-mig-3g40gb-9-4"),
            None,
            "a placement with no MIG device yet names no series"
        );
        assert_eq!(index.uuid("gpu.example.com", node, "gpu-0"), None);
        assert_eq!(index.uuid("gpu.nvidia.com", "other-node", "gpu-0"), None);
    }

    /// An API server that refuses every request, as one without the RBAC rule does.
    fn refusing_api() -> kube::Client {
        use axum::http::Response;
        let service = tower::service_fn(|_request| async {
            let status = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"resourceslices.resource.k8s.io is forbidden","reason":"Forbidden","code":403}"#;
            Response::builder()
                .status(403)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(status.to_vec()))
        });
        kube::Client::new(service, "default")
    }

    /// A watch the API server refuses costs the first round of pod labels its short wait, and no
    /// later round anything (the poller calls `index` every `pod_resources_interval`).
    #[tokio::test(start_paused = true)]
    async fn a_refused_watch_holds_up_only_the_first_round() {
        let mut tasks = tokio::task::JoinSet::new();
        let shutdown = CancellationToken::new();
        let dra = DraSlices::spawn(
            refusing_api(),
            "gpu-node-1",
            vec!["gpu.nvidia.com".into()],
            &mut tasks,
            shutdown.clone(),
        );
        let first = tokio::time::Instant::now();
        assert_eq!(dra.index().await, DraIndex::default());
        assert_eq!(first.elapsed(), FIRST_LIST_TIMEOUT);
        let later = tokio::time::Instant::now();
        assert_eq!(dra.index().await, DraIndex::default());
        assert_eq!(later.elapsed(), Duration::ZERO);
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
    }
}
