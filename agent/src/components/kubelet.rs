//! The kubelet's pod-resources poller (and DRA slices): who holds each device the running
//! collectors label.

use std::path::PathBuf;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::ApiClient;
use crate::kubelet::dra::DraSlices;
use crate::kubelet::pod_resources::{self, Published};
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::state::NodeWorkload;

/// Started after the collectors: it asks the kubelet only for the devices they label.
pub struct Kubelet {
    pub socket: PathBuf,
    pub interval: Duration,
    /// Where the poller says whether pods hold accelerators (the verifiers' priority).
    pub workload: NodeWorkload,
    pub api: ApiClient,
}

impl Component for Kubelet {
    fn about(&self) -> About {
        About::helper("kubelet pod-resources poller")
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let devices = std::mem::take(&mut cx.devices);
            if devices.resources.is_empty() && devices.dra_drivers.is_empty() {
                return Err(NotStarted::Absent(
                    "no device collector runs, so there are no devices to label".into(),
                ));
            }
            // GPUs allocated through DRA are named by the API server's ResourceSlices. Any
            // configured API (in-cluster or KUBECONFIG) will do: nothing is asked of it until the
            // kubelet reports one.
            let dra = match devices.dra_drivers.is_empty() {
                true => None,
                false => match self.api.any().await {
                    Ok(client) => Some(DraSlices::spawn(
                        client,
                        &cx.node_name,
                        devices.dra_drivers.clone(),
                        &mut cx.tasks,
                        cx.shutdown.child_token(),
                    )),
                    Err(reason) => {
                        tracing::debug!(%reason, "GPUs allocated through DRA will carry no pod labels");
                        None
                    }
                },
            };
            let errors = pod_resources::register_errors(&cx.registry)?;
            cx.tasks.spawn(pod_resources::poll(
                self.socket.clone(),
                devices.resources.clone(),
                dra,
                self.interval,
                Published {
                    assignments: cx.assignments.clone(),
                    workload: self.workload,
                },
                errors,
                cx.shutdown.child_token(),
            ));
            Ok(Started::up(format!(
                "{} resources from {}",
                devices.resources.len(),
                self.socket.display()
            )))
        }
        .boxed()
    }
}
