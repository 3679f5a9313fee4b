//! Follows the pods on this node (the node's one pod watch, `node_pods`: kube's watcher with
//! `fieldSelector=spec.nodeName=<node>`, which lists, watches, backs off and relists on 410 Gone)
//! and, when a pod (or a restarted main container) becomes Ready, lists that pod's Events by
//! `involvedObject.uid` once, splits the startup into phases, exports them and logs one line. No
//! cluster-wide event watch, no polling.

use std::collections::{HashSet, VecDeque};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use prometheus::{CounterVec, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::image_pull::{self, PodSplit};
use super::lazy::content_store::ContentStore;
use super::lazy::sampler::Sampler;
use super::phases::{self, Phase, Pull, Startup};
use super::settings::StartupSettings;
use crate::models::{model_of, HostPaths, ModelMount};
use crate::node_pods::NodePods;
use mlnode_core::loads::{unix_now, LoadActivity};

/// kubelet's `kubelet_pod_start_sli_duration_seconds` buckets, so the two line up.
pub const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];
const IMAGE_SIZE_BUCKETS: [f64; 8] = [1e8, 5e8, 1e9, 2e9, 5e9, 1e10, 2e10, 5e10];
/// Bytes fetched in one phase: from none (the phase read nothing new) to a large image's whole.
const FETCHED_BUCKETS: [f64; 9] = [
    1048576.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
    17179869184.0,
    68719476736.0,
    274877906944.0,
];

#[derive(Clone)]
pub struct StartupMetrics {
    phase: HistogramVec,
    total: HistogramVec,
    image_bytes: HistogramVec,
    cache_hits: CounterVec,
    last_phase: GaugeVec,
    fetched_bytes: HistogramVec,
    fetch_seconds: HistogramVec,
    lazy_images: CounterVec,
    download_seconds: HistogramVec,
    download_bytes: HistogramVec,
    transfer_seconds: HistogramVec,
    unpack_seconds: HistogramVec,
}

