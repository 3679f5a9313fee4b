//! `mlnode-agent serve`: starts the components (`crate::components`, one contract in
//! `mlnode_core::component`) and the HTTP server, and takes them down again on SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use crate::cache::metrics::CacheMetrics;
use crate::cache::monitor;
use crate::cache::priority::Hashers;
use crate::cache::state::NodeFacts;
use crate::cache::watch::FileWatch;
use crate::components::{
    gpu::Gpu, kernel_log::KernelLog, kubelet::Kubelet, models::Models, neuron::Neuron,
    pod_directory::PodDirectory, pod_gates::PodGates, rdma::Rdma, readiness::Readiness,
    startup::Startup, NodeLabelsError,
};
use crate::config::{self, Config};
use crate::metrics::{AgentMetrics, Subsystem};
use crate::server::{self, AppState};
use mlnode_core::component::{self, Component, StartContext};
use mlnode_core::loads::LoadActivity;

/// What a restarted model monitor allows, beyond the start jitter, for the readiness controller's
/// first read of the node before it hashes without the previous agent's record.
const RECORD_READ: Duration = Duration::from_secs(10);
/// How long the monitors get to stop after the signal: in-flight hashing is cancelled, not awaited.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(700);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {addr}: {source} (set `listen`, --listen or MLNODE_LISTEN to a free address)")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start {threads} hashing threads: {reason}")]
    Pool { threads: usize, reason: String },
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("models[].node_selector needs this node's labels, and {reason}: give the agent the API server (in cluster, or KUBECONFIG), or remove node_selector")]
    NodeLabels { reason: String },
    #[error("cannot install a signal handler: {0}")]
    Signal(std::io::Error),
    #[error("HTTP server failed: {0}")]
    Server(std::io::Error),
}

/// What talks to hardware or the cluster, in the order each needs the ones before it: the
/// collectors offer their health and devices, the kubelet poller takes the devices, the readiness
/// controller the health. The first list talks to the node only; the second, the API server, after
/// the start jitter. All start after the server, so that none of them can keep `/metrics`,
/// `/healthz` or SIGTERM waiting.
fn collectors(
    config: &Config,
    node: &NodeFacts,
    loads: &LoadActivity,
    api: crate::components::ApiClient,
) -> [Vec<Box<dyn Component>>; 2] {
    let kubelet = &config.kubelet;
    // The kernel log's facts, read by the GPU and Neuron verdicts beside their own; what was
    // logged before now, NVML's events of this agent cannot have delivered.
    let started = std::time::Instant::now();
    let kernel_log = config
        .kernel_log
        .enabled
        .then(|| crate::shared::Shared::new(crate::kernel_log::facts::LogFacts::new(started)));
    // One watch of the node's pods, for the startup tracker, the pod gates and the pod directory;
    // the directory is kept only where something names pods by it.
    let names_pods = config.nvml.process_attribution || !kubelet.holder_labels().is_off();
    let node_pods = crate::node_pods::NodePodsSlot::new(names_pods);
    // The node's release annotation: kept by the readiness side's node watch, read by NVML's.
    let release_asked = crate::shared::Shared::new(Default::default());
    let on_the_node: Vec<Box<dyn Component>> = vec![
        Box::new(KernelLog {
            settings: config.kernel_log.clone(),
            facts: kernel_log.clone().unwrap_or_default(),
        }),
        Box::new(Gpu {
            settings: config.nvml.clone(),
            resources: kubelet.gpu_resource_names.clone(),
            dra_drivers: kubelet
                .gpu_dra_drivers
                .iter()
                .map(|d| d.as_str().to_string())
                .collect(),
            policy: config.readiness.fatal_xids.clone(),
            thresholds: config.readiness.xid_thresholds.clone(),
            release_asked: release_asked.clone(),
            kernel_log: kernel_log.clone(),
            holder_labels: kubelet.holder_labels(),
        }),
        Box::new(Neuron {
            settings: config.neuron.clone(),
            device_resources: kubelet.neuron_device_resource_names.clone(),
            core_resources: kubelet.neuron_core_resource_names.clone(),
            kernel_log,
            holder_labels: kubelet.holder_labels(),
            api: api.clone(),
        }),
        Box::new(Rdma {
            settings: config.rdma.clone(),
            resources: kubelet.rdma_resource_names.clone(),
            shared_resources: kubelet.rdma_shared_resource_names.clone(),
        }),
        Box::new(Kubelet {
            socket: kubelet.pod_resources_socket.clone(),
            interval: kubelet.pod_resources_interval.get(),
            workload: node.workload.clone(),
            api: api.clone(),
        }),
    ];
    let with_the_api_server: Vec<Box<dyn Component>> = vec![
        Box::new(Startup {
            settings: config.startup.clone(),
            models: config.models.iter().map(config::model_mount).collect(),
            loads: loads.clone(),
            node_pods: node_pods.clone(),
            api: api.clone(),
        }),
        Box::new(Readiness {
            settings: config.readiness.clone(),
            node_taint: node.taint.clone(),
            node_records: node.records.clone(),
            release_asked,
            api: api.clone(),
        }),
        Box::new(PodGates {
            settings: config.readiness.clone(),
            mounts: config.models.iter().map(config::model_mount).collect(),
            node_pods: node_pods.clone(),
            api: api.clone(),
        }),
        Box::new(PodDirectory {
            needed: names_pods,
            enabled: config.readiness.enabled,
            node_pods,
            api,
        }),
    ];
    [on_the_node, with_the_api_server]
}

