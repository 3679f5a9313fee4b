//! The NVIDIA GPU collector: NVML opened on a thread of its own, bounded in time.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::gpu::health::GpuHealth;
use crate::gpu::settings::NvmlSettings;
use crate::gpu::xid::XidPolicy;
use crate::gpu::GpuRuntime;
use crate::kernel_log::facts::LogFacts;
use crate::shared::Shared;
use mlnode_core::component::{About, Component, NotStarted, StartContext, Started};
use mlnode_core::metrics::Subsystem;
use mlnode_core::pods::{HolderLabels, PodNames};

/// How long NVML gets to initialise: a wedged driver can block `nvmlInit` indefinitely, and the
/// agent must not wait on it for anything but the GPU collector.
const NVML_START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Gpu {
    pub settings: NvmlSettings,
    /// Extended resources whose devices are GPUs or MIG devices (`kubelet.gpu_resource_names`).
    pub resources: Vec<String>,
    /// DRA drivers whose devices are GPUs (`kubelet.gpu_dra_drivers`).
    pub dra_drivers: Vec<String>,
    /// The node's `mlnode.dev/release-gpus` annotation while set, kept by the readiness side's
    /// node watch.
    pub release_asked: mlnode_core::shared::Shared<mlnode_accel::gpu::release::NodeAsks>,
    /// Which XIDs hold the node once they repeat (`readiness.xid_thresholds`).
    pub thresholds: mlnode_accel::gpu::xid::XidThresholds,
    /// Which XIDs hold the node (`readiness.fatal_xids`).
    pub policy: XidPolicy,
    /// What the kernel log says, when `kernel_log.enabled`.
    pub kernel_log: Option<Shared<LogFacts>>,
    /// What of a GPU's holder its series carry (`kubelet.pod_uid`, `kubelet.pod_labels`).
    pub holder_labels: HolderLabels,
}

impl Gpu {
    /// What GPUs are assigned under: the extended resources, and the DRA drivers, whose devices
    /// are looked up under their driver's name (kubelet::dra).
    fn gpu_resources(&self) -> Vec<String> {
        self.resources
            .iter()
            .chain(&self.dra_drivers)
            .cloned()
            .collect()
    }
}

impl Component for Gpu {
    fn about(&self) -> About {
        About::collector(
            Subsystem::Nvml,
            "NVIDIA GPU collector",
            self.settings.enabled,
        )
    }

    fn start<'a>(
        self: Box<Self>,
        cx: &'a mut StartContext,
    ) -> BoxFuture<'a, Result<Started, NotStarted>> {
        async move {
            let gpu = open(&self, cx).await.map_err(NotStarted::Absent)?;
            let detail = format!(
                "{} GPUs through {}",
                gpu.gpus,
                self.settings.library.display()
            );
            let resources = self.gpu_resources();
            cx.health.push(Box::new(GpuHealth {
                state: gpu.state.clone(),
                policy: self.policy,
                thresholds: self.thresholds,
                resources,
                kernel_log: self.kernel_log,
                assignments: cx.assignments.clone(),
            }));
            cx.devices.resources.extend(self.resources);
            cx.devices.dra_drivers.extend(self.dra_drivers);
            // The NVML threads are no tokio tasks: stopped when everything else stops.
            let shutdown = cx.shutdown.clone();
            cx.tasks.spawn(async move {
                shutdown.cancelled().await;
                gpu.stop();
            });
            // Up or down from here on is the sampler's to say: it knows whether NVML answers.
            Ok(Started::reporting(detail))
        }
        .boxed()
    }
}

/// Opens NVML on a thread of its own (a blocked `nvmlInit` cannot be cancelled, and a stuck
/// blocking task would hold up the async runtime's shutdown), bounded by [`NVML_START_TIMEOUT`].
async fn open(gpu: &Gpu, cx: &StartContext) -> Result<GpuRuntime, String> {
    let release_asked = gpu.release_asked.clone();
    let (settings, registry, shared, pod_names, up, kernel_log) = (
        gpu.settings.clone(),
        cx.registry.clone(),
        cx.assignments.clone(),
        PodNames {
            pods: cx.pods.clone(),
            holder: gpu.holder_labels.clone(),
        },
        cx.up.clone(),
        gpu.kernel_log.clone(),
    );
    let resources = gpu.gpu_resources();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("nvml-start".into())
        .spawn(move || {
            let _ = tx.send(GpuRuntime::start(
                &settings,
                shared,
                pod_names,
                resources,
                &registry,
                up,
                kernel_log,
                release_asked,
            ));
        })
        .map_err(|e| format!("cannot start the NVML start-up thread: {e}"))?;
    match tokio::time::timeout(NVML_START_TIMEOUT, rx).await {
        Ok(Ok(started)) => started,
        Ok(Err(_)) => Err("NVML start-up thread ended without an answer".into()),
        Err(_) => Err(format!(
            "NVML did not finish initialising within {}s (a wedged driver?); the GPU collector stays off until the agent restarts",
            NVML_START_TIMEOUT.as_secs()
        )),
    }
}
