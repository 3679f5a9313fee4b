//! Continuous verification of one model cache: a full verification at start, incremental
//! re-verification of the files that file events name, a full rescan on a schedule (bit rot leaves
//! no event) and whenever events were lost. One tokio task per model, so one unreadable cache never
//! holds up another; hashing runs on the shared rayon pools (one per priority, [`Hashers`]), off the
//! async runtime. What to do when is decided by [`plan::Planner`]; this task performs it.

pub mod plan;

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::events::{before_first_verification, Router, Work};
use super::fingerprint::Fingerprint;
use super::hasher::Control;
use super::layout;
use super::manifest::{self, Manifest};
use super::metrics::{CacheMetrics, VerifyKind};
use super::priority::{self, Hashers, Priority, Situation};
use super::report::{FileStatus, Report};
use super::settings::{ModelConfig, PrioritySetting, VerifySettings};
use super::state::{CacheRecord, ModelState, NodeFacts, Readiness, VerifiedBy};
use super::verify::{verify, VerifyOptions};
use super::watch::{FileWatch, Subscription, WatchError, WatchedPath};
use mlnode_core::loads::{is_weight_file, unix_now, LoadActivity};
use plan::{Action, Input, Outcome, Planner, Progress, Timing, Todo};

/// How often the monitor wakes when nothing happens: its heartbeat, stall check, ROOT check and
/// manifest retry.
const TICK: Duration = Duration::from_secs(5);
/// Watch set-up that failed (the root does not exist yet, the watch limit) is retried this often.
const WATCH_RETRY: Duration = Duration::from_secs(30);
/// A model that cannot be watched is rescanned this often (at most `full_rescan_interval`).
pub const UNWATCHED_RESCAN: Duration = Duration::from_secs(15 * 60);
/// How long a model's first verification waits to learn whether the node holds the startup taint
/// (the readiness controller's first read of the node, normally well under a second): started
/// before, it could not know that it may run at full speed.
const TAINT_WAIT: Duration = Duration::from_secs(10);
/// What a record that decides nothing else is verified against: a new number when what a passed
/// verification means changes, so that no record of the old meaning is trusted.
const RECORD_FORMAT: u8 = 1;
/// At shutdown, how long to wait for hashing to notice it was cancelled.
const CANCEL_GRACE: Duration = Duration::from_millis(500);

/// A verification under way.
struct Running {
    handle: tokio::task::JoinHandle<Result<Report, String>>,
    control: Arc<Control>,
    kind: VerifyKind,
    priority: Priority,
    /// What a full run is verified against ([`Monitor::against`]), and when it started (Unix s).
    against: [u8; 16],
    started_unix: u64,
    /// A previous agent's record this run trusts: when it hashed every file.
    trusted: Option<u64>,
    /// The manifest files an incremental run looks at again.
    looked: HashSet<String>,
    progress: Progress,
}

/// What every model's monitor shares.
#[derive(Clone)]
pub struct Shared {
    pub hashers: Arc<Hashers>,
    pub node: NodeFacts,
    pub metrics: Arc<CacheMetrics>,
    /// Where weight-file opens are recorded for the startup phases (model load).
    pub loads: LoadActivity,
    /// The agent's one file watch.
    pub watch: FileWatch,
    /// How long a restarted agent waits for the node's record of what a previous agent verified
    /// (the API start jitter and one read of the node) before it hashes anyway.
    pub record_wait: Duration,
}

pub struct Monitor {
    model: ModelConfig,
    settings: VerifySettings,
    shared: Shared,
    state: Arc<ModelState>,
}

/// The model's manifest as last loaded, and the digest of its bytes.
struct Loaded {
    manifest: Arc<Manifest>,
    /// SHA-256 of the manifest file: a touch changes nothing, new bytes reload it (the bytes
    /// themselves are ~110 per entry, too many to keep for a million-file cache).
    digest: [u8; 32],
}

impl Monitor {
    pub fn new(
        model: ModelConfig,
        settings: VerifySettings,
        shared: Shared,
        state: Arc<ModelState>,
    ) -> Monitor {
        Monitor {
            model,
            settings,
            shared,
            state,
        }
    }