/// How often, and how far apart, the node's labels are asked for at start before the agent gives
/// up (and the kubelet restarts it, with its own back-off).
const NODE_LABEL_TRIES: u32 = 5;
const NODE_LABEL_RETRY: Duration = Duration::from_secs(2);

/// The models this node is one of: all of them unless one has a `node_selector`, in which case
/// the node's labels are read (one GET at start) and each model's selector applied.
async fn models_for_this_node(
    config: &Config,
    api: &crate::components::ApiClient,
) -> Result<Vec<crate::cache::settings::ModelConfig>, DaemonError> {
    if config.models.iter().all(|m| m.node_selector.is_empty()) {
        return Ok(config.models.clone());
    }
    let mut tries = 0;
    let labels = loop {
        tries += 1;
        match api.node_labels(&config.node_name).await {
            Ok(labels) => break labels,
            Err(NodeLabelsError::NoApi(reason)) => return Err(DaemonError::NodeLabels { reason }),
            Err(NodeLabelsError::Request(reason)) if tries >= NODE_LABEL_TRIES => {
                return Err(DaemonError::NodeLabels {
                    reason: format!("{reason} ({tries} tries)"),
                })
            }
            Err(NodeLabelsError::Request(reason)) => {
                tracing::warn!(%reason, "cannot read the node's labels for models[].node_selector; retrying");
                tokio::time::sleep(NODE_LABEL_RETRY).await;
            }
        }
    };
    let (kept, elsewhere): (Vec<_>, Vec<_>) = config
        .models
        .iter()
        .cloned()
        .partition(|m| m.selects(&labels));
    for model in &elsewhere {
        tracing::info!(model = %model.name, node_selector = ?model.node_selector, "model not kept on this node: its node_selector does not select it");
    }
    Ok(kept)
}

/// Every scraper, probe and client holds a descriptor, and the soft limit is often 1,024: raise it
/// to the hard limit, as the Go runtime does for every Go exporter. Returns the limit in force.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => return hard,
            Err(e) => tracing::debug!(error = %e, "cannot raise the open file limit"),
        }
    }
    soft
}

