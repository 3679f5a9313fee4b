//! The node's pods by UID, from one watch of the pods bound to the node: where the GPU collector
//! finds the names of the pod and container a process's cgroup points at, and a device holder's
//! UID and labels. Runs only where something needs it (`nvml.process_attribution`,
//! `kubelet.pod_uid`, `kubelet.pod_labels`), with the API server the readiness controller would
//! use.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::kube_for;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::settings::Toggle;

pub struct NodePods {
    /// Whether a consumer is configured.
    pub needed: bool,
    /// `readiness.enabled`: whether the agent talks to the API server at all.
    pub api: Toggle,
}

impl Component for NodePods {
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
            let client = kube_for(self.api, "readiness").await.map_err(|e| {
                NotStarted::Absent(format!("{e}: GPU processes are reported without pod names"))
            })?;
            cx.tasks.spawn(crate::node_pods::run(
                client,
                cx.node_name.clone(),
                cx.pods.clone(),
                cx.shutdown.child_token(),
            ));
            Ok(Started::up(format!("pods on node {}", cx.node_name)))
        }
        .boxed()
    }
}
