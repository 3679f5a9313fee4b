//! Reading the SOCI snapshotter's metrics socket while pods start, keeping the readings until
//! their startups are measured, and splitting them for one. The tracker says when to read; this
//! reads, over a unix socket the agent's container mounts read-only (no host network, no port).

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;

use super::content_store::ContentStore;
use super::soci::{self, Reading};
use super::split::{self, LazyLoad, Sample, Stretch};
use super::Digest;
use crate::startup::settings::SociSettings;
use mlnode_core::metrics::{AgentMetrics, Subsystem};
use mlnode_core::trouble::Trouble;

/// A reading that takes longer than this is a failed one: the snapshotter is stuck, and the next
/// reading should not queue behind it.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The snapshotter writes about 20 KiB per mounted layer; far more is not its metrics.
const MAX_EXPOSITION_BYTES: usize = 32 << 20;
/// A burst of pod changes (a node's pods starting together) is read once, not once per change.
const MIN_SPACING_SECONDS: f64 = 0.05;

pub struct Sampler {
    socket: PathBuf,
    store: ContentStore,
    max_samples: usize,
    samples: VecDeque<Sample>,
    /// Each layer's digest once, however many readings name it.
    digests: HashSet<Digest>,
    /// Why the last reading failed, so that a lasting failure is logged once.
    trouble: Trouble,
    up: AgentMetrics,
}

impl Sampler {
    /// A sampler where `settings` names the snapshotter's socket; None where it does not. The
    /// image's layers are named from `store`.
    pub fn new(settings: &SociSettings, store: ContentStore, up: AgentMetrics) -> Option<Sampler> {
        let socket = settings.metrics_socket.as_ref()?.path().to_path_buf();
        Some(Sampler {
            socket,
            store,
            max_samples: *settings.max_samples,
            samples: VecDeque::new(),
            digests: HashSet::new(),
            trouble: Trouble::default(),
            up,
        })
    }

    /// Reads the snapshotter once, at `now`, unless it was read just before; a failure is kept as
    /// one, and reported.
    pub async fn sample(&mut self, now: f64) {
        if self
            .samples
            .back()
            .is_some_and(|last| now - last.at < MIN_SPACING_SECONDS)
        {
            return;
        }
        let reading = match read(&self.socket).await {
            Ok(reading) => {
                if self.trouble.recovered() {
                    tracing::info!(socket = %self.socket.display(), "the SOCI snapshotter's metrics are read again");
                }
                Some(self.shared(reading))
            }
            Err(reason) => {
                if let Some(reason) = self.trouble.failed(reason) {
                    tracing::warn!(socket = %self.socket.display(), %reason, "cannot read the SOCI snapshotter's metrics: the fetch figures of the startups in progress are left out");
                }
                None
            }
        };
        self.up.set_up(Subsystem::Soci, reading.is_some());
        self.samples.push_back(Sample { at: now, reading });
        while self.samples.len() > self.max_samples {
            self.samples.pop_front();
        }
    }

    /// Keeps only what a startup that began at `oldest` can need (the last reading before it
    /// brackets its first phase), or, where none is starting, only the last reading.
    pub fn forget_before(&mut self, oldest: Option<f64>) {
        let keep_from = match oldest {
            Some(begin) => self
                .samples
                .iter()
                .rposition(|s| s.at < begin - 1.0)
                .unwrap_or(0),
            None => self.samples.len().saturating_sub(1),
        };
        self.samples.drain(..keep_from);
        if self.samples.len() <= 1 {
            let kept: HashSet<&Digest> = self
                .samples
                .iter()
                .flat_map(|s| s.reading.iter().flat_map(|r| r.keys()))
                .collect();
            self.digests.retain(|d| kept.contains(d));
        }
    }

    /// Where an image (the kubelet's `imageID` for a pod's main container) was fetched, over
    /// the startup's `stretches`; `pod` (namespace, name) names it in the log.
    pub fn lazy_load(
        &mut self,
        pod: (&str, &str),
        stretches: &[(Stretch, (f64, f64))],
        image_id: Option<&str>,
    ) -> LazyLoad {
        let layers: BTreeSet<Digest> = match image_id.map(|id| self.store.layers_of(id)) {
            Some(Ok(layers)) => layers.into_iter().collect(),
            Some(Err(e)) => {
                let (namespace, pod) = pod;
                tracing::warn!(%pod, %namespace, error = %e, "cannot read the image's layers: its fetch figures are left out");
                return LazyLoad::default();
            }
            None => return LazyLoad::default(),
        };
        split::split(self.samples.make_contiguous(), &layers, stretches)
    }

    /// The reading with each digest shared with the readings before it.
    fn shared(&mut self, reading: Reading) -> Reading {
        reading
            .into_iter()
            .map(|(digest, figures)| {
                let digest = match self.digests.get(&digest) {
                    Some(known) => known.clone(),
                    None => {
                        self.digests.insert(digest.clone());
                        digest
                    }
                };
                (digest, figures)
            })
            .collect()
    }
}

/// One reading of the snapshotter's `/metrics`, over its unix socket.
async fn read(socket: &Path) -> Result<Reading, String> {
    let text = tokio::time::timeout(READ_TIMEOUT, get_metrics(socket))
        .await
        .map_err(|_| format!("no answer within {READ_TIMEOUT:?}"))??;
    soci::read(&text).map_err(|e| e.to_string())
}

async fn get_metrics(socket: &Path) -> Result<String, String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("no HTTP on {}: {e}", socket.display()))?;
    // The connection is driven beside the request, and dropped with it.
    let _connection = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(connection));
    let request = http::Request::get("/metrics")
        .header(http::header::HOST, "soci-snapshotter")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("GET /metrics: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("GET /metrics answered {}", response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_EXPOSITION_BYTES)
        .collect()
        .await
        .map_err(|e| format!("GET /metrics: {e} (the limit is {MAX_EXPOSITION_BYTES} bytes)"))?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| "GET /metrics: not UTF-8 text".to_string())
}
