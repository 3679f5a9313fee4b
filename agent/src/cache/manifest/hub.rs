//! Without a manifest, a Hugging Face cache can still be checked against itself: the hub stores
//! each file under its content address, the SHA-256 for LFS files and the git blob id (SHA-1) for
//! files kept in git, and the snapshot links name those blobs. Verifying every linked blob against
//! its own name catches truncation, corruption and half-downloads offline. It proves integrity, not
//! provenance: someone who can write the cache can rename a blob too, so a trusted manifest is
//! still what a release should be checked against.

use std::path::Path;

use super::{Digest, ExpectedFile, Manifest, ManifestError, ManifestFormat, Sha256};
use crate::cache::layout::{self, Layout};
use crate::cache::safe_open::Root;
use crate::cache::walk;

pub fn from_blob_names(
    root_path: &Path,
    revision: Option<&str>,
) -> Result<Manifest, ManifestError> {
    let fail = |reason: String| ManifestError::NoManifest {
        path: root_path.to_path_buf(),
        reason,
    };
    let canonical = std::fs::canonicalize(root_path).map_err(|e| fail(e.to_string()))?;
    if !layout::is_hf_repo(&canonical) {
        return Err(fail("it is not a Hugging Face cache (no snapshots/ and refs/), so nothing names its files' digests".into()));
    }
    let root = Root::open(&canonical).map_err(|e| fail(e.to_string()))?;
    let (layout, commit) =
        layout::settle_revision(&root, revision, None).map_err(|e| fail(e.to_string()))?;
    let Layout::HfRepo { .. } = layout else {
        return Err(fail("not a Hugging Face cache".into()));
    };
    let snapshot = canonical.join(layout.model_dir());
    let mut files = Vec::new();
    for rel in walk::list_files(&snapshot)
        .map_err(|e| fail(e.to_string()))?
        .files
    {
        // A regular file in a snapshot has no content address: it is left out (and listed as extra).
        let Ok(target) = std::fs::read_link(snapshot.join(&rel)) else {
            continue;
        };
        let Some(blob) = target.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let digest = match blob.len() {
            64 => Sha256::parse_hex(blob).ok().map(Digest::Whole),
            40 => {
                let mut id = [0u8; 20];
                hex::decode_to_slice(blob, &mut id)
                    .ok()
                    .map(|()| Digest::GitBlob(id))
            }
            _ => None,
        };
        if let Some(digest) = digest {
            files.push(ExpectedFile {
                path: rel.into(),
                size: None,
                digest,
            });
        }
    }
    if files.is_empty() {
        return Err(fail(format!(
            "snapshot {} links no blobs",
            snapshot.display()
        )));
    }
    Ok(Manifest::new(ManifestFormat::HubBlobNames, commit, files))
}
