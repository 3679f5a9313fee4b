//! Verification of one model cache against its manifest.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use rayon::prelude::*;

use super::fingerprint::{Fingerprint, Folder};
use super::hasher::{self, Algorithm, Control, Job, JobResult};
use super::layout::{self, Layout, PartialBlobs};
use super::manifest::{ContentDigest, Digest, ExpectedFile, Manifest, ManifestFormat};
use super::paths::check_relative_path;
use super::report::{FileReport, FileStatus, Report};
use super::safe_open::{OpenFailure, Root, Snapshot, Strategy};
use super::walk;

#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// `--revision`: a commit, or a ref name for a hub cache.
    pub revision: Option<String>,
    /// Files under ROOT that the manifest does not list fail the run. A signed bundle asks for
    /// this itself (see [`VerifyOptions::extras_fail`]).
    pub fail_on_extra: bool,
    /// A signed bundle's unlisted files pass (model_signing's `--ignore_unsigned_files`).
    pub ignore_unsigned_files: bool,
    pub strategy: Strategy,
    /// The manifest file itself, left out of the `extra` list when it lives inside ROOT.
    pub manifest_path: Option<PathBuf>,
    /// Look only at these manifest paths (an incremental run after file events); extras are
    /// always listed afresh. None: every file.
    pub only: Option<HashSet<String>>,
    /// Keep the report lines of `ok` files (the CLI prints them); without, they are only counted.
    pub keep_ok_lines: bool,
    /// A full run's files that still match this earlier fingerprint (looked at, not read) are
    /// taken as `ok` without hashing; the rest are hashed. The caller vouches that it was taken
    /// by a verification of this same manifest and these options that passed.
    pub trusted: Option<Fingerprint>,
}

impl VerifyOptions {
    /// Whether files the manifest does not list fail the verification: asked for, or implied by a
    /// signed bundle (model_signing rejects an added `evil.py`) unless unsigned files are allowed.
    pub fn extras_fail(&self, manifest: &Manifest) -> bool {
        self.fail_on_extra || (manifest.covers_the_whole_model() && !self.ignore_unsigned_files)
    }
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            revision: None,
            fail_on_extra: false,
            ignore_unsigned_files: false,
            strategy: Strategy::Auto,
            manifest_path: None,
            only: None,
            keep_ok_lines: true,
            trusted: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot open model cache {path}: {source}")]
    Root {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("verification of {0} was cancelled")]
    Cancelled(PathBuf),
}

/// Manifest files looked at and hashed together: what a verification holds per file (plans, jobs,
/// results) is bounded by this, not by the size of the manifest. Models of fewer files than this,
/// which is nearly all of them, are hashed in one batch, so no core waits at a batch's end.
const BATCH: usize = 4096;

/// What the first look at a file decided: a final status, or the jobs to hash it.
enum Plan {
    Done(FileReport),
    Hash {
        first_job: usize,
        jobs: usize,
        blob: Option<String>,
        snapshot: Snapshot,
    },
}

/// Verifies the model at `root_path` against `manifest`, hashing on the current rayon pool. The
/// model is a directory (plain or a Hugging Face repo cache) or a single file.
pub fn verify(
    root_path: &Path,
    manifest: &Manifest,
    options: &VerifyOptions,
    control: &Control,
) -> Result<Report, VerifyError> {
    let is_file = std::fs::symlink_metadata(root_path).is_ok_and(|m| m.is_file());
    let (Some(dir), Some(name), true) = (
        root_path.parent(),
        root_path.file_name().and_then(|n| n.to_str()),
        is_file,
    ) else {
        return verify_tree(root_path, manifest, options, control, true);
    };
    // A single-file model: model_signing names its one resource "." (the path relative to itself),
    // a native manifest names the file. Verified in its directory, with no extras: its siblings
    // are not part of it.
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let [only] = manifest.files.as_slice() else {
        return Ok(Report::failed(
            format!(
                "{} is a single file, but the manifest lists {} files",
                root_path.display(),
                manifest.files.len()
            ),
            manifest.revision.clone(),
        ));
    };
    if &*only.path != "." && &*only.path != name {
        return Ok(Report::failed(
            format!(
                "{} is a single file, but the manifest's one file is {:?}",
                root_path.display(),
                only.path
            ),
            manifest.revision.clone(),
        ));
    }
    let mut single = manifest.clone();
    single.files[0].path = name.into();
    verify_tree(dir, &single, options, control, false)
}