    /// How this model is verified, whichever files a run looks at.
    fn verify_options(&self) -> VerifyOptions {
        VerifyOptions {
            revision: self.model.revision.clone(),
            fail_on_extra: self.model.fail_on_extra,
            ignore_unsigned_files: self.model.ignore_unsigned_files,
            manifest_path: Some(self.model.manifest.clone()),
            keep_ok_lines: false,
            ..VerifyOptions::default()
        }
    }

    /// What a verification of this model is verified against: the manifest's bytes and the
    /// settings that decide the verdict (the signer is checked on every load of the manifest).
    /// A previous agent's record for anything else is not trusted.
    fn against(&self, manifest_digest: &[u8; 32]) -> [u8; 16] {
        use sha2::{Digest, Sha256};
        let model = &self.model;
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field(&[RECORD_FORMAT]);
        field(manifest_digest);
        field(model.root.as_os_str().as_encoded_bytes());
        field(model.revision.as_deref().unwrap_or_default().as_bytes());
        field(&[
            u8::from(model.fail_on_extra),
            u8::from(model.ignore_unsigned_files),
        ]);
        let mut ignored = model.ignore_paths.clone();
        ignored.sort();
        for path in &ignored {
            field(path.as_bytes());
        }
        let digest = hasher.finalize();
        digest[..16].try_into().expect("16 of 32 bytes")
    }

    /// At a restart: the fingerprint of what a previous agent of this boot verified against the
    /// same manifest and settings, with when it hashed every file; None to hash as at any start;
    /// Err to defer that hash by the restart jitter (the record is of another manifest or other
    /// settings: a rollout changed them, and every node of the fleet is about to hash at once).
    async fn resumable(&self, against: [u8; 16]) -> Result<Option<(Fingerprint, u64)>, Outcome> {
        let name = &self.model.name;
        let metrics = &self.shared.metrics;
        let Some(record) = self
            .shared
            .node
            .records
            .of(name, self.shared.record_wait)
            .await
        else {
            metrics.restart_record(name, "none");
            return Ok(None);
        };
        if record.against != against {
            metrics.restart_record(name, "unusable");
            let delay = mlnode_core::settings::jitter(*self.settings.restart_jitter);
            tracing::info!(model_name = %name, delay = ?delay, "the previous agent verified another manifest or other settings: hashing every file");
            if delay.is_zero() || self.shared.node.taint.is_present() {
                return Ok(None);
            }
            self.state.set_not_verified(Readiness::Starting);
            return Err(Outcome::Deferred(delay));
        }
        match Fingerprint::from_buckets(record.buckets) {
            Ok(fingerprint) => Ok(Some((fingerprint, record.hashed_at))),
            Err(e) => {
                metrics.restart_record(name, "malformed");
                tracing::warn!(model_name = %name, error = %e, "the previous agent's record of this model is not of the form this agent writes; hashing every file");
                Ok(None)
            }
        }
    }

    fn timing(&self) -> Timing {
        Timing {
            debounce: *self.settings.debounce,
            full_rescan_interval: *self.settings.full_rescan_interval,
            unwatched_rescan_interval: UNWATCHED_RESCAN,
            watch_retry: WATCH_RETRY,
            manifest_retry: TICK,
        }
    }

    /// Runs until `shutdown`; a verification under way is then cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let name = self.model.name.clone();
        let (tx, mut events) = mpsc::unbounded_channel();
        let mut watch: Option<(Subscription, RootIdentity)> = None;
        // The last watch failed because ROOT was not there: it is retried as soon as it is.
        let mut root_missing = false;
        let mut loaded: Option<Loaded> = None;
        let mut router: Option<Router> = None;
        let mut report: Option<Report> = None;
        let mut running: Option<Running> = None;
        let mut last_error = String::new();
        // Until the first full verification has looked at the previous agent's record.
        let mut resume = self.settings.trust_unchanged_after_restart;
        let mut planner = Planner::new(self.timing(), Instant::now());
        let mut tick = tokio::time::interval(TICK);
        let mut inputs = VecDeque::from([Input::Wake]);

