//! `mlnode-agent serve`: wires the configured collectors, the monitors and the HTTP server
//! together, and takes them down again on SIGTERM or SIGINT.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cache::metrics::CacheMetrics;
use crate::cache::monitor::{self, Monitor};
use crate::cache::priority::Hashers;
use crate::cache::state::{ModelState, NodeFacts, NodeTaint};
use crate::cache::watch::FileWatch;
use crate::config::{Config, ModelConfig};
use crate::gpu::health::GpuHealth;
use crate::gpu::GpuRuntime;
use crate::health::HealthSource;
use crate::kubelet::dra::DraSlices;
use crate::kubelet::pod_resources;
use crate::metrics::{AgentMetrics, Subsystem};
use crate::neuron;
use crate::neuron::health::NeuronHealth;
use crate::readiness::controller::{Controller, ReadinessMetrics, Sources};
use crate::server::{self, AppState};
use crate::settings::Toggle;
use crate::startup::loads::LoadActivity;
use crate::startup::tracker::{StartupMetrics, Tracker};
use mlnode_core::assignments::SharedAssignments;

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
    #[error("cannot install a signal handler: {0}")]
    Signal(std::io::Error),
    #[error("HTTP server failed: {0}")]
    Server(std::io::Error),
}

/// A client for a feature that talks to the API server. `auto` means in-cluster only: a laptop's
/// kubeconfig must not make `cargo run -- serve` act on some cluster's node.
async fn kube_for(enabled: Toggle, key: &str) -> Result<kube::Client, String> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    match enabled {
        Toggle::Off => Err(format!("disabled ({key}.enabled: false)")),
        Toggle::Auto if !in_cluster => Err(format!(
            "not running in a cluster (set {key}.enabled: true to use a kubeconfig)"
        )),
        _ => kube_client().await,
    }
}

/// The one way a collector that did not start says so (its config section is named like it): an
/// error where the operator required it (`enabled: true`), information where it was optional, and
/// `mlnode_collector_up` 0.
fn not_started(up: &AgentMetrics, collector: Subsystem, what: &str, enabled: Toggle, reason: &str) {
    if enabled == Toggle::On {
        let section = collector.as_str();
        tracing::error!(reason = %reason, "no {what} ({section}.enabled: true)");
    } else {
        tracing::info!(reason = %reason, "no {what}");
    }
    up.set_up(collector, false);
}

/// Follows this node's pods and measures their startup phases, where the API server is reachable.
async fn start_startup_tracker(
    config: &Config,
    registry: &prometheus::Registry,
    agent_metrics: &AgentMetrics,
    loads: &LoadActivity,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<(), DaemonError> {
    match kube_for(config.startup.enabled, "startup").await {
        Ok(client) => {
            let metrics = StartupMetrics::register(registry)?;
            let tracker = Tracker::new(
                client,
                config.node_name.clone(),
                config.models.iter().map(ModelConfig::mount).collect(),
                loads.clone(),
                metrics,
                config.startup.clone(),
            );
            tasks.spawn(tracker.run(shutdown.child_token()));
            agent_metrics.set_up(Subsystem::Startup, true);
        }
        Err(reason) => not_started(
            agent_metrics,
            Subsystem::Startup,
            "pod startup phases",
            config.startup.enabled,
            &reason,
        ),
    }
    Ok(())
}

/// Reads this node's instance type and zone labels once, retrying with a doubling wait (1 s to a
/// minute) while the API server cannot answer: they are set when the kubelet registers the node
/// and do not change.
async fn read_node_labels(
    client: kube::Client,
    node_name: String,
    shared: neuron::SharedNodeLabels,
    shutdown: CancellationToken,
) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let mut wait = Duration::from_secs(1);
    loop {
        match nodes.get(&node_name).await {
            Ok(node) => {
                let labels = neuron::NodeLabels::of(&node);
                tracing::info!(instance_type = %labels.instance_type, availability_zone = %labels.availability_zone, "read the node's instance type and zone for the Neuron series");
                *shared.write().unwrap_or_else(|p| p.into_inner()) = labels;
                return;
            }
            Err(e) => {
                tracing::warn!(node = %node_name, error = %e, retry_in = ?wait, "cannot read the node's instance type label")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(60));
    }
}

/// A client for the in-cluster or KUBECONFIG API server. kube's own retry of 503s (15 tries, up to
/// minutes apart) is off: the readiness loop has its own backoff and must keep evaluating gates.
async fn kube_client() -> Result<kube::Client, String> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| format!("no Kubernetes API: {e}"))?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| format!("cannot build a Kubernetes client: {e}"))
}

