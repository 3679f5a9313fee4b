//! Without a manifest, a Hugging Face cache can still be checked against itself: the hub stores
//! each file under its content address, the SHA-256 for LFS files and the git blob id (SHA-1) for
//! files kept in git, and the snapshot links name those blobs. Verifying every linked blob against
//! its own name catches truncation, corruption and half-downloads offline. It proves integrity, not
//! provenance: someone who can write the cache can rename a blob too, so a trusted manifest is
//! still what a release should be checked against.
//!
//! Every snapshot entry is expected: one that is not a link to a content-addressed blob has nothing
//! to be checked against and fails, with the word a manifest would give it.
//!
//! A file whose download died before its snapshot link was made leaves no link to check. A
//! download that did not finish leaves its `.incomplete` file (and, while it runs, a held lock):
//! the verifier fails the cache on either ([`Layout::unfinished_downloads`]). What
//! huggingface_hub 2.x leaves besides: the commit's tree listing, `trees/<commit>.json`, written by
//! `snapshot_download` (its `_tree_cache.py`). The listing names every file of the repo, including
//! those a download left out on purpose (`allow_patterns`), so a listed file without a link is only
//! expected when the cache holds evidence that it was being fetched: its blob, or an `.incomplete`
//! download of it. The listing also gives each linked file's size.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::{ContentDigest, Digest, ExpectedFile, Manifest, ManifestError, ManifestFormat, Sha256};
use crate::layout::{self, Layout, PartialBlobs};
use crate::safe_open::Root;
use crate::walk;

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
    // Every entry is checked: one whose link names no content address (a link to /etc/hostname,
    // to `blobs/evil.bin`, a regular file put in place of a link) is expected with nothing to
    // match, so the verifier gives it the word a manifest would (`escapes_root`, `unsafe_path`,
    // `missing`), never a pass.
    for (rel, blob) in snapshot_entries(&snapshot).map_err(|e| fail(e.to_string()))? {
        files.push(ExpectedFile {
            path: rel.into(),
            size: None,
            digest: blob
                .as_deref()
                .and_then(digest_of_blob)
                .unwrap_or(Digest::Unaddressed),
        });
    }
    if let Some(listing) = commit.as_deref().and_then(|c| read_tree_listing(&root, c)) {
        let linked: HashSet<Box<str>> = files.iter().map(|f| f.path.clone()).collect();
        // A blob another revision links is explained by it; only an orphan is a download of ours.
        let blobs_in_use = linked_blobs(&canonical.join("snapshots"));
        let partials = PartialBlobs::default();
        for file in &mut files {
            file.size = listing.get(&*file.path).map(TreeEntry::content_size);
        }
        for (path, entry) in &listing {
            if linked.contains(path.as_str()) {
                continue;
            }
            let Some(digest) = entry.digest() else {
                continue;
            };
            let blob = entry.blob();
            let orphan =
                !blobs_in_use.contains(blob) && root.exists_nofollow(&format!("blobs/{blob}"));
            if orphan || !partials.of(&root, blob).is_empty() {
                files.push(ExpectedFile {
                    path: path.as_str().into(),
                    size: Some(entry.content_size()),
                    digest,
                });
            }
        }
    }
    if files.is_empty() {
        return Err(fail(format!(
            "snapshot {} holds no files",
            snapshot.display()
        )));
    }
    Ok(Manifest::new(ManifestFormat::HubBlobNames, commit, files))
}

/// Each file of a snapshot folder, with the name of the blob it points to where it is a link.
fn snapshot_entries(snapshot: &Path) -> std::io::Result<Vec<(String, Option<String>)>> {
    Ok(walk::list_files(snapshot)?
        .files
        .into_iter()
        .map(|rel| {
            let blob = std::fs::read_link(snapshot.join(&rel))
                .ok()
                .and_then(|target| Some(target.file_name()?.to_str()?.to_string()));
            (rel, blob)
        })
        .collect())
}

/// The digest a blob's name is: the SHA-256 of an LFS file, or a git blob id.
fn digest_of_blob(blob: &str) -> Option<Digest> {
    match blob.len() {
        64 => Sha256::parse_hex(blob)
            .ok()
            .map(|sha256| Digest::Whole(ContentDigest::Sha256(sha256))),
        40 => {
            let mut id = [0u8; 20];
            hex::decode_to_slice(blob, &mut id).ok()?;
            Some(Digest::GitBlob(id))
        }
        _ => None,
    }
}

/// The blob names the snapshot links of every revision point to.
fn linked_blobs(snapshots: &Path) -> HashSet<String> {
    let Ok(revisions) = std::fs::read_dir(snapshots) else {
        return HashSet::new();
    };
    revisions
        .filter_map(Result::ok)
        .filter_map(|revision| snapshot_entries(&revision.path()).ok())
        .flatten()
        .filter_map(|(_, blob)| blob)
        .collect()
}

/// One file of huggingface_hub's tree listing (`TreeCacheEntry` in its `_tree_cache.py`).
#[derive(Deserialize)]
struct TreeEntry {
    size: u64,
    blob_id: String,
    #[serde(default)]
    lfs_sha256: Option<String>,
    #[serde(default)]
    lfs_size: Option<u64>,
}

impl TreeEntry {
    /// The blob's name in the cache: the SHA-256 for LFS files, the git blob id otherwise.
    fn blob(&self) -> &str {
        self.lfs_sha256.as_deref().unwrap_or(&self.blob_id)
    }

    /// For an LFS file `size` is the pointer's, `lfs_size` the content's.
    fn content_size(&self) -> u64 {
        self.lfs_size.unwrap_or(self.size)
    }

    fn digest(&self) -> Option<Digest> {
        digest_of_blob(self.blob())
    }
}

#[derive(Deserialize)]
struct TreeListing {
    format_version: u32,
    files: BTreeMap<String, TreeEntry>,
}

/// A listing is the repo's file list: a few hundred bytes a file.
const TREE_LISTING_LIMIT: u64 = 64 << 20;

/// `trees/<commit>.json` in the repo folder, when huggingface_hub wrote one in the format it
/// documents (`format_version` 1). A listing that cannot be read is no evidence: the links are
/// checked as without one.
fn read_tree_listing(root: &Root, commit: &str) -> Option<BTreeMap<String, TreeEntry>> {
    let bytes = root.read_at_most(&format!("trees/{commit}.json"), TREE_LISTING_LIMIT)?;
    let listing: TreeListing = serde_json::from_slice(&bytes).ok()?;
    (listing.format_version == 1).then_some(listing.files)
}