fn verify_tree(
    root_path: &Path,
    manifest: &Manifest,
    options: &VerifyOptions,
    control: &Control,
    list_extras: bool,
) -> Result<Report, VerifyError> {
    let started = Instant::now();
    let started_wall = SystemTime::now();
    let hashed_before = control.hashed_bytes.load(Ordering::Relaxed);
    let root_error = |source| VerifyError::Root {
        path: root_path.to_path_buf(),
        source,
    };
    let canonical = std::fs::canonicalize(root_path).map_err(root_error)?;
    let root = Root::with_strategy(&canonical, options.strategy).map_err(root_error)?;

    let (layout, revision) = match layout::settle_revision(
        &root,
        options.revision.as_deref(),
        manifest.revision.as_deref(),
    ) {
        Ok(settled) => settled,
        Err(e) => {
            let revision = options
                .revision
                .clone()
                .or_else(|| manifest.revision.clone());
            return Ok(Report {
                seconds: started.elapsed().as_secs_f64(),
                root_digest: manifest.root_digest.map(|d| d.to_hex()),
                ..Report::failed(e.to_string(), revision)
            });
        }
    };

    // A hub cache's snapshot entries are links into its blob store by design (the layout checks
    // their form); in a plain directory, a bundle's `allow_symlinks: false` means none at all.
    let root = match layout {
        Layout::Plain if !manifest.allow_symlinks => root.without_symlinks(),
        _ => root,
    };
    let partials = PartialBlobs::default();
    let mut files = Vec::new();
    let mut ok_not_kept = 0;
    let mut expected_bytes = 0;
    let full = options.only.is_none();
    let count = manifest.files.len();
    // Buckets whose files still match the trusted fingerprint, with what those files weigh.
    let unchanged: Vec<Option<u64>> = match (&options.trusted, full) {
        (Some(trusted), true) => unchanged_buckets(&root, &layout, &partials, manifest, trusted),
        _ => vec![None; Fingerprint::bucket_count(count)],
    };
    let mut trusted_files = 0;
    let mut folder = Folder::new(count, started_wall);
    for (batch_index, batch) in manifest.files.chunks(BATCH).enumerate() {
        let mut selected: Vec<(usize, &ExpectedFile)> = Vec::new();
        for (i, expected) in batch.iter().enumerate() {
            let index = batch_index * BATCH + i;
            if !options
                .only
                .as_ref()
                .is_none_or(|only| only.contains(&*expected.path))
            {
                continue;
            }
            if unchanged[Fingerprint::bucket_of(index, count)].is_some() {
                trusted_files += 1;
                if options.keep_ok_lines {
                    files.push(FileReport::new(&*expected.path, FileStatus::Ok));
                } else {
                    ok_not_kept += 1;
                }
                continue;
            }
            selected.push((index, expected));
        }
        // An incremental run looks at a few files of a large manifest: most batches are empty.
        if selected.is_empty() {
            continue;
        }
        let expected_files: Vec<&ExpectedFile> = selected.iter().map(|(_, e)| *e).collect();
        let lines = verify_batch(&root, &layout, &partials, &expected_files, control);
        if control.is_cancelled() {
            return Err(VerifyError::Cancelled(root_path.to_path_buf()));
        }
        for ((index, expected), (line, seen)) in selected.into_iter().zip(lines) {
            expected_bytes += expected.size.or(line.size).unwrap_or(0);
            match seen.filter(|_| line.status == FileStatus::Ok) {
                Some((snapshot, blob)) => {
                    folder.add(index, &expected.path, blob.as_deref(), &snapshot)
                }
                None => folder.spoil(index),
            }
            if line.status == FileStatus::Ok && !options.keep_ok_lines {
                ok_not_kept += 1;
            } else {
                files.push(line);
            }
        }
    }
    expected_bytes += unchanged.iter().flatten().sum::<u64>();
    let kept: Vec<(usize, u64)> = match &options.trusted {
        Some(trusted) => unchanged
            .iter()
            .zip(trusted.buckets())
            .enumerate()
            .filter(|(_, (bytes, _))| bytes.is_some())
            .map(|(bucket, (_, value))| (bucket, *value))
            .collect(),
        None => Vec::new(),
    };
    let fingerprint = full.then(|| folder.finish(&kept));

    // Without a manifest, a download that never made its snapshot link is only found in blobs/
    // and .locks/. Listed relative to the snapshot, as the hub's own links name blobs.
    if manifest.format == ManifestFormat::HubBlobNames && options.only.is_none() {
        let explained: HashSet<String> = manifest
            .files
            .iter()
            .filter_map(|f| f.digest.blob_name())
            .collect();
        files.extend(
            layout
                .unfinished_downloads(&root, &partials, &explained)
                .into_iter()
                .map(unfinished_report),
        );
    }

    let model_dir = canonical.join(layout.model_dir());
    let manifest_path = options
        .manifest_path
        .as_ref()
        .and_then(|p| std::fs::canonicalize(p).ok());
    let listing = if list_extras {
        walk::walk_files(&model_dir, |found| {
            let name = match found {
                walk::Found::Utf8(path) => {
                    if manifest.lists(path)
                        || manifest.ignores(path)
                        || manifest_path.as_deref() == Some(model_dir.join(path).as_path())
                    {
                        return;
                    }
                    path.to_string()
                }
                walk::Found::Escaped(name) => name,
            };
            files.push(FileReport::new(name, FileStatus::Extra));
        })
    } else {
        Ok(walk::Unlisted::default())
    };
    let listing_error = match listing {
        Ok(unlisted) => unlisted.summary(),
        Err(e) => Some(format!(
            "cannot list the files of {}: {e}",
            model_dir.display()
        )),
    };

    let status = Report::verdict_of(
        &files,
        None,
        listing_error.as_deref(),
        options.extras_fail(manifest),
    );
    Ok(Report {
        status,
        revision,
        error: None,
        listing_error,
        files,
        root_digest: manifest.root_digest.map(|d| d.to_hex()),
        ok_not_kept,
        expected_bytes,
        bytes_hashed: control.hashed_bytes.load(Ordering::Relaxed) - hashed_before,
        seconds: started.elapsed().as_secs_f64(),
        trusted_files,
        fingerprint,
    })
}