impl StartupMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<StartupMetrics> {
        let buckets = POD_START_BUCKETS.to_vec();
        let metrics = StartupMetrics {
            phase: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_phase_seconds", "Duration of one phase of a pod startup; a phase whose source is missing is not observed.").buckets(buckets.clone()),
                &["phase", "model_name", "namespace"],
            )?,
            total: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_total_seconds", "Pod creation (or, after a restart, the previous container's exit) to Ready.").buckets(buckets),
                &["model_name", "namespace"],
            )?,
            image_bytes: HistogramVec::new(
                HistogramOpts::new("mlnode_image_pull_bytes", "Size of each image pulled for a pod startup, as kubelet reports it.").buckets(IMAGE_SIZE_BUCKETS.to_vec()),
                &["namespace"],
            )?,
            cache_hits: CounterVec::new(
                Opts::new("mlnode_image_pull_cache_hits_total", "Containers whose image was already present on the node."),
                &["namespace"],
            )?,
            last_phase: GaugeVec::new(
                Opts::new("mlnode_pod_startup_last_phase_seconds", "Phases of the most recent pod startups only (bounded by startup.recent_pods and startup.recent_max_age)."),
                &["namespace", "pod", "phase"],
            )?,
            fetched_bytes: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_phase_fetched_bytes", "Bytes of a lazily loaded image fetched from the registry during one phase of a pod startup (phase start_to_ready where the model load is unknown), from the SOCI snapshotter's metrics; not observed where they were not read.").buckets(FETCHED_BUCKETS.to_vec()),
                &["phase", "model_name", "namespace"],
            )?,
            fetch_seconds: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_phase_fetch_seconds", "Time within one phase of a pod startup during which the SOCI snapshotter was fetching the pod's image, at the agent's sampling resolution (startup.soci.sample_interval).").buckets(POD_START_BUCKETS.to_vec()),
                &["phase", "model_name", "namespace"],
            )?,
            download_seconds: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_model_download_seconds", "The model's weights written into its cache during one pod startup (an init container's download, the server's own): the first write to the last weight file completed; not observed where none was written, or a file written was not completed.").buckets(POD_START_BUCKETS.to_vec()),
                &["model_name", "namespace"],
            )?,
            download_bytes: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_model_download_bytes", "Bytes of the weight files written into the model's cache during one pod startup, each file once, at its last completion.").buckets(IMAGE_SIZE_BUCKETS.to_vec()),
                &["model_name", "namespace"],
            )?,
            transfer_seconds: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_image_transfer_seconds", "The image pulls of one pod startup until the last of each image's layers was in containerd's content store, summed over its pulls; not observed where the store is not read (startup.content_store), for a startup of cache hits only, or where a pull could not be split (the reason is in its startup log line).").buckets(POD_START_BUCKETS.to_vec()),
                &["model_name", "namespace"],
            )?,
            unpack_seconds: HistogramVec::new(
                HistogramOpts::new("mlnode_pod_startup_image_unpack_seconds", "The rest of one pod startup's image pulls, after each image's last layer was in: unpacking its layers into snapshots; with image_transfer, the kubelet's pull figure.").buckets(POD_START_BUCKETS.to_vec()),
                &["model_name", "namespace"],
            )?,
            lazy_images: CounterVec::new(
                Opts::new("mlnode_pod_startup_lazy_images_total", "Pod startups whose main image the SOCI snapshotter loaded lazily (lazy=true) or not (false: no SOCI index, or a fallback to a whole pull)."),
                &["namespace", "lazy"],
            )?,
        };
        registry.register(Box::new(metrics.phase.clone()))?;
        registry.register(Box::new(metrics.total.clone()))?;
        registry.register(Box::new(metrics.image_bytes.clone()))?;
        registry.register(Box::new(metrics.cache_hits.clone()))?;
        registry.register(Box::new(metrics.last_phase.clone()))?;
        registry.register(Box::new(metrics.fetched_bytes.clone()))?;
        registry.register(Box::new(metrics.fetch_seconds.clone()))?;
        registry.register(Box::new(metrics.lazy_images.clone()))?;
        registry.register(Box::new(metrics.download_seconds.clone()))?;
        registry.register(Box::new(metrics.download_bytes.clone()))?;
        registry.register(Box::new(metrics.transfer_seconds.clone()))?;
        registry.register(Box::new(metrics.unpack_seconds.clone()))?;
        Ok(metrics)
    }

    pub fn set_last_phases(&self, startup: &Startup) {
        for (phase, seconds) in &startup.phases {
            self.last_phase
                .with_label_values(&[&startup.namespace, &startup.pod, phase.as_str()])
                .set(*seconds);
        }
    }

    pub fn observe(&self, startup: &Startup) {
        let model = startup.model_name.as_deref().unwrap_or("");
        for (phase, seconds) in &startup.phases {
            self.phase
                .with_label_values(&[phase.as_str(), model, &startup.namespace])
                .observe(*seconds);
        }
        self.total
            .with_label_values(&[model, &startup.namespace])
            .observe(startup.total_seconds);
        for pull in &startup.pulls {
            if pull.cache_hit {
                self.cache_hits
                    .with_label_values(&[&startup.namespace])
                    .inc();
            } else if let Some(size) = pull.size_bytes {
                self.image_bytes
                    .with_label_values(&[&startup.namespace])
                    .observe(size as f64);
            }
        }
        if let Some(download) = &startup.model_download {
            let labels = [model, startup.namespace.as_str()];
            self.download_seconds
                .with_label_values(&labels)
                .observe(download.seconds);
            self.download_bytes
                .with_label_values(&labels)
                .observe(download.bytes as f64);
        }
        if let Some(split) = startup.image_pull_split.as_ref().and_then(PodSplit::split) {
            let labels = [model, startup.namespace.as_str()];
            self.transfer_seconds
                .with_label_values(&labels)
                .observe(split.transfer_seconds);
            self.unpack_seconds
                .with_label_values(&labels)
                .observe(split.unpack_seconds);
        }
        let Some(load) = &startup.lazy_load else {
            return;
        };
        if let Some(lazy) = load.lazy {
            self.lazy_images
                .with_label_values(&[
                    startup.namespace.as_str(),
                    if lazy { "true" } else { "false" },
                ])
                .inc();
        }
        for (stretch, fetch) in &load.fetched {
            let labels = [stretch.as_str(), model, &startup.namespace];
            self.fetched_bytes
                .with_label_values(&labels)
                .observe(fetch.fetched_bytes as f64);
            self.fetch_seconds
                .with_label_values(&labels)
                .observe(fetch.fetch_seconds);
        }
    }
}

