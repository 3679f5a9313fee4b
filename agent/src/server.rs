//! The HTTP server: `/metrics` for Prometheus, `/healthz` for the liveness probe, `/readyz` for the
//! readiness probe (and for anyone asking whether this node's model caches can be served from).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::cache::monitor::{ModelState, Readiness};

#[derive(Clone)]
pub struct AppState {
    pub registry: prometheus::Registry,
    pub models: Vec<Arc<ModelState>>,
}

pub fn router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves until `shutdown`, then stops accepting and lets in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Gathering reads sysfs (the Neuron collector) and takes locks the NVML threads hold: it runs on
/// a blocking thread, never on an async worker.
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let registry = state.registry.clone();
    let body = tokio::task::spawn_blocking(move || crate::metrics::encode(&registry))
        .await
        .unwrap_or_else(|e| format!("# gathering metrics failed: {e}\n"));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}

/// 200 while every model's monitor runs and no verification is stuck; the body says which is not.
async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let problems: Vec<String> = state
        .models
        .iter()
        .filter_map(|m| {
            m.liveness()
                .err()
                .map(|reason| format!("{}: {reason}", m.name))
        })
        .collect();
    if problems.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
    }
}

/// 200 only when every configured model cache is verified; one line per model either way.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let mut ready = true;
    let mut body = String::new();
    for model in &state.models {
        let line = match model.readiness() {
            Readiness::Verified { revision } => {
                format!(
                    "{}: verified (revision {})",
                    model.name,
                    revision.as_deref().unwrap_or("not given")
                )
            }
            Readiness::Starting => {
                ready = false;
                format!(
                    "{}: not verified: first verification in progress",
                    model.name
                )
            }
            Readiness::Failed { reason } => {
                ready = false;
                format!("{}: not verified: {reason}", model.name)
            }
        };
        body.push_str(&line);
        body.push('\n');
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}
