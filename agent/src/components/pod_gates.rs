//! Per-workload model trust: each pod's `mlnode.dev/ModelVerified` readiness gate and the
//! writable-mount warnings. On wherever the readiness controller runs (`readiness.enabled`): a pod
//! opts in through its own spec, so there is nothing else to configure.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::ApiClient;
use crate::models::{HostPaths, ModelMount, OwnPod};
use crate::node_pods::{NodePods, NodePodsSlot};
use crate::readiness::settings::ReadinessSettings;
use crate::workloads::controller::{PodController, WorkloadMetrics};
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::metrics::Subsystem;

pub struct PodGates {
    pub settings: ReadinessSettings,
    /// Where each configured model's cache is mounted from.
    pub mounts: Vec<ModelMount>,
    /// The node's one pod watch, shared with the pod directory.
    pub node_pods: NodePodsSlot,
    pub api: ApiClient,
}

impl Component for PodGates {
    fn about(&self) -> About {
        About::part(
            Subsystem::PodGates,
            "pod readiness gates",
            self.settings.enabled,
        )
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let client = self.api
                .for_feature(self.settings.enabled, "readiness")
                .await
                .map_err(NotStarted::Absent)?;
            let own_pod = OwnPod::from_env();
            if own_pod.is_none() && self.mounts.iter().any(|m| m.host_path.is_none()) {
                tracing::info!("POD_NAMESPACE and POD_NAME are not set: a model without host_path is taken to be at its root on the node");
            }
            let controller = PodController {
                client,
                recoveries: self.api.recoveries(),
                node_name: cx.node_name.clone(),
                models: cx.models.clone(),
                mounts: self.mounts,
                host_paths: HostPaths::new(own_pod),
                interval: self.settings.interval.get(),
                metrics: WorkloadMetrics::register(&cx.registry)?,
                up: cx.up.clone(),
                reports: cx.latest_reports.clone(),
            };
            let pods = NodePods::shared(
                &self.node_pods,
                controller.client.clone(),
                self.api.recoveries(),
                &cx.node_name,
                cx.pods.clone(),
                &mut cx.tasks,
                cx.shutdown.child_token(),
            );
            cx.tasks.spawn(controller.run(pods, cx.shutdown.child_token()));
            // Up once the node's pods are listed and their gates written, down while that fails.
            Ok(Started::reporting(format!("pods on node {}", cx.node_name)))
        }
        .boxed()
    }
}