/// What the tracker reads of the node's images, where configured: containerd's content store
/// (each pull split into transfer and unpack) and the SOCI snapshotter (a lazily loaded image's
/// fetching).
pub struct ImageReaders {
    pub store: Option<ContentStore>,
    pub sampler: Option<Sampler>,
}

pub struct Tracker {
    client: kube::Client,
    models: Vec<ModelMount>,
    /// A pod is matched to a model by the cache's path on the node, which may be derived from
    /// the agent's own pod (as the pod gates derive it).
    host_paths: HostPaths,
    loads: LoadActivity,
    metrics: StartupMetrics,
    settings: StartupSettings,
    /// containerd's content store, where `startup.content_store` names it: each pull split.
    store: Option<ContentStore>,
    /// Reads the SOCI snapshotter while pods start, where `startup.soci` names it.
    sampler: Option<Sampler>,
    /// The kinds of reason a pull was left unsplit that are logged already: each once.
    unsplit_logged: HashSet<&'static str>,
}

impl Tracker {
    pub fn new(
        client: kube::Client,
        models: Vec<ModelMount>,
        host_paths: HostPaths,
        loads: LoadActivity,
        metrics: StartupMetrics,
        settings: StartupSettings,
        ImageReaders { store, sampler }: ImageReaders,
    ) -> Tracker {
        Tracker {
            client,
            models,
            host_paths,
            loads,
            metrics,
            settings,
            store,
            sampler,
            unsplit_logged: HashSet::new(),
        }
    }