/// Per bucket of `trusted`, whether its files are as they were (one look at each: open, `fstat`,
/// no read), and then what they weigh.
fn unchanged_buckets(
    root: &Root,
    layout: &Layout,
    partials: &PartialBlobs,
    manifest: &Manifest,
    trusted: &Fingerprint,
) -> Vec<Option<u64>> {
    let count = manifest.files.len();
    let mut folder = Folder::new(count, SystemTime::now());
    let mut bytes = vec![0u64; Fingerprint::bucket_count(count)];
    for (batch_index, batch) in manifest.files.chunks(BATCH).enumerate() {
        let looks: Vec<_> = batch
            .par_iter()
            .map(|expected| first_look(root, layout, partials, expected))
            .collect();
        for (i, (expected, look)) in batch.iter().zip(looks).enumerate() {
            let index = batch_index * BATCH + i;
            match look {
                Ok((snapshot, blob)) => {
                    bytes[Fingerprint::bucket_of(index, count)] += snapshot.size;
                    folder.add(index, &expected.path, blob.as_deref(), &snapshot);
                }
                Err(_) => folder.spoil(index),
            }
        }
    }
    folder
        .finish(&[])
        .unchanged_since(trusted)
        .into_iter()
        .zip(bytes)
        .map(|(same, bytes)| same.then_some(bytes))
        .collect()
}

/// What the first look at a file saw, where it could look: its snapshot and, in a hub cache, the
/// blob its snapshot link names.
type Seen = Option<(Snapshot, Option<String>)>;