        loop {
            self.state.beat();
            while let Some(input) = inputs.pop_front() {
                for action in planner.on(input, Instant::now()) {
                    match action {
                        Action::Watch => {
                            // The old subscription goes first: a replaced ROOT's path is the same.
                            drop(watch.take());
                            watch = match self.watch(tx.clone()) {
                                Ok(watching) => Some(watching),
                                Err(WatchError { reason, limit }) => {
                                    if limit {
                                        self.shared.metrics.watch_overflow(&name);
                                    }
                                    tracing::warn!(model_name = %name, error = %reason, rescan_interval = ?UNWATCHED_RESCAN.min(*self.settings.full_rescan_interval),
                                        "cannot watch the model cache: it is not continuously verified, only rescanned, until a retry succeeds");
                                    None
                                }
                            };
                            root_missing = watch.is_none() && !self.model.root.exists();
                            self.shared.metrics.watched(&name, watch.is_some());
                            self.state.set_watched(watch.is_some());
                            inputs.push_back(Input::Watched(watch.is_some()));
                        }
                        Action::RecordLoad(file) => {
                            self.shared.loads.record(&name, unix_now(), file);
                            self.shared.metrics.weight_opened(&name);
                        }
                        Action::RecordWrite { file, completed } => {
                            self.shared
                                .loads
                                .record_write(&name, file, unix_now(), completed)
                        }
                        Action::Verify(todo) => {
                            // Loading a manifest of a million entries takes seconds; SIGTERM must
                            // not wait for it (the parse finishes on its blocking thread, unobserved).
                            let started = tokio::select! {
                                started = self.start(todo, &mut loaded, &mut router, report.is_none(), &mut resume, &mut last_error) => started,
                                _ = shutdown.cancelled() => return,
                            };
                            match started {
                                Ok(job) => running = Some(job),
                                Err(outcome) => inputs.push_back(Input::Finished(outcome)),
                            }
                        }
                    }
                }
            }

            let wake = tokio::time::Instant::from_std(planner.next_wake());
            tokio::select! {
                _ = shutdown.cancelled() => {
                    if let Some(job) = running.take() {
                        job.control.cancel();
                        match tokio::time::timeout(CANCEL_GRACE, job.handle).await {
                            Ok(_) => tracing::info!(model_name = %name, "verification cancelled for shutdown"),
                            Err(_) => tracing::warn!(model_name = %name, "hashing did not stop within {CANCEL_GRACE:?}; exiting anyway"),
                        }
                    }
                    return;
                }
                Some(event) = events.recv() => {
                    let root = watch.as_ref().map(|(_, id)| id.path.as_path());
                    inputs.extend(self.on_event(event, root, router.as_ref(), report.as_ref()));
                }
                _ = tick.tick() => {
                    if let Some(job) = running.as_mut() {
                        self.check_progress(job);
                    }
                    let replaced = watch.as_ref().is_some_and(|(_, id)| !id.still_matches(&self.model.root));
                    if replaced || (root_missing && self.model.root.exists()) {
                        root_missing = false;
                        inputs.push_back(Input::RootReplaced);
                    }
                    inputs.push_back(Input::Wake);
                }
                result = async { (&mut running.as_mut().expect("guarded by if").handle).await }, if running.is_some() => {
                    let job = running.take().expect("guarded by if");
                    self.state.stalled.store(false, Ordering::Relaxed);
                    let outcome = result.unwrap_or_else(|e| Err(format!("verification task failed: {e}")));
                    let outcome = self.finish(&job, outcome, &mut report, loaded.as_ref(), &mut router);
                    inputs.push_back(Input::Finished(outcome));
                    // A trusted restart's next full hash is due an interval after the recorded one.
                    if let (Some(_), Some(record)) = (job.trusted, self.state.record()) {
                        let ago = (unix_now() as u64).saturating_sub(record.hashed_at);
                        inputs.push_back(Input::LastFullHash(Duration::from_secs(ago)));
                    }
                }
                _ = tokio::time::sleep_until(wake) => inputs.push_back(Input::Wake),
            }
        }
    }

    /// What one file event tells the planner: a weight file opened, work routed to manifest files,
    /// ROOT itself renamed or removed (the watch on it may be gone: notify drops the watches of a
    /// directory renamed out of a watched parent, and a rename back does not restore them).
    fn on_event(
        &self,
        event: notify::Result<notify::Event>,
        root: Option<&Path>,
        router: Option<&Router>,
        report: Option<&Report>,
    ) -> Vec<Input> {
        let name = &self.model.name;
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                if matches!(e.kind, notify::ErrorKind::MaxFilesWatch) {
                    self.shared.metrics.watch_overflow(name);
                }
                tracing::warn!(model_name = %name, error = %e, "file watch error; verifying everything");
                return vec![Input::Work(Work::Full)];
            }
        };
        let mut inputs = Vec::new();
        let root_moved = matches!(
            event.kind,
            notify::EventKind::Modify(notify::event::ModifyKind::Name(_))
                | notify::EventKind::Remove(_)
        ) && root.is_some_and(|root| event.paths.iter().any(|p| p == root));
        if root_moved {
            tracing::info!(model_name = %name, "the model's root was renamed or removed; watching it again");
            inputs.push(Input::RootReplaced);
        }
        inputs.extend(weight_file_inputs(&event));
        if event.need_rescan() {
            self.shared.metrics.watch_overflow(name);
            tracing::warn!(model_name = %name, "file-watch queue overflowed; verifying everything");
        }
        match router {
            Some(router) => inputs.extend(
                router
                    .route(&event)
                    .into_iter()
                    .filter_map(|w| worth_a_look(w, report))
                    .map(Input::Work),
            ),
            None => inputs.extend(
                before_first_verification(&event, root, &manifest_dir(&self.model.manifest))
                    .map(Input::Work),
            ),
        }
        inputs
    }

    fn check_progress(&self, job: &mut Running) {
        let bytes = job.control.hashed_bytes.load(Ordering::Relaxed);
        let stalled = job
            .progress
            .stalled(bytes, Instant::now(), *self.settings.stall_timeout);
        if stalled && !self.state.stalled.swap(true, Ordering::Relaxed) {
            tracing::error!(model_name = %self.model.name, "verification made no progress for {:?}; is the storage hung?", *self.settings.stall_timeout);
        }
    }

    /// Starts the verification `work` calls for; without one (the manifest unusable, nothing to
    /// look at after all), says how the attempt ended.
    async fn start(
        &self,
        work: Todo,
        loaded: &mut Option<Loaded>,
        router: &mut Option<Router>,
        first: bool,
        resume: &mut bool,
        last_error: &mut String,
    ) -> Result<Running, Outcome> {
        let mut full = work.full;
        if work.reload || loaded.is_none() {
            match self.load_manifest().await {
                Ok((manifest, digest)) => {
                    let changed = loaded.as_ref().is_none_or(|l| l.digest != digest);
                    if changed {
                        if loaded.is_some() {
                            tracing::info!(model_name = %self.model.name, manifest = %self.model.manifest.display(), "manifest changed; verifying everything");
                        }
                        self.shared.metrics.starting(
                            &self.model.name,
                            manifest.revision.as_deref(),
                            manifest.files.len(),
                        );
                        *loaded = Some(Loaded {
                            manifest: Arc::new(manifest),
                            digest,
                        });
                        full = true;
                    }
                    last_error.clear();
                }
                Err(reason) => {
                    if *last_error != reason {
                        tracing::error!(model_name = %self.model.name, error = %reason, "cannot use the manifest");
                        *last_error = reason.clone();
                    }
                    *loaded = None;
                    *router = None;
                    self.state.set_not_verified(Readiness::Failed { reason });
                    self.shared.metrics.unverifiable(&self.model.name);
                    return Err(Outcome::NoManifest);
                }
            }
        }
        let Some(manifest) = loaded.as_ref().map(|l| l.manifest.clone()) else {
            return Err(Outcome::NoManifest);
        };
        let only = (!full).then(|| work.files.clone());
        if !full && work.files.is_empty() && !work.listing {
            // A reload that found the same manifest: the model's state stands.
            return Err(Outcome::Report);
        }
        let kind = if full {
            VerifyKind::Full
        } else {
            VerifyKind::Incremental
        };
        let digest = loaded.as_ref().map_or([0; 32], |l| l.digest);
        let against = self.against(&digest);
        // The node's first read tells both the record and the taint: one wait serves both.
        let node_read_from = Instant::now();
        let trusted = if full && std::mem::take(resume) {
            self.resumable(against).await?
        } else {
            None
        };
        if trusted.is_none() && self.state.readiness() == Readiness::Resuming {
            self.state.set_not_verified(Readiness::Starting);
        }
        let options = VerifyOptions {
            only,
            trusted: trusted.as_ref().map(|(fingerprint, _)| fingerprint.clone()),
            ..self.verify_options()
        };
        if first && self.settings.priority == PrioritySetting::Auto {
            let left = TAINT_WAIT.saturating_sub(node_read_from.elapsed());
            self.shared.node.taint.known(left).await;
        }
        let priority = priority::decide(
            self.settings.priority,
            Situation {
                node_tainted: self.shared.node.taint.is_present(),
                workload: self.shared.node.workload.get(),
                served: self
                    .shared
                    .loads
                    .last_open(&self.model.name, 0.0, f64::INFINITY)
                    .is_some(),
            },
        );
        self.shared.metrics.priority(&self.model.name, priority);
        let control = Arc::new(self.shared.hashers.control());
        let (pool, root, job_control) = (
            self.shared.hashers.pool(priority),
            self.model.root.clone(),
            control.clone(),
        );
        let handle = tokio::task::spawn_blocking(move || {
            pool.install(|| verify(&root, &manifest, &options, &job_control))
                .map_err(|e| e.to_string())
        });
        Ok(Running {
            handle,
            control,
            kind,
            priority,
            against,
            started_unix: unix_now() as u64,
            trusted: trusted.map(|(_, hashed_at)| hashed_at),
            looked: work.files,
            progress: Progress::new(Instant::now()),
        })
    }

    async fn load_manifest(&self) -> Result<(Manifest, [u8; 32]), String> {
        let path = self.model.manifest.clone();
        let trust = self.model.signer.clone();
        let ignored = self.model.ignore_paths.clone();
        tokio::task::spawn_blocking(move || {
            let (mut manifest, digest) = manifest::load_with_digest(&path, &trust)
                .map_err(|e| e.explain(|field| field.key().to_string()))?;
            manifest.ignore_paths.extend(ignored);
            Ok((manifest, digest))
        })
        .await
        .unwrap_or_else(|e| Err(format!("manifest task failed: {e}")))
    }

    /// Publishes a verification's result; says whether it gave the model's state.
    fn finish(
        &self,
        job: &Running,
        outcome: Result<Report, String>,
        report: &mut Option<Report>,
        loaded: Option<&Loaded>,
        router: &mut Option<Router>,
    ) -> Outcome {
        let name = &self.model.name;
        let kind = job.kind;
        self.shared.metrics.throttled(name, job.control.throttled());
        let partial = match outcome {
            Ok(partial) => partial,
            Err(reason) => {
                tracing::error!(model_name = %name, error = %reason, "cannot verify the model cache");
                self.state.set_not_verified(Readiness::Failed { reason });
                self.shared.metrics.unverifiable(name);
                *report = None;
                return Outcome::Failed;
            }
        };
        let (hashed, seconds) = (partial.bytes_hashed, partial.seconds);
        let (trusted_files, fingerprint) = (partial.trusted_files, partial.fingerprint.clone());
        let extras_fail = loaded.is_some_and(|l| self.verify_options().extras_fail(&l.manifest));
        let current = match (kind, report.take()) {
            (VerifyKind::Incremental, Some(mut previous)) => {
                previous.merge(partial, &job.looked, extras_fail);
                previous
            }
            _ => partial,
        };
        let Some(loaded) = loaded else {
            return Outcome::Failed;
        };
        if kind == VerifyKind::Full {
            *router = Some(self.router(loaded.manifest.clone(), &current));
        }
        self.shared
            .metrics
            .observe(name, &current, kind, hashed, seconds);
        log_result(name, &current, job, hashed, seconds, trusted_files);
        if let (VerifyKind::Full, Some(_)) = (kind, job.trusted) {
            let all = trusted_files == loaded.manifest.files.len();
            self.shared
                .metrics
                .restart_record(name, if all { "trusted" } else { "partial" });
        }
        if current.is_verified() {
            let (by, record) = match kind {
                VerifyKind::Full => {
                    let hashed_at = match job.trusted {
                        Some(at) if trusted_files > 0 => at,
                        _ => job.started_unix,
                    };
                    let by = if trusted_files > 0 {
                        VerifiedBy::UnchangedSince(hashed_at)
                    } else {
                        VerifiedBy::Hash
                    };
                    let record = fingerprint.map(|f| CacheRecord {
                        against: job.against,
                        hashed_at,
                        buckets: f.buckets().to_vec(),
                    });
                    (by, record)
                }
                VerifyKind::Incremental => (self.state.verified_by(), self.state.record()),
            };
            let last_full_hash = record.as_ref().map(|r| r.hashed_at);
            self.shared.metrics.verified_by(name, by, last_full_hash);
            self.state
                .set_verified(current.revision.clone(), by, record);
        } else {
            self.state.set_not_verified(Readiness::Failed {
                reason: failure_summary(&current),
            });
        }
        *report = Some(current);
        Outcome::Report
    }

    fn router(&self, manifest: Arc<Manifest>, report: &Report) -> Router {
        let root =
            std::fs::canonicalize(&self.model.root).unwrap_or_else(|_| self.model.root.clone());
        let hf_commit = layout::is_hf_repo(&root)
            .then(|| report.revision.clone())
            .flatten();
        Router::new(
            &root,
            &manifest_dir(&self.model.manifest),
            hf_commit,
            manifest,
        )
    }

    fn watch(
        &self,
        tx: mpsc::UnboundedSender<notify::Result<notify::Event>>,
    ) -> Result<(Subscription, RootIdentity), WatchError> {
        let root = std::fs::canonicalize(&self.model.root).map_err(|e| WatchError {
            reason: format!("{}: {e}", self.model.root.display()),
            limit: false,
        })?;
        let identity = RootIdentity::of(&root).ok_or_else(|| WatchError {
            reason: format!("{} cannot be examined", root.display()),
            limit: false,
        })?;
        let recursive = |path: PathBuf| WatchedPath {
            path,
            recursive: true,
        };
        let mut paths = vec![recursive(root.clone())];
        // A hub cache's Xet files may live in huggingface_hub's cache-wide store, outside ROOT. A
        // store made after this watch is only seen by the periodic rescans until the next watch.
        if let Some(store) = layout::is_hf_repo(&root)
            .then(|| layout::shared_store_of(&root))
            .flatten()
            .and_then(|store| std::fs::canonicalize(store).ok())
        {
            paths.push(recursive(store));
        }
        paths.push(WatchedPath {
            path: manifest_dir(&self.model.manifest),
            recursive: false,
        });
        let subscription = self.shared.watch.subscribe(paths, tx)?;
        Ok((subscription, identity))
    }
}

