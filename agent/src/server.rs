//! The HTTP server: `/metrics` for Prometheus, `/healthz` for the liveness probe, `/readyz` for the
//! readiness probe (and for anyone asking whether this node's model caches can be served from).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::cache::state::{ModelState, Readiness, VerifiedBy};

#[derive(Clone)]
pub struct AppState {
    pub exposition: Arc<Exposition>,
    pub models: Vec<Arc<ModelState>>,
}

impl AppState {
    pub fn new(registry: prometheus::Registry, models: Vec<Arc<ModelState>>) -> AppState {
        AppState {
            exposition: Arc::new(Exposition::new(registry)),
            models,
        }
    }
}

/// The registry's text exposition, gathered once for all the scrapes waiting on it. Every scrape
/// gets a gathering that began after it arrived (never older data than a scrape of its own would
/// give), but scrapes that arrive together share one: a flood of them (or of pipelined requests)
/// costs one gathering at a time, not one each, so every connection's replies come as fast as its
/// client takes them and a client that takes none meets the write timeout.
pub struct Exposition {
    registry: prometheus::Registry,
    /// When the last gathering began, and what it gave; held while one runs, so scrapes queue.
    last: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
}

impl Exposition {
    pub fn new(registry: prometheus::Registry) -> Exposition {
        Exposition {
            registry,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Gathering reads sysfs (the Neuron collector) and takes locks the NVML threads hold: it
    /// runs on a blocking thread, never on an async worker.
    pub async fn current(&self) -> Bytes {
        let arrived = Instant::now();
        let mut last = self.last.lock().await;
        if let Some((began, text)) = last.as_ref() {
            if *began >= arrived {
                return text.clone();
            }
        }
        let began = Instant::now();
        let registry = self.registry.clone();
        let text = tokio::task::spawn_blocking(move || crate::metrics::encode(&registry))
            .await
            .unwrap_or_else(|e| format!("# gathering metrics failed: {e}\n"));
        let text = Bytes::from(text);
        *last = Some((began, text.clone()));
        text
    }
}

pub fn router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// A client gets this long to send a request's headers, and an idle keep-alive connection this
/// long to send the next request: held-open or half-sent connections are closed, not kept.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A client that takes none of a response's bytes for this long is dropped: pipelined requests
/// whose replies are never read would otherwise hold their connection (and a descriptor) forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once, at most; past the cap a new connection takes the slot of the one
/// served longest, which is closed. The cap in force is derived from the descriptors the process
/// may open ([`connection_cap`]).
const MAX_CONNECTIONS: usize = 2048;
/// Descriptors kept for everything but connections: model files being hashed, the file watch,
/// clients of the kubelet and the API server, NVML's device nodes, sysfs reads.
const RESERVED_DESCRIPTORS: u64 = 256;
/// How long an evicted connection may take to give its slot up (its task is dropped at its next
/// poll: microseconds).
const EVICTION_LIMIT: Duration = Duration::from_secs(1);
/// How long in-flight requests get to finish at shutdown.
const DRAIN: Duration = Duration::from_millis(500);

/// How many connections may be served at once when the process may open `open_files`
/// descriptors: half of what is left past [`RESERVED_DESCRIPTORS`], at most [`MAX_CONNECTIONS`],
/// so that a flood of connections can never take the descriptors a model file or a watch needs.
pub fn connection_cap(open_files: u64) -> usize {
    let cap = open_files.saturating_sub(RESERVED_DESCRIPTORS) / 2;
    usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .clamp(16, MAX_CONNECTIONS)
}

/// Serves until `shutdown`, then stops accepting and lets in-flight requests finish, like a
/// production exporter: bounded header-read, idle and write time, at most `max_connections`, the
/// oldest giving way to a new one.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    max_connections: usize,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(state);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut connections = tokio::task::JoinSet::new();
    // The connections being served, oldest first (finished ones are dropped as they are met).
    let mut live: std::collections::VecDeque<tokio::task::AbortHandle> =
        std::collections::VecDeque::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors or a transient network error: back off briefly
                // instead of spinning on accept.
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            // Every slot taken, by clients that hold their connection as long as the timeouts
            // let them: the one held longest gives its slot up, so that a scrape always gets one
            // at once, rather than after the slow clients' timeouts.
            Err(_) => {
                let Some(oldest) = oldest_live(&mut live) else {
                    drop(stream);
                    continue;
                };
                oldest.abort();
                match tokio::time::timeout(EVICTION_LIMIT, slots.clone().acquire_owned()).await {
                    Ok(Ok(slot)) => slot,
                    _ => {
                        drop(stream);
                        continue;
                    }
                }
            }
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let shutdown = shutdown.clone();
        live.push_back(connections.spawn(async move {
            let _slot = slot;
            let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
            stream.set_write_timeout(Some(WRITE_TIMEOUT));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(Box::pin(stream)), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN, connection).await;
                }
            }
        }));
        // Reap finished connections so neither the set nor the queue grows with every scrape.
        while connections.try_join_next().is_some() {}
        if live.len() > 2 * max_connections {
            live.retain(|c| !c.is_finished());
        }
    }
    let _ = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// The connection served longest that is still being served.