/// Looks at, hashes and judges one batch of manifest files; one line per file, in their order,
/// with what the first look saw of it.
fn verify_batch(
    root: &Root,
    layout: &Layout,
    partials: &PartialBlobs,
    selected: &[&ExpectedFile],
    control: &Control,
) -> Vec<(FileReport, Seen)> {
    let firsts: Vec<Result<(Snapshot, Option<String>), FileReport>> = selected
        .par_iter()
        .map(|expected| first_look(root, layout, partials, expected))
        .collect();

    let mut jobs = Vec::new();
    let mut plans = Vec::with_capacity(selected.len());
    for (expected, first) in selected.iter().zip(firsts) {
        let (snapshot, blob) = match first {
            Ok(found) => found,
            Err(report) => {
                plans.push(Plan::Done(report));
                continue;
            }
        };
        let first_job = jobs.len();
        let located = layout.locate(&expected.path);
        match &expected.digest {
            Digest::Whole(_) | Digest::GitBlob(_) => jobs.push(Job {
                path: located,
                start: 0,
                len: None,
                weight: snapshot.size,
                expected: Some(snapshot),
                algorithm: match &expected.digest {
                    Digest::Whole(digest) => digest.algorithm().into(),
                    _ => Algorithm::GitBlob,
                },
            }),
            Digest::Shards(shards) => jobs.extend(shards.iter().map(|shard| Job {
                path: located.clone(),
                start: shard.start,
                len: Some(shard.end - shard.start),
                weight: shard.end - shard.start,
                expected: Some(snapshot),
                algorithm: shard.digest.algorithm().into(),
            })),
            // Refused by the first look; nothing to hash.
            Digest::Unaddressed => {}
        }
        plans.push(Plan::Hash {
            first_job,
            jobs: jobs.len() - first_job,
            blob,
            snapshot,
        });
    }

    let results = hasher::run(root, layout, &jobs, control);
    selected
        .iter()
        .zip(plans)
        .map(|(expected, plan)| match plan {
            Plan::Done(report) => (report, None),
            Plan::Hash {
                first_job,
                jobs,
                blob,
                snapshot,
            } => {
                let report = judge(expected, &results[first_job..first_job + jobs], snapshot);
                let report = if download_explains(&report)
                    && layout.download_in_progress(root, partials, &expected.path, blob.as_deref())
                {
                    FileReport {
                        status: FileStatus::InProgress,
                        ..report
                    }
                } else {
                    report
                };
                (report, Some((snapshot, blob)))
            }
        })
        .collect()
}

fn unfinished_report(download: layout::UnfinishedDownload) -> FileReport {
    let path = format!("../../blobs/{}", download.blob);
    let partial = match download.partial_files.as_slice() {
        [] => String::new(),
        files => format!(" (left {})", files.join(", ")),
    };
    if download.under_way {
        FileReport::new(path, FileStatus::InProgress).with_error(format!(
            "blob {} is being downloaded{partial}, and no snapshot entry links it yet",
            download.blob
        ))
    } else {
        FileReport::new(path, FileStatus::Missing).with_error(format!(
            "the download of blob {} did not finish{partial}: the file it was for is missing from the snapshot",
            download.blob
        ))
    }
}

fn status_of(failure: OpenFailure) -> (FileStatus, String) {
    match failure {
        OpenFailure::Missing(reason) => (FileStatus::Missing, reason),
        OpenFailure::EscapesRoot(reason) => (FileStatus::EscapesRoot, reason),
        OpenFailure::NotRegular(reason) => (FileStatus::NotRegularFile, reason),
        OpenFailure::Symlink(reason) => (FileStatus::UnsafePath, reason),
        OpenFailure::Io(reason) => (FileStatus::IoError, reason),
    }
}

/// Statuses that a download under way would explain.
fn download_explains(report: &FileReport) -> bool {
    matches!(
        report.status,
        FileStatus::Missing | FileStatus::SizeMismatch | FileStatus::DigestMismatch
    )
}