    /// Follows the node's pods through its one watch (`pods`): at each change, each pod newly
    /// Ready (or Ready again after a restart) is measured once.
    pub async fn run(mut self, mut pods: NodePods, shutdown: CancellationToken) {
        let started_at = unix_now();
        // (pod uid, restart count) seen Ready, reported or not; pruned to the pods the watch
        // still has, so it stays as small as the node's pod count.
        let mut seen_ready: HashSet<(String, i32)> = HashSet::new();
        let mut recent: VecDeque<(f64, String, String)> = VecDeque::new();
        let mut ticks = tokio::time::interval(self.settings.soci.sample_interval.get());
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // While a pod of the node is starting, the snapshotter is read at every tick.
        let mut starting = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = pods.changes.changed() => if changed.is_err() { return },
                _ = ticks.tick(), if starting => {
                    if let Some(sampler) = &mut self.sampler {
                        sampler.sample(unix_now()).await;
                    }
                    continue;
                }
            }
            // When the change arrived: a pod Ready in it turned Ready by then.
            let seen = unix_now();
            // The watch says its failures itself; meanwhile its store is as it was.
            if pods.changes.borrow_and_update().is_err() {
                continue;
            }
            let listed = pods.store.state();
            self.host_paths.derive(&mut self.models, &listed);
            let uids: HashSet<&str> = listed
                .iter()
                .filter_map(|pod| pod.metadata.uid.as_deref())
                .collect();
            seen_ready.retain(|(uid, _)| uids.contains(uid.as_str()));
            let ready_now: Vec<&Pod> = listed
                .iter()
                .filter(|pod| newly_ready(pod, started_at, &mut seen_ready))
                .map(|pod| pod.as_ref())
                .collect();
            let oldest_starting = listed
                .iter()
                .filter_map(|pod| starting_since(pod))
                .reduce(f64::min);
            if let Some(sampler) = &mut self.sampler {
                // A reading as the pods change: one at each startup's Ready brackets its last phase.
                if oldest_starting.is_some() || !ready_now.is_empty() {
                    sampler.sample(seen).await;
                }
            }
            starting = self.sampler.is_some() && oldest_starting.is_some();
            for pod in ready_now {
                if let Some(startup) = self.measure(pod, seen).await {
                    self.record(&startup, &mut recent);
                }
            }
            if let Some(sampler) = &mut self.sampler {
                sampler.forget_before(oldest_starting);
            }
        }
    }

    /// Lists the pod's events (one request) and computes its phases; `seen`: when the watch told
    /// of the pod as it is.
    async fn measure(&mut self, pod: &Pod, seen: f64) -> Option<Startup> {
        let namespace = pod.metadata.namespace.clone()?;
        let uid = pod.metadata.uid.clone()?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let listed = match events
            .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(pod = ?pod.metadata.name, error = %e, "cannot list the pod's events; image pull and container start unknown");
                Vec::new()
            }
        };
        let model = model_of(pod, &self.models);
        let window = startup_window(pod);
        let load_end = match (&model, window) {
            (Some(model), Some((from, until))) => self.loads.last_open(model, from, until),
            _ => None,
        };
        let download = match (&model, download_window(pod)) {
            (Some(model), Some((from, until))) => self.loads.download(model, from, until),
            _ => None,
        };
        let mut startup = phases::compute(pod, &listed, model, load_end, Some(seen))?;
        startup.model_download = download.as_ref().map(phases::ModelDownload::of);
        if let Some(sampler) = &mut self.sampler {
            let stretches = startup.intervals.stretches();
            let pod_name = (startup.namespace.as_str(), startup.pod.as_str());
            startup.lazy_load = Some(sampler.lazy_load(pod_name, &stretches, main_image_id(pod)));
        }
        if let Some(store) = &self.store {
            let lazy = startup.lazy_load.as_ref().and_then(|load| load.lazy) == Some(true);
            startup.image_pull_split = Some(if lazy {
                // Its layers are fetched as they are read, never unpacked: the pull is whole.
                PodSplit::Absent {
                    absent: "the image is loaded lazily: its layers are fetched as the workload reads them, and none is unpacked".into(),
                }
            } else {
                split_pulls(store, &mut self.unsplit_logged, pod, &startup.pulls)
            });
        }
        Some(startup)
    }

    fn record(&self, startup: &Startup, recent: &mut VecDeque<(f64, String, String)>) {
        self.metrics.observe(startup);
        self.metrics.set_last_phases(startup);
        let now = unix_now();
        recent.push_back((now, startup.namespace.clone(), startup.pod.clone()));
        // Bound the per-pod series: the oldest go first, by count and by age.
        while recent.len() > *self.settings.recent_pods
            || recent
                .front()
                .is_some_and(|(t, _, _)| now - t > self.settings.recent_max_age.as_secs_f64())
        {
            let Some((_, namespace, pod)) = recent.pop_front() else {
                break;
            };
            if recent.iter().any(|(_, n, p)| *n == namespace && *p == pod) {
                continue;
            }
            for phase in Phase::ALL {
                let _ = self.metrics.last_phase.remove_label_values(&[
                    &namespace,
                    &pod,
                    phase.as_str(),
                ]);
            }
        }
        let breakdown = serde_json::to_string(&startup).unwrap_or_default();
        tracing::info!(namespace = %startup.namespace, pod = %startup.pod, model_name = startup.model_name.as_deref().unwrap_or(""), total_seconds = startup.total_seconds, phases = %breakdown, "pod startup");
    }
}

/// Whether `pod` is a startup to measure now: Ready for the first time that `seen` (the pod
/// uids and main-container restart counts seen Ready so far) knows of, and Ready after the agent
/// started. A pod already Ready when the agent first sees it is added to `seen` unmeasured (its
/// load was not seen), so that its later Ready transitions, after a kubelet restart, a probe's
/// flap or a readiness gate, are not taken for startups; each restart of the main container is
/// a startup of its own.
fn newly_ready(pod: &Pod, started_at: f64, seen: &mut HashSet<(String, i32)>) -> bool {
    let Some((key, ready_at)) = ready_key(pod) else {
        return false;
    };
    // API times are whole seconds: a second's slack.
    seen.insert(key) && ready_at + 1.0 >= started_at
}

/// A Ready pod's key (uid, main-container restart count) and when it turned Ready.
fn ready_key(pod: &Pod) -> Option<((String, i32), f64)> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    let ready_at = phases::seconds_of(ready.last_transition_time.as_ref()?);
    let main = phases::main_container(pod)?;
    let restarts = status
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == main)?
        .restart_count;
    Some(((pod.metadata.uid.clone()?, restarts), ready_at))
}

