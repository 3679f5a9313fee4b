//! `mlnode-agent manifest`: the native manifest of a model directory, for a release pipeline to
//! sign or publish. It reuses the verifier's safe open and parallel hasher, so a manifest is only
//! written for files the verifier would accept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::hasher::{self, Algorithm, Control, Job, JobResult};
use super::layout::{self, Layout};
use super::manifest::native::{NativeEntryOut, NativeHash, NativeManifestOut};
use super::safe_open::{OpenFailure, Root};
use super::walk;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("cannot read model directory {path}: {reason}")]
    Root { path: PathBuf, reason: String },
    #[error("{0}")]
    Revision(String),
    #[error("{path} has no files to put in a manifest")]
    Empty { path: PathBuf },
    #[error("no manifest written; these files cannot be hashed safely:\n{}", .0.join("\n"))]
    Files(Vec<String>),
    #[error("hashing was cancelled")]
    Cancelled,
}

/// Builds the manifest of `root_path`: a plain directory, or the snapshot `revision` (default
/// `main`) of a hub repo cache, each file's content recorded with `hash`.
pub fn generate(
    root_path: &Path,
    revision: Option<&str>,
    hash: NativeHash,
    control: &Control,
) -> Result<NativeManifestOut, GenerateError> {
    let root_error = |e: std::io::Error| GenerateError::Root {
        path: root_path.to_path_buf(),
        reason: e.to_string(),
    };
    let canonical = std::fs::canonicalize(root_path).map_err(root_error)?;
    let root = Root::open(&canonical).map_err(root_error)?;
    let (layout, revision) = if layout::is_hf_repo(&canonical) {
        layout::settle_revision(&root, revision, None)
            .map_err(|e| GenerateError::Revision(e.to_string()))?
    } else {
        (Layout::Plain, revision.map(str::to_string))
    };

    let listing = walk::list_files(&canonical.join(layout.model_dir())).map_err(root_error)?;
    // A manifest records what every file is; a tree it cannot fully see or name is refused.
    if let Some(summary) = listing.unlisted_summary() {
        return Err(GenerateError::Files(vec![format!("  {summary}")]));
    }
    if !listing.not_utf8.is_empty() {
        return Err(GenerateError::Files(
            listing
                .not_utf8
                .iter()
                .map(|name| {
                    format!("  {name}: the name is not UTF-8, which a manifest cannot record")
                })
                .collect(),
        ));
    }
    let files = listing.files;
    if files.is_empty() {
        return Err(GenerateError::Empty { path: canonical });
    }
    let jobs: Vec<Job> = files
        .iter()
        .map(|path| {
            let located = layout.locate(path);
            let weight = layout
                .open(&root, &located)
                .map(|f| f.snapshot.size)
                .unwrap_or(0);
            Job {
                path: located,
                start: 0,
                len: None,
                weight,
                expected: None,
                algorithm: Algorithm::from(hash.algorithm()),
            }
        })
        .collect();
    let results = hasher::run(&root, &layout, &jobs, control);

    let mut entries = BTreeMap::new();
    let mut problems = Vec::new();
    for (path, result) in files.into_iter().zip(results) {
        match result {
            JobResult::Hashed { digest, bytes, .. } => {
                entries.insert(path, NativeEntryOut::new(hash, hex::encode(digest), bytes));
            }
            JobResult::Cancelled => return Err(GenerateError::Cancelled),
            JobResult::Open(
                OpenFailure::Missing(r)
                | OpenFailure::EscapesRoot(r)
                | OpenFailure::NotRegular(r)
                | OpenFailure::Symlink(r)
                | OpenFailure::Io(r),
            )
            | JobResult::Changed(r)
            | JobResult::Io(r) => problems.push(format!("  {path}: {r}")),
        }
    }
    if !problems.is_empty() {
        return Err(GenerateError::Files(problems));
    }
    Ok(NativeManifestOut {
        revision,
        files: entries,
    })
}
