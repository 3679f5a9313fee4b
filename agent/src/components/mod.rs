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

/// The one client of the API server every component shares, built by the first that asks: one
/// connection pool, one count of requests (`mlnode_kube_requests_total`) and one push-back for the
/// whole agent (`mlnode_kube::api`).
#[derive(Clone)]
pub struct ApiClient {
    client: std::sync::Arc<tokio::sync::OnceCell<Result<Built, String>>>,
    request_timeout: std::time::Duration,
}

/// The client, and what tells its users that the API server answers again after trouble.
struct Built {
    client: kube::Client,
    recoveries: mlnode_kube::api::Recoveries,
}

impl ApiClient {
    pub fn new(request_timeout: std::time::Duration) -> ApiClient {
        ApiClient {
            client: Default::default(),
            request_timeout,
        }
    }

    /// The client for a feature that talks to the API server. `auto` means in-cluster only: a
    /// laptop's kubeconfig must not make `cargo run -- serve` act on some cluster's node.
    async fn for_feature(
        &self,
        enabled: Toggle,
        key: &str,
        registry: &prometheus::Registry,
    ) -> Result<kube::Client, String> {
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        match enabled {
            Toggle::Off => Err(format!("disabled ({key}.enabled: false)")),
            Toggle::Auto if !in_cluster => Err(format!(
                "not running in a cluster (set {key}.enabled: true to use a kubeconfig)"
            )),
            _ => self.any(registry).await,
        }
    }

    /// The client for the in-cluster or KUBECONFIG API server. kube's own retry of 503s (15
    /// tries, up to minutes apart) is off: the loops back off themselves and must keep
    /// evaluating gates, and the shared layer holds every request while the server asks.
    async fn any(&self, registry: &prometheus::Registry) -> Result<kube::Client, String> {
        self.client
            .get_or_init(|| async {
                let mut config = kube::Config::infer()
                    .await
                    .map_err(|e| format!("no Kubernetes API: {e}"))?;
                config.default_retry = false;
                let layer = mlnode_kube::api::ApiLayer::new(registry, self.request_timeout)
                    .map_err(|e| format!("cannot register the API request metrics: {e}"))?;
                let builder = kube::client::ClientBuilder::try_from(config)
                    .map_err(|e| format!("cannot build a Kubernetes client: {e}"))?;
                Ok(Built {
                    client: builder
                        .with_layer(&tower::buffer::BufferLayer::new(64))
                        .with_layer(&layer)
                        .build(),
                    recoveries: layer.recoveries(),
                })
            })
            .await
            .as_ref()
            .map(|built| built.client.clone())
            .map_err(Clone::clone)
    }

    /// Told each time the API server answers again after trouble (`mlnode_kube::api`): a loop
    /// waiting out its back-off retries then. Before a client is built, never told.
    pub fn recoveries(&self) -> mlnode_kube::api::Recoveries {
        match self.client.get() {
            Some(Ok(built)) => built.recoveries.clone(),
            _ => tokio::sync::watch::channel(0).1,
        }
    }
}
