//! The AWS Neuron collector, its neuron-monitor input, and the node labels its series carry.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use super::ApiClient;
use crate::kernel_log::facts::LogFacts;
use crate::neuron::health::NeuronHealth;
use crate::neuron::settings::NeuronSettings;
use crate::neuron::{self, monitor_input, NodeLabels, SharedNodeLabels};
use crate::shared::Shared;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::metrics::Subsystem;
use mlnode_core::pods::{HolderLabels, PodNames};
use mlnode_core::settings::Toggle;

pub struct Neuron {
    pub settings: NeuronSettings,
    /// Extended resources whose device ids are Neuron device indexes, and global NeuronCore
    /// indexes (`kubelet.neuron_device_resource_names`, `kubelet.neuron_core_resource_names`).
    pub device_resources: Vec<String>,
    pub core_resources: Vec<String>,
    /// What the kernel log says, when `kernel_log.enabled`.
    pub kernel_log: Option<Shared<LogFacts>>,
    /// What of a device's holder its series carry (`kubelet.pod_uid`, `kubelet.pod_labels`).
    pub holder_labels: HolderLabels,
    pub api: ApiClient,
}

impl Component for Neuron {
    fn about(&self) -> About {
        About::collector(Subsystem::Neuron, "Neuron collector", self.settings.enabled)
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let settings = &self.settings;
            let node_labels = SharedNodeLabels::default();
            let monitor_input = settings.monitor_input.as_ref().and_then(|path| {
                match monitor_input::prepare(path) {
                    Ok(()) => Some((path.clone(), monitor_input::SharedRuntimes::default())),
                    Err(reason) => {
                        tracing::error!(%reason, "no neuron-monitor runtime series");
                        None
                    }
                }
            });
            let devices = neuron::start(
                settings,
                (self.device_resources.clone(), self.core_resources.clone()),
                cx.assignments.clone(),
                node_labels.clone(),
                monitor_input.as_ref().map(|(_, runtimes)| runtimes.clone()),
                PodNames {
                    pods: cx.pods.clone(),
                    holder: self.holder_labels.clone(),
                },
                &cx.registry,
            )
            .map_err(NotStarted::Absent)?;
            cx.health.push(Box::new(NeuronHealth::new(
                settings.clone(),
                self.kernel_log.clone(),
                cx.assignments.clone(),
                (self.device_resources.clone(), self.core_resources.clone()),
            )));
            cx.devices.resources.extend(self.device_resources.iter().cloned());
            cx.devices.resources.extend(self.core_resources.iter().cloned());
            if let Some((path, runtimes)) = monitor_input {
                let reader = monitor_input::read(path, runtimes, cx.shutdown.child_token());
                cx.tasks.spawn(reader);
            }
            if settings.instance_type.is_empty() || settings.availability_zone.is_empty() {
                match self.api.for_feature(Toggle::Auto, "neuron").await {
                    Ok(client) => {
                        let reader = read_node_labels(
                            client,
                            cx.node_name.clone(),
                            node_labels,
                            cx.shutdown.child_token(),
                        );
                        cx.tasks.spawn(reader);
                    }
                    Err(reason) => tracing::info!(
                        %reason,
                        "Neuron series carry no instance_type or availability_zone label but the configured ones (neuron.instance_type, neuron.availability_zone)"
                    ),
                }
            }
            Ok(Started::up(format!(
                "{devices} devices under {}",
                settings.sysfs_root.display()
            )))
        }
        .boxed()
    }
}

/// Reads this node's instance type and zone labels once, retrying with a jittered doubling wait
/// (1 s to a minute) while the API server cannot answer: they are set when the kubelet registers the node
/// and do not change.
async fn read_node_labels(
    client: kube::Client,
    node_name: String,
    shared: SharedNodeLabels,
    shutdown: CancellationToken,
) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let mut backoff = mlnode_kube::api::Backoff::default();
    loop {
        let wait = match nodes.get(&node_name).await {
            Ok(node) => {
                let labels = NodeLabels::of(&node);
                tracing::info!(instance_type = %labels.instance_type, availability_zone = %labels.availability_zone, "read the node's instance type and zone for the Neuron series");
                shared.set(labels);
                return;
            }
            Err(e) => {
                let wait = backoff.failed_now();
                tracing::warn!(node = %node_name, error = %e, retry_in = ?wait, "cannot read the node's instance type label");
                wait
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