/// Since when `pod` has been starting: created (or its main container last exited) and not yet
/// Ready, nor finished, nor being deleted. None for any other pod.
fn starting_since(pod: &Pod) -> Option<f64> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref();
    if status.is_some_and(|s| {
        matches!(s.phase.as_deref(), Some("Succeeded" | "Failed"))
            || s.conditions.as_ref().is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
    }) {
        return None;
    }
    let created = phases::seconds_of(pod.metadata.creation_timestamp.as_ref()?);
    let main = phases::main_container(pod)?;
    let last_exit = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|c| c.name == main))
        .and_then(|c| {
            c.last_state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
        })
        .map(phases::seconds_of);
    Some(last_exit.map_or(created, |exit| exit.max(created)))
}

/// Each pull of the startup that was no cache hit, split by when containerd committed its
/// image's blobs in `store`. A reason about the node (a store that cannot be read, or lacks
/// what a pull wrote) is logged once for each kind (`logged`: the kinds said already); one
/// about a pull's own times only in its line.
fn split_pulls(
    store: &ContentStore,
    logged: &mut HashSet<&'static str>,
    pod: &Pod,
    pulls: &[Pull],
) -> PodSplit {
    let mut splits = Vec::new();
    for pull in pulls.iter().filter(|pull| !pull.cache_hit) {
        let image = pull
            .field_path
            .as_deref()
            .and_then(|path| image_id_of(pod, path))
            .zip(pull.pulled_at);
        let Some((image_id, pulled_at)) = image else {
            splits.push(Err(format!(
                "the kubelet reports no image id for {:?}, which the image was pulled for",
                pull.field_path.as_deref().unwrap_or("")
            )));
            continue;
        };
        let commits = match store.commits(image_id) {
            Ok(commits) => commits,
            Err(e) => {
                let reason = e.to_string();
                if logged.insert(e.kind()) {
                    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
                    let name = pod.metadata.name.as_deref().unwrap_or("");
                    tracing::warn!(%namespace, pod = %name, %reason, "an image pull is not split into transfer and unpack; its pull is given whole (logged once for each kind of reason)");
                }
                splits.push(Err(reason));
                continue;
            }
        };
        splits
            .push(image_pull::split(pull.seconds, pulled_at, &commits).map_err(|e| e.to_string()));
    }
    PodSplit::of(splits)
}

/// The image a container the kubelet names by its field path (`spec.containers{name}`,
/// `spec.initContainers{name}`) runs, as it reports it (`imageID`).
fn image_id_of<'a>(pod: &'a Pod, field_path: &str) -> Option<&'a str> {
    let status = pod.status.as_ref()?;
    let (statuses, name) = if let Some(name) = field_path.strip_prefix("spec.initContainers{") {
        (status.init_container_statuses.as_ref()?, name)
    } else {
        (
            status.container_statuses.as_ref()?,
            field_path.strip_prefix("spec.containers{")?,
        )
    };
    let name = name.strip_suffix('}')?;
    statuses
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.image_id.as_str())
        .filter(|id| !id.is_empty())
}

/// The image the main container runs, as the kubelet reports it (`imageID`).
fn main_image_id(pod: &Pod) -> Option<&str> {
    image_id_of(
        pod,
        &format!("spec.containers{{{}}}", phases::main_container(pod)?),
    )
}

/// When the pod's model may have been downloaded for it: from its creation (its init containers
/// run after) to Ready, a second wider each side for the API's whole seconds.
fn download_window(pod: &Pod) -> Option<(f64, f64)> {
    let created = pod.metadata.creation_timestamp.as_ref()?;
    let ready = phases::condition_time(pod, "Ready")?;
    Some((phases::seconds_of(created) - 1.0, ready + 1.0))
}

