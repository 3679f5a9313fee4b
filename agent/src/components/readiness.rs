//! The readiness controller: the node's conditions, its startup taint and the repair condition,
//! from the models' state and the accelerator collectors' health.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::ApiClient;
use crate::readiness::controller::{Controller, ReadinessMetrics, Sources};
use crate::readiness::settings::ReadinessSettings;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::health::DeviceKind;
use mlnode_core::metrics::Subsystem;
use mlnode_core::shared::Shared;
use mlnode_core::state::{NodeRecords, NodeTaint};

/// Started after the collectors: it takes their health reports from the context.
pub struct Readiness {
    pub settings: ReadinessSettings,
    /// Where the controller says whether our taint is on the node (the verifiers' priority).
    pub node_taint: NodeTaint,
    /// Where the controller hands the monitors what a previous agent of this boot verified.
    pub node_records: NodeRecords,
    /// Where the node watch keeps the `mlnode.dev/release-gpus` annotation for the GPU collector.
    pub release_asked: Shared<mlnode_accel::gpu::release::NodeAsks>,
    pub api: ApiClient,
}

impl Component for Readiness {
    fn about(&self) -> About {
        About::part(
            Subsystem::Readiness,
            "node readiness gates",
            self.settings.enabled,
        )
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let client = match self
                .api
                .for_feature(self.settings.enabled, "readiness")
                .await
            {
                Ok(client) => client,
                Err(reason) => {
                    // No controller, so no taint of ours and no record kept on the node: the
                    // monitors need not wait to learn either.
                    self.node_taint.set(false);
                    self.node_records.set(Default::default());
                    return Err(NotStarted::Absent(reason));
                }
            };
            let sources = Sources {
                models: cx.models.clone(),
                health: std::mem::take(&mut cx.health),
                missing_collectors: cx.required_missing.clone(),
                node_taint: self.node_taint,
                node_records: self.node_records,
                latest_reports: cx.latest_reports.clone(),
            };
            let detail = format!(
                "{} models, {} accelerator collectors",
                sources.models.len(),
                sources.health.len()
            );
            // One watch of the node, only where a GPU collector runs to let go of NVML.
            if sources.health.iter().any(|h| h.kind() == DeviceKind::Gpu) {
                cx.tasks.spawn(crate::release_request::run(
                    client.clone(),
                    cx.node_name.clone(),
                    self.release_asked,
                    cx.shutdown.child_token(),
                ));
            }
            let metrics = ReadinessMetrics::register(&cx.registry)?;
            let controller = Controller::new(
                client,
                self.api.recoveries(),
                cx.node_name.clone(),
                self.settings,
                sources,
                metrics,
                cx.up.clone(),
            );
            cx.tasks.spawn(controller.run(cx.shutdown.child_token()));
            // Up once a sync with the API server succeeds, down while they fail.
            Ok(Started::reporting(detail))
        }
        .boxed()
    }
}