/// What an event says of the model's weight files: each open, the agent's own (announced by its
/// verifier) or another process's, and each write by another process (a modification, or a close
/// after writing, with the file's size then). A file is named by device and inode, as the verifier
/// announces it: the event's path is the file the open reached (a Hugging Face blob, whichever
/// snapshot link was opened). A file gone before it could be looked at is no one's to tell, and is
/// left out.
fn weight_file_inputs(event: &notify::Event) -> Vec<Input> {
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    use std::os::unix::fs::MetadataExt;
    enum Seen {
        Opened,
        Written,
        Completed,
    }
    let seen = match event.kind {
        notify::EventKind::Access(AccessKind::Open(_)) => Seen::Opened,
        notify::EventKind::Modify(ModifyKind::Data(_)) => Seen::Written,
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => Seen::Completed,
        _ => return Vec::new(),
    };
    event
        .paths
        .iter()
        .filter(|p| is_weight_file(p))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| {
            let file = (m.dev(), m.ino());
            match seen {
                Seen::Opened => Input::WeightFileOpened {
                    own: mlnode_verify::own_opens::claim(file),
                    file,
                },
                Seen::Written => Input::WeightFileWritten {
                    file,
                    completed: None,
                },
                Seen::Completed => Input::WeightFileWritten {
                    file,
                    completed: Some(m.len()),
                },
            }
        })
        .collect()
}

