//! The startup-phase tracker: this node's pods, followed through the node's one pod watch.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::ApiClient;
use crate::models::{HostPaths, ModelMount, OwnPod};
use crate::node_pods::{NodePods, NodePodsSlot};
use crate::startup::lazy::content_store::ContentStore;
use crate::startup::lazy::sampler::Sampler;
use crate::startup::settings::StartupSettings;
use crate::startup::tracker::{ImageReaders, StartupMetrics, Tracker};
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::loads::LoadActivity;
use mlnode_core::metrics::Subsystem;

pub struct Startup {
    pub settings: StartupSettings,
    /// Where each configured model's cache is mounted from, to name a pod's model.
    pub models: Vec<ModelMount>,
    /// When the model monitors saw weight files opened: a pod's model-load phase.
    pub loads: LoadActivity,
    /// The node's one pod watch, shared with the pod gates and the pod directory.
    pub node_pods: NodePodsSlot,
    pub api: ApiClient,
}

impl Component for Startup {
    fn about(&self) -> About {
        About::part(
            Subsystem::Startup,
            "pod startup tracker",
            self.settings.enabled,
        )
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let store = self
                .settings
                .content_store
                .as_ref()
                .map(|store| ContentStore::new(store.path()));
            let client = self
                .api
                .for_feature(self.settings.enabled, "startup")
                .await
                .map_err(NotStarted::Absent)?;
            let metrics = StartupMetrics::register(&cx.registry)?;
            let pods = NodePods::shared(
                &self.node_pods,
                client.clone(),
                self.api.recoveries(),
                &cx.node_name,
                cx.pods.clone(),
                &mut cx.tasks,
                cx.shutdown.child_token(),
            );
            let sampler = store
                .as_ref()
                .and_then(|store| Sampler::new(&self.settings.soci, store.clone(), cx.up.clone()));
            let mut detail = format!("pods on node {}", cx.node_name);
            if let Some(store) = &self.settings.content_store {
                detail.push_str(&format!(
                    ", image pulls split by containerd's content store at {}",
                    store.path().display()
                ));
            }
            if let Some(socket) = &self.settings.soci.metrics_socket {
                detail.push_str(&format!(
                    ", the SOCI snapshotter's fetching from {}",
                    socket.path().display()
                ));
            }
            let tracker = Tracker::new(
                client,
                self.models,
                HostPaths::new(OwnPod::from_env()),
                self.loads,
                metrics,
                self.settings,
                ImageReaders { store, sampler },
            );
            cx.tasks.spawn(tracker.run(pods, cx.shutdown.child_token()));
            Ok(Started::up(detail))
        }
        .boxed()
    }
}