/// The accelerator collectors whose reports the readiness gate combines.
fn health_sources(
    config: &Config,
    gpu: Option<&GpuRuntime>,
    neuron_running: bool,
) -> Vec<Box<dyn HealthSource>> {
    let mut sources: Vec<Box<dyn HealthSource>> = Vec::new();
    if let Some(gpu) = gpu {
        sources.push(Box::new(GpuHealth {
            state: gpu.state.clone(),
            policy: config.readiness.fatal_xids.clone(),
        }));
    }
    if neuron_running {
        sources.push(Box::new(NeuronHealth::new(
            config.neuron.sysfs_root.clone(),
            config.neuron.pci_devices.clone(),
        )));
    }
    sources
}

/// Starts the readiness controller where it can talk to the API server.
#[allow(clippy::too_many_arguments)]
async fn start_readiness(
    config: &Config,
    registry: &prometheus::Registry,
    agent_metrics: &AgentMetrics,
    models: &[Arc<ModelState>],
    node_taint: &NodeTaint,
    gpu: Option<&GpuRuntime>,
    neuron_running: bool,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<(), DaemonError> {
    let settings = &config.readiness;
    let client = kube_for(settings.enabled, "readiness").await;
    let client = match client {
        Ok(client) => client,
        Err(reason) => {
            // No controller, so no taint of ours: the monitors need not wait to learn it.
            node_taint.set(false);
            let what = "node readiness gates";
            not_started(
                agent_metrics,
                Subsystem::Readiness,
                what,
                settings.enabled,
                &reason,
            );
            return Ok(());
        }
    };
    let mut missing = Vec::new();
    if config.nvml.enabled == Toggle::On && gpu.is_none() {
        missing.push("nvml collector required (nvml.enabled: true) but not running".to_string());
    }
    if config.neuron.enabled == Toggle::On && !neuron_running {
        missing
            .push("neuron collector required (neuron.enabled: true) but not running".to_string());
    }
    let sources = Sources {
        models: models.to_vec(),
        health: health_sources(config, gpu, neuron_running),
        missing_collectors: missing,
        node_taint: node_taint.clone(),
    };
    let metrics = ReadinessMetrics::register(registry)?;
    // Up once a sync with the API server succeeds, down while they fail.
    let controller = Controller::new(
        client,
        config.node_name.clone(),
        settings.clone(),
        sources,
        metrics,
        agent_metrics.clone(),
    );
    tasks.spawn(controller.run(shutdown.child_token()));
    Ok(())
}

/// How long NVML gets to initialise: a wedged driver can block `nvmlInit` indefinitely, and the
/// agent must not wait on it for anything but the GPU collector.
const NVML_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens NVML on a thread of its own (a blocked `nvmlInit` cannot be cancelled, and a stuck
/// blocking task would hold up the async runtime's shutdown), bounded by [`NVML_START_TIMEOUT`].
async fn start_gpu(
    config: &Config,
    registry: &prometheus::Registry,
    assignments: &SharedAssignments,
    up: &AgentMetrics,
) -> Option<GpuRuntime> {
    let (settings, node, registry, shared) = (
        config.nvml.clone(),
        config.node_name.clone(),
        registry.clone(),
        assignments.clone(),
    );
    // DRA devices are looked up under their driver's name (kubelet::dra).
    let resources: Vec<String> = (config.kubelet.gpu_resource_names.iter().cloned())
        .chain(
            config
                .kubelet
                .gpu_dra_drivers
                .iter()
                .map(|d| d.as_str().to_string()),
        )
        .collect();
    let sampler_up = up.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("nvml-start".into())
        .spawn(move || {
            let _ = tx.send(GpuRuntime::start(
                &settings, &node, shared, resources, &registry, sampler_up,
            ));
        });
    let started = match spawned {
        Err(e) => Err(format!("cannot start the NVML start-up thread: {e}")),
        Ok(_) => match tokio::time::timeout(NVML_START_TIMEOUT, rx).await {
            Ok(Ok(started)) => started,
            Ok(Err(_)) => Err("NVML start-up thread ended without an answer".into()),
            Err(_) => Err(format!(
                "NVML did not finish initialising within {}s (a wedged driver?); the GPU collector stays off until the agent restarts",
                NVML_START_TIMEOUT.as_secs()
            )),
        },
    };
    match started {
        Ok(gpu) => Some(gpu),
        Err(reason) => {
            let what = "NVIDIA GPU collector";
            not_started(up, Subsystem::Nvml, what, config.nvml.enabled, &reason);
            None
        }
    }
}

/// Everything that talks to hardware or the cluster, started after the server so that none of it
/// can keep `/metrics`, `/healthz` or SIGTERM waiting; runs until `shutdown`.
async fn run_collectors(
    config: Config,
    registry: prometheus::Registry,
    agent_metrics: AgentMetrics,
    models: Vec<Arc<ModelState>>,
    node: NodeFacts,
    loads: LoadActivity,
    shutdown: CancellationToken,
) -> Result<(), DaemonError> {
    let mut tasks = tokio::task::JoinSet::new();
    let assignments = SharedAssignments::default();
    // Up or down from here on is the sampler's to say: it knows whether NVML still answers.
    let gpu = start_gpu(&config, &registry, &assignments, &agent_metrics).await;

    let node_labels = neuron::SharedNodeLabels::default();
    let monitor_input =
        config
            .neuron
            .monitor_input
            .as_ref()
            .and_then(|path| match neuron::monitor_input::prepare(path) {
                Ok(()) => Some((
                    path.clone(),
                    neuron::monitor_input::SharedRuntimes::default(),
                )),
                Err(reason) => {
                    tracing::error!(%reason, "no neuron-monitor runtime series");
                    None
                }
            });
    let neuron = neuron::start(
        &config.neuron,
        (
            config.kubelet.neuron_device_resource_names.clone(),
            config.kubelet.neuron_core_resource_names.clone(),
        ),
        assignments.clone(),
        node_labels.clone(),
        monitor_input.as_ref().map(|(_, runtimes)| runtimes.clone()),
        &registry,
    );
    match &neuron {
        Ok(_) => {
            agent_metrics.set_up(Subsystem::Neuron, true);
            if let Some((path, runtimes)) = monitor_input {
                tasks.spawn(neuron::monitor_input::read(
                    path,
                    runtimes,
                    shutdown.child_token(),
                ));
            }
            let settings = &config.neuron;
            if settings.instance_type.is_empty() || settings.availability_zone.is_empty() {
                match kube_for(Toggle::Auto, "neuron").await {
                    Ok(client) => {
                        tasks.spawn(read_node_labels(
                            client,
                            config.node_name.clone(),
                            node_labels,
                            shutdown.child_token(),
                        ));
                    }
                    Err(reason) => tracing::info!(
                        %reason,
                        "Neuron series carry no instance_type or availability_zone label but the configured ones (neuron.instance_type, neuron.availability_zone)"
                    ),
                }
            }
        }
        Err(reason) => not_started(
            &agent_metrics,
            Subsystem::Neuron,
            "Neuron collector",
            config.neuron.enabled,
            reason,
        ),
    }

    // Pod labels for devices: only worth asking the kubelet when there are devices to label.
    let kubelet = &config.kubelet;
    let mut resource_names = Vec::new();
    if gpu.is_some() {
        resource_names.extend(kubelet.gpu_resource_names.iter().cloned());
    }
    if neuron.is_ok() {
        resource_names.extend(
            kubelet
                .neuron_device_resource_names
                .iter()
                .chain(&kubelet.neuron_core_resource_names)
                .cloned(),
        );
    }
    start_startup_tracker(
        &config,
        &registry,
        &agent_metrics,
        &loads,
        &mut tasks,
        &shutdown,
    )
    .await?;
    start_readiness(
        &config,
        &registry,
        &agent_metrics,
        &models,
        &node.taint,
        gpu.as_ref(),
        neuron.is_ok(),
        &mut tasks,
        &shutdown,
    )
    .await?;
    // GPUs allocated through DRA are named by the API server's ResourceSlices. Any configured API
    // (in-cluster or KUBECONFIG) will do: nothing is asked of it until the kubelet reports one.
    let dra = if gpu.is_some() && !kubelet.gpu_dra_drivers.is_empty() {
        match kube_client().await {
            Ok(client) => Some(DraSlices::spawn(
                client,
                &config.node_name,
                kubelet
                    .gpu_dra_drivers
                    .iter()
                    .map(|d| d.as_str().to_string())
                    .collect(),
                &mut tasks,
                shutdown.child_token(),
            )),
            Err(reason) => {
                tracing::debug!(%reason, "GPUs allocated through DRA will carry no pod labels");
                None
            }
        }
    } else {
        None
    };
    if !resource_names.is_empty() {
        tasks.spawn(pod_resources::poll(
            kubelet.pod_resources_socket.clone(),
            resource_names,
            dra,
            kubelet.pod_resources_interval.get(),
            pod_resources::Published {
                assignments: assignments.clone(),
                workload: node.workload.clone(),
            },
            pod_resources::register_errors(&registry)?,
            shutdown.child_token(),
        ));
    }
    shutdown.cancelled().await;
    if let Some(gpu) = &gpu {
        gpu.stop();
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
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

pub async fn run(config: Config) -> Result<(), DaemonError> {
    let max_connections = server::connection_cap(raise_open_file_limit());
    let registry = crate::metrics::registry(&config.node_name);
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

    let shutdown = CancellationToken::new();
    let signal = |kind| tokio::signal::unix::signal(kind).map_err(DaemonError::Signal);
    let mut sigterm = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sighup = signal(tokio::signal::unix::SignalKind::hangup())?;

    let loads = LoadActivity::default();
    let mut models = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    let monitors = monitor::Shared {
        hashers,
        node: node.clone(),
        metrics: cache_metrics.clone(),
        loads: loads.clone(),
        watch: FileWatch::default(),
    };
    for model in &config.models {
        let state = Arc::new(ModelState::new(&model.name));
        models.push(state.clone());
        let monitor = Monitor::new(
            model.clone(),
            config.verify.clone(),
            monitors.clone(),
            state,
        );
        tasks.spawn(monitor.run(shutdown.child_token()));
    }
    agent_metrics.set_up(Subsystem::ModelCache, true);
    // Until their start-up says otherwise, the other collectors are not up.
    for collector in Subsystem::ALL
        .into_iter()
        .filter(|c| *c != Subsystem::ModelCache)
    {
        agent_metrics.set_up(collector, false);
    }

    tracing::info!(listen = %local, node_name = %config.node_name, models = config.models.len(), max_connections, version = env!("CARGO_PKG_VERSION"), "mlnode-agent serving");
    let server = tokio::spawn(server::serve(
        listener,
        AppState {
            registry: registry.clone(),
            models: models.clone(),
        },
        max_connections,
        shutdown.clone(),
    ));
    let mut collectors = tokio::spawn(run_collectors(
        config,
        registry,
        agent_metrics,
        models,
        node,
        loads,
        shutdown.clone(),
    ));

    let mut collectors_done = false;
    loop {
        tokio::select! {
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = sighup.recv() => tracing::info!("SIGHUP ignored: the configuration is read at start; restart the agent (roll the DaemonSet) to apply a change"),
            result = &mut collectors, if !collectors_done => {
                collectors_done = true;
                match result {
                    Ok(Err(e)) => return Err(e),
                    Err(e) => tracing::error!(error = %e, "collector start-up failed"),
                    Ok(Ok(())) => {}
                }
            }
        }
    }
    shutdown.cancel();
    let stopped = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
        if !collectors_done {
            let _ = (&mut collectors).await;
        }
    })
    .await;
    if stopped.is_err() {
        tracing::warn!("a task did not stop in time; exiting anyway");
    }
    match tokio::time::timeout(Duration::from_millis(200), server).await {
        Ok(Ok(Err(e))) => Err(DaemonError::Server(e)),
        _ => Ok(()),
    }
}
