//! The node's pods by UID, from one watch of the pods bound to the node: where the GPU collector
//! finds the names of the pod and container a process's cgroup points at, and a device holder's
//! UID and labels. Runs only where something needs it (`nvml.process_attribution`,
//! `kubelet.pod_uid`, `kubelet.pod_labels`), with the API server the readiness controller would
//! use.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::ApiClient;
use crate::node_pods::{NodePods, NodePodsSlot};
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::settings::Toggle;

pub struct PodDirectory {
    /// Whether a consumer is configured.
    pub needed: bool,
    /// `readiness.enabled`: whether the agent talks to the API server at all.
    pub enabled: Toggle,
    /// The node's one pod watch, shared with the startup tracker and the pod gates (started by
    /// whichever starts first).
    pub node_pods: NodePodsSlot,
    pub api: ApiClient,
}

impl Component for PodDirectory {
    fn about(&self) -> About {
        About::helper("node pod directory")
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            if !self.needed {
                return Err(NotStarted::Absent(
                    "nothing asks for the pods' names, UIDs or labels (nvml.process_attribution, kubelet.pod_uid and kubelet.pod_labels are off)".into(),
                ));
            }
            let client = self
                .api
                .for_feature(self.enabled, "readiness")
                .await.map_err(|e| {
                NotStarted::Absent(format!("{e}: GPU processes are reported without pod names"))
            })?;
            NodePods::shared(
                &self.node_pods,
                client,
                self.api.recoveries(),
                &cx.node_name,
                cx.pods.clone(),
                &mut cx.tasks,
                cx.shutdown.child_token(),
            );
            Ok(Started::up(format!("pods on node {}", cx.node_name)))
        }
        .boxed()
    }
}