/// Everything that can be decided without reading the file: its path, where it leads, what it
/// is, and its size. Returns the file's snapshot and, for a hub snapshot link, its blob name.
fn first_look(
    root: &Root,
    layout: &Layout,
    partials: &PartialBlobs,
    expected: &ExpectedFile,
) -> Result<(Snapshot, Option<String>), FileReport> {
    let path = &*expected.path;
    if let Err(reason) = check_relative_path(path) {
        return Err(FileReport::new(path, FileStatus::UnsafePath).with_error(reason));
    }
    let link = layout.check_snapshot_entry(root, path);
    let blob = match (&link, &expected.digest) {
        (Ok(Some(blob)), _) => Some(blob.clone()),
        // A missing LFS file would be stored under its SHA-256: that names its download marker.
        (_, Digest::Whole(ContentDigest::Sha256(sha256))) => Some(sha256.to_hex()),
        _ => None,
    };
    let opened = match layout.open(root, &layout.locate(path)) {
        Ok(opened) => opened,
        Err(failure) => {
            let (status, reason) = status_of(failure);
            let mut report = FileReport::new(path, status).with_error(reason);
            report.expected_size = expected.size;
            if download_explains(&report)
                && layout.download_in_progress(root, partials, path, blob.as_deref())
            {
                report.status = FileStatus::InProgress;
            }
            return Err(report);
        }
    };
    let snapshot = opened.snapshot;
    let unaddressed =
        matches!(expected.digest, Digest::Unaddressed).then(|| UNADDRESSED.to_string());
    if let Some(reason) = link.err().or(unaddressed) {
        return Err(FileReport::new(path, FileStatus::UnsafePath)
            .with_size(snapshot.size)
            .with_error(reason));
    }
    if let Some(size) = expected.size.filter(|&size| size != snapshot.size) {
        let mut report = FileReport::new(path, FileStatus::SizeMismatch)
            .with_size(snapshot.size)
            .with_error(format!(
                "{} bytes on disk, the manifest says {size}",
                snapshot.size
            ));
        report.expected_size = Some(size);
        if layout.download_in_progress(root, partials, path, blob.as_deref()) {
            report.status = FileStatus::InProgress;
        }
        return Err(report);
    }
    Ok((snapshot, blob))
}

const UNADDRESSED: &str = "a regular file where the hub writes a link into blobs/: without a manifest, nothing names its content";

/// Turns the results of a file's jobs into its report line.
fn judge(expected: &ExpectedFile, results: &[JobResult], snapshot: Snapshot) -> FileReport {
    let path = &*expected.path;
    let base = FileReport::new(path, FileStatus::Ok).with_size(snapshot.size);
    let mut digests = Vec::with_capacity(results.len());
    for result in results {
        match result {
            JobResult::Hashed { digest, .. } => digests.push(digest.as_slice()),
            JobResult::Open(failure) => {
                let (status, reason) = status_of(failure.clone());
                return FileReport { status, ..base }
                    .with_error(format!("{reason} (while hashing)"));
            }
            JobResult::Changed(reason) => {
                return FileReport {
                    status: FileStatus::ChangedDuringRead,
                    ..base
                }
                .with_error(reason.clone())
            }
            JobResult::Io(reason) => {
                return FileReport {
                    status: FileStatus::IoError,
                    ..base
                }
                .with_error(reason.clone())
            }
            JobResult::Cancelled => {
                return FileReport {
                    status: FileStatus::IoError,
                    ..base
                }
                .with_error("cancelled")
            }
        }
    }
    // A whole-file digest: the report carries what was computed; a mismatch names what was wanted.
    let whole = |want: &[u8], field: &str| {
        let got = digests[0];
        let computed = hex::encode(got);
        let report = FileReport {
            sha256: (field == "sha256").then(|| computed.clone()),
            ..base.clone()
        };
        if got == want {
            report
        } else {
            FileReport {
                status: FileStatus::DigestMismatch,
                ..report
            }
            .with_error(format!(
                "expected {field} {}, found {computed}",
                hex::encode(want)
            ))
        }
    };
    match &expected.digest {
        Digest::Whole(want) => whole(want.bytes(), want.algorithm().name()),
        Digest::GitBlob(want) => whole(want, "git blob id"),
        Digest::Unaddressed => FileReport {
            status: FileStatus::UnsafePath,
            ..base
        }
        .with_error(UNADDRESSED),
        Digest::Shards(shards) => {
            let bad: Vec<String> = shards
                .iter()
                .zip(&digests)
                .filter(|(shard, got)| shard.digest.bytes() != **got)
                .map(|(shard, _)| format!("{}..{}", shard.start, shard.end))
                .collect();
            if bad.is_empty() {
                base
            } else {
                FileReport {
                    status: FileStatus::DigestMismatch,
                    ..base
                }
                .with_error(format!(
                    "{} of {} shards differ, bytes {}",
                    bad.len(),
                    shards.len(),
                    bad.join(", ")
                ))
            }
        }
    }
}