/// From the main container's start to Ready: where a model load can be.
fn startup_window(pod: &Pod) -> Option<(f64, f64)> {
    let status = pod.status.as_ref()?;
    let main = phases::main_container(pod)?;
    let started = status
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == main)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()?;
    let ready = phases::condition_time(pod, "Ready")?;
    Some((phases::seconds_of(started) - 1.0, ready + 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: &str, restarts: i32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vllm-0", "namespace": "inference", "uid": "u1"},
            "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready}],
                "containerStatuses": [{
                    "name": "vllm", "image": "vllm", "imageID": "", "ready": true,
                    "restartCount": restarts,
                }],
            },
        }))
        .unwrap()
    }

    // The agent started at 12:00:10.
    const AGENT: f64 = 1_796_472_010.0;

    #[test]
    fn a_pod_ready_before_the_agent_is_no_startup_even_when_ready_again() {
        let mut seen = HashSet::new();
        assert!(!newly_ready(
            &pod("2026-12-05T11:00:00Z", 0),
            AGENT,
            &mut seen
        ));
        // The kubelet restarted: Ready again, later, with the same container.
        assert!(!newly_ready(
            &pod("2026-12-05T12:05:00Z", 0),
            AGENT,
            &mut seen
        ));
        // The container restarted: a startup of its own.
        assert!(newly_ready(
            &pod("2026-12-05T12:06:00Z", 1),
            AGENT,
            &mut seen
        ));
        assert!(
            !newly_ready(&pod("2026-12-05T12:07:00Z", 1), AGENT, &mut seen),
            "once"
        );
    }

    #[test]
    fn a_pod_that_turns_ready_after_the_agent_started_is_measured_once() {
        let mut seen = HashSet::new();
        assert!(newly_ready(
            &pod("2026-12-05T12:00:40Z", 0),
            AGENT,
            &mut seen
        ));
        assert!(!newly_ready(
            &pod("2026-12-05T12:01:40Z", 0),
            AGENT,
            &mut seen
        ));
        let mut seen = HashSet::new();
        assert!(
            newly_ready(&pod("2026-12-05T12:00:09Z", 0), AGENT, &mut seen),
            "within the API's second"
        );
    }

    #[test]
    fn a_pod_is_starting_from_its_creation_or_its_last_exit_until_ready_finished_or_deleted() {
        let pod = |status: serde_json::Value, deleting: bool| -> Pod {
            let mut pod = serde_json::json!({
                "metadata": {"name": "vllm-0", "uid": "u1", "creationTimestamp": "2026-12-05T12:00:00Z"},
                "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
                "status": status,
            });
            if deleting {
                pod["metadata"]["deletionTimestamp"] = serde_json::json!("2026-12-05T12:30:00Z");
            }
            serde_json::from_value(pod).unwrap()
        };
        let created = 1_796_472_000.0;
        assert_eq!(
            starting_since(&pod(serde_json::json!({"phase": "Pending"}), false)),
            Some(created)
        );
        let restarted = serde_json::json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": "vllm", "image": "vllm", "imageID": "", "ready": false, "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-12-05T12:10:00Z"}},
            }],
        });
        assert_eq!(
            starting_since(&pod(restarted.clone(), false)),
            Some(created + 600.0),
            "from the main container's last exit"
        );
        assert_eq!(starting_since(&pod(restarted, true)), None, "being deleted");
        let ready = serde_json::json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T12:01:00Z"}]});
        assert_eq!(starting_since(&pod(ready, false)), None);
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(
                starting_since(&pod(serde_json::json!({"phase": phase}), false)),
                None,
                "{phase}"
            );
        }
    }

    #[test]
    fn a_pulls_image_is_the_one_its_container_runs_init_containers_included() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vllm-0", "uid": "u1"},
            "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
            "status": {
                "initContainerStatuses": [{
                    "name": "download", "image": "s5cmd", "imageID": "r/s5cmd@sha256:aa",
                    "ready": false, "restartCount": 0,
                }],
                "containerStatuses": [{
                    "name": "vllm", "image": "vllm", "imageID": "r/vllm@sha256:bb",
                    "ready": true, "restartCount": 0,
                }],
            },
        }))
        .unwrap();
        assert_eq!(
            image_id_of(&pod, "spec.initContainers{download}"),
            Some("r/s5cmd@sha256:aa")
        );
        assert_eq!(
            image_id_of(&pod, "spec.containers{vllm}"),
            Some("r/vllm@sha256:bb")
        );
        assert_eq!(main_image_id(&pod), Some("r/vllm@sha256:bb"));
        assert_eq!(image_id_of(&pod, "spec.containers{other}"), None);
        assert_eq!(image_id_of(&pod, "spec.ephemeralContainers{debug}"), None);
    }
}
