//! The components `serve` runs, each one [`Component`] (mlnode-core's contract): what it needs
//! from the config, and how it starts. The daemon only lists them.

pub mod gpu;
pub mod kernel_log;
pub mod kubelet;
pub mod models;
pub mod neuron;
pub mod pod_directory;
pub mod pod_gates;
pub mod rdma;
pub mod readiness;
pub mod startup;

use mlnode_core::settings::Toggle;

/// Why the node's labels could not be read.
#[derive(Debug)]
pub enum NodeLabelsError {
    /// No API server is configured (not in a cluster, no kubeconfig): asking again will not help.
    NoApi(String),
    /// The request failed: the API server may answer a later one.
    Request(String),
}

/// The one client of the API server every component shares, built by the first that asks: one
/// connection pool, one count of requests (`mlnode_kube_requests_total`) and one push-back for the
/// whole agent (`mlnode_kube::api`).
#[derive(Clone)]
pub struct ApiClient {
    client: std::sync::Arc<tokio::sync::OnceCell<Result<kube::Client, String>>>,
    layer: mlnode_kube::api::ApiLayer,
}

impl ApiClient {
    /// Registers `mlnode_kube_requests_total` in `registry`: a family without a sample until a
    /// component sends a request.
    pub fn new(
        registry: &prometheus::Registry,
        request_timeout: std::time::Duration,
    ) -> prometheus::Result<ApiClient> {
        Ok(ApiClient {
            client: Default::default(),
            layer: mlnode_kube::api::ApiLayer::new(registry, request_timeout)?,
        })
    }

    /// The client for a feature that talks to the API server. `auto` means in-cluster only: a
    /// laptop's kubeconfig must not make `cargo run -- serve` act on some cluster's node.
    async fn for_feature(&self, enabled: Toggle, key: &str) -> Result<kube::Client, String> {
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        match enabled {
            Toggle::Off => Err(format!("disabled ({key}.enabled: false)")),
            Toggle::Auto if !in_cluster => Err(format!(
                "not running in a cluster (set {key}.enabled: true to use a kubeconfig)"
            )),
            _ => self.any().await,
        }
    }

    /// The client for the in-cluster or KUBECONFIG API server. kube's own retry of 503s (15
    /// tries, up to minutes apart) is off: the loops back off themselves and must keep
    /// evaluating gates, and the shared layer holds every request while the server asks.
    async fn any(&self) -> Result<kube::Client, String> {
        self.client
            .get_or_init(|| async {
                let mut config = kube::Config::infer()
                    .await
                    .map_err(|e| format!("no Kubernetes API: {e}"))?;
                config.default_retry = false;
                let builder = kube::client::ClientBuilder::try_from(config)
                    .map_err(|e| format!("cannot build a Kubernetes client: {e}"))?;
                Ok(builder
                    .with_layer(&tower::buffer::BufferLayer::new(64))
                    .with_layer(&self.layer)
                    .build())
            })
            .await
            .clone()
    }

    /// The labels of `node`, read once (models with a `node_selector` are kept only on the nodes
    /// they select). `NoApi` when there is no API server to ask, which no retry mends;
    /// `Request` with the request's error otherwise.
    pub async fn node_labels(
        &self,
        node: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, NodeLabelsError> {
        let client = self.any().await.map_err(NodeLabelsError::NoApi)?;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let found = nodes
            .get(node)
            .await
            .map_err(|e| NodeLabelsError::Request(format!("cannot read Node {node}: {e}")))?;
        Ok(found.metadata.labels.unwrap_or_default())
    }

    /// Told each time the API server answers again after trouble (`mlnode_kube::api`): a loop
    /// waiting out its back-off retries then.
    pub fn recoveries(&self) -> mlnode_kube::api::Recoveries {
        self.layer.recoveries()
    }
}
