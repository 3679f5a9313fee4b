//! The components `serve` runs, each one [`Component`] (mlnode-core's contract): what it needs
//! from the config, and how it starts. The daemon only lists them.

pub mod gpu;
pub mod kernel_log;
pub mod kubelet;
pub mod models;
pub mod neuron;
pub mod pod_directory;
pub mod pod_gates;
pub mod readiness;
pub mod startup;

use mlnode_core::settings::Toggle;

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

/// A client for the in-cluster or KUBECONFIG API server. kube's own retry of 503s (15 tries, up to
/// minutes apart) is off: the readiness loop has its own backoff and must keep evaluating gates.
async fn kube_client() -> Result<kube::Client, String> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| format!("no Kubernetes API: {e}"))?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| format!("cannot build a Kubernetes client: {e}"))
}