pub async fn run(mut config: Config) -> Result<(), DaemonError> {
    let max_connections = server::connection_cap(raise_open_file_limit());
    let registry = crate::metrics::registry_labelled(&config.node_name, config.hostname_label);
    let agent_metrics = AgentMetrics::register(&registry, crate::BUILD)?;
    let cache_metrics = Arc::new(CacheMetrics::register(&registry)?);

    let threads = config.verify.threads.get();
    let max_rate = config
        .verify
        .max_bytes_per_second
        .map(|rate| rate.bytes_per_second());
    let hashers = Arc::new(
        Hashers::new(threads, max_rate).map_err(|e| DaemonError::Pool {
            threads,
            reason: e.to_string(),
        })?,
    );
    if let Some(rate) = max_rate {
        cache_metrics.max_bytes_per_second(&registry, rate)?;
    }
    let node = NodeFacts::default();

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| DaemonError::Listen {
            addr: config.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(DaemonError::Server)?;

    let signal = |kind| tokio::signal::unix::signal(kind).map_err(DaemonError::Signal);
    let mut sigterm = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sighup = signal(tokio::signal::unix::SignalKind::hangup())?;

    // Until their start says otherwise, no collector is up.
    for collector in Subsystem::ALL {
        agent_metrics.set_up(collector, false);
    }
    let api = crate::components::ApiClient::new(&registry, config.api_request_timeout.get())?;
    config.models = models_for_this_node(&config, &api).await?;
    let loads = LoadActivity::default();
    let mut cx = StartContext::new(&config.node_name, &registry, &agent_metrics);
    let shutdown = cx.shutdown.clone();
    let models: Box<dyn Component> = Box::new(Models {
        models: config.models.clone(),
        settings: config.verify.clone(),
        shared: monitor::Shared {
            hashers,
            node: node.clone(),
            metrics: cache_metrics,
            loads: loads.clone(),
            watch: FileWatch::default(),
            // The jitter, one read of the node, and time for an API server that answers slowly.
            record_wait: config.start_jitter.get() + RECORD_READ,
        },
    });
    component::start(vec![models], &mut cx).await?;

    tracing::info!(listen = %local, node_name = %config.node_name, models = config.models.len(), max_connections, version = env!("CARGO_PKG_VERSION"), "mlnode-agent serving");
    let server = tokio::spawn(server::serve(
        listener,
        AppState::new(registry, cx.models.clone()),
        max_connections,
        shutdown.clone(),
    ));
    let [on_the_node, with_the_api_server] = collectors(&config, &node, &loads, api);
    let jitter = crate::settings::jitter(config.start_jitter.get());
    let mut running = tokio::spawn(async move {
        component::start(on_the_node, &mut cx).await?;
        tracing::debug!(delay = ?jitter, "spreading the first API requests (start_jitter)");
        tokio::select! {
            _ = tokio::time::sleep(jitter) => component::start(with_the_api_server, &mut cx).await?,
            _ = cx.shutdown.cancelled() => {}
        }
        cx.shutdown.cancelled().await;
        while cx.tasks.join_next().await.is_some() {}
        Ok::<(), DaemonError>(())
    });

    let mut started = false;
    loop {
        tokio::select! {
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = sighup.recv() => tracing::info!("SIGHUP ignored: the configuration is read at start; restart the agent (roll the DaemonSet) to apply a change"),
            result = &mut running, if !started => {
                started = true;
                match result {
                    Ok(Err(e)) => return Err(e),
                    Err(e) => tracing::error!(error = %e, "collector start-up failed"),
                    Ok(Ok(())) => {}
                }
            }
        }
    }
    shutdown.cancel();
    if !started
        && tokio::time::timeout(SHUTDOWN_GRACE, &mut running)
            .await
            .is_err()
    {
        tracing::warn!("a task did not stop in time; exiting anyway");
    }
    match tokio::time::timeout(Duration::from_millis(200), server).await {
        Ok(Ok(Err(e))) => Err(DaemonError::Server(e)),
        _ => Ok(()),
    }
}