/// An access change matters only for the files the last verification could not open or read (a
/// weight file fixed with `chmod` is re-verified now, not at the next full rescan); the rest of
/// the work passes as it is.
fn worth_a_look(work: Work, report: Option<&Report>) -> Option<Work> {
    let Work::Access(files) = work else {
        return Some(work);
    };
    let report = report?;
    let blocked: HashSet<String> = report
        .files
        .iter()
        .filter(|f| {
            files.contains(&f.path)
                && matches!(f.status, FileStatus::IoError | FileStatus::UnsafePath)
        })
        .map(|f| f.path.clone())
        .collect();
    (!blocked.is_empty()).then_some(Work::Access(blocked))
}

/// ROOT's canonical path, device and inode when the watch was set: if ROOT is replaced, the watch
/// is on the old one.
struct RootIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl RootIdentity {
    fn of(path: &Path) -> Option<RootIdentity> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(RootIdentity {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    fn still_matches(&self, path: &Path) -> bool {
        RootIdentity::of(path).is_some_and(|now| now.dev == self.dev && now.ino == self.ino)
    }
}

/// The directory that holds the manifest, canonical (where a ConfigMap's `..data` swap happens).
fn manifest_dir(manifest: &Path) -> PathBuf {
    let parent = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf())
}

fn failing(report: &Report) -> impl Iterator<Item = &super::report::FileReport> {
    report
        .files
        .iter()
        .filter(|f| f.status != FileStatus::Ok && f.status != FileStatus::Extra)
}

/// A short reason for /readyz: the failing files, or the cache-wide error.
fn failure_summary(report: &Report) -> String {
    if let Some(error) = &report.error {
        return error.clone();
    }
    let failing: Vec<String> = failing(report)
        .map(|f| format!("{} {}", f.path, f.status.as_str()))
        .collect();
    match failing.len() {
        0 => match &report.listing_error {
            Some(note) => format!("{note} (extra files fail this model)"),
            None => "files not in the manifest are present (extra files fail this model)".into(),
        },
        n if n <= 5 => failing.join(", "),
        n => format!("{} and {} more", failing[..5].join(", "), n - 5),
    }
}

/// One line per verification: the audit trail an SRE greps.
fn log_result(
    name: &str,
    report: &Report,
    job: &Running,
    hashed: u64,
    seconds: f64,
    trusted_files: usize,
) {
    let (kind, priority) = (job.kind.as_str(), job.priority.as_str());
    let throttled_seconds = job.control.throttled().as_secs_f64();
    let failing: Vec<String> = failing(report)
        .map(|f| format!("{}={}", f.path, f.status.as_str()))
        .collect();
    let revision = report.revision.as_deref().unwrap_or("");
    // A bundle's attestation subject, to tie the verified cache to its provenance.
    let root_digest = report.root_digest.as_deref().unwrap_or("");
    let outcome = if report.is_verified() {
        "verified"
    } else {
        "failed"
    };
    if report.is_verified() {
        tracing::info!(model_name = %name, revision, root_digest, outcome, kind, priority, duration_seconds = seconds, bytes_hashed = hashed, throttled_seconds, trusted_files, "model cache verified");
    } else {
        tracing::warn!(model_name = %name, revision, outcome, kind, priority, duration_seconds = seconds, bytes_hashed = hashed, throttled_seconds,
            failing_files = %failing.join(" "), error = report.error.as_deref().unwrap_or(""), "model cache failed verification");
    }
}