fn oldest_live(
    live: &mut std::collections::VecDeque<tokio::task::AbortHandle>,
) -> Option<tokio::task::AbortHandle> {
    while let Some(oldest) = live.pop_front() {
        if !oldest.is_finished() {
            return Some(oldest);
        }
    }
    None
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.exposition.current().await,
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
                let watched = if model.is_watched() {
                    ""
                } else {
                    "; not continuously verified: its files cannot be watched, only rescanned"
                };
                let by = match model.verified_by() {
                    VerifiedBy::Hash => String::new(),
                    VerifiedBy::UnchangedSince(at) => format!(
                        "; unchanged since {}, when a previous agent of this boot hashed every file",
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + std::time::Duration::from_secs(at)
                        )
                    ),
                };
                format!(
                    "{}: verified (revision {}){by}{watched}",
                    model.name,
                    revision.as_deref().unwrap_or("not given")
                )
            }
            Readiness::Resuming => {
                ready = false;
                format!(
                    "{}: not verified yet: looking whether the cache is as a previous agent of this boot verified it",
                    model.name
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape that arrives while a gathering runs waits for the next one (what it returns must
    /// be at least as new as the scrape); scrapes waiting together share that next one.
    #[tokio::test]
    async fn scrapes_share_a_gathering_that_began_after_they_arrived() {
        let registry = prometheus::Registry::new();
        let counter = prometheus::IntCounter::new("scrapes_seen", "test").unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        let exposition = Arc::new(Exposition::new(registry));
        let first = exposition.current().await;
        assert!(String::from_utf8_lossy(&first).contains("scrapes_seen 0"));
        counter.inc();
        // Held as a running gathering holds it: the scrapes below arrive meanwhile.
        let running = exposition.last.lock().await;
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let exposition = exposition.clone();
                tokio::spawn(async move { exposition.current().await })
            })
            .collect();
        tokio::task::yield_now().await;
        drop(running);
        let mut bodies = Vec::new();
        for scrape in waiting {
            bodies.push(scrape.await.unwrap());
        }
        for body in &bodies {
            assert!(String::from_utf8_lossy(body).contains("scrapes_seen 1"));
        }
        // One gathering for all eight: they share its bytes.
        assert!(bodies.iter().all(|b| b.as_ptr() == bodies[0].as_ptr()));
    }

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_rest_of_the_agent() {
        assert_eq!(connection_cap(1024), 384);
        assert_eq!(connection_cap(1_048_576), MAX_CONNECTIONS);
        // A limit below the reserve still serves a scraper and a probe or two.
        assert_eq!(connection_cap(100), 16);
    }
}
