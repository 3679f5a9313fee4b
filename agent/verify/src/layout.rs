//! Where the manifest's files live under ROOT, and which revision is on disk.
//!
//! ROOT is either a plain model directory or a Hugging Face hub repo cache folder
//! (`models--org--name`, recognised by its `snapshots/` and `refs/`). In the latter, the files of
//! revision R are `snapshots/R/<path>`, each a regular file or a relative symlink into `blobs/`
//! exactly as the hub writes it, and a branch name is resolved through `refs/<name>`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::safe_open::{OpenFailure, OpenedFile, Root};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    Plain,
    /// A hub repo cache, with the commit of the snapshot that is verified.
    HfRepo {
        commit: String,
    },
}

/// The revision could not be settled; a mismatch is a verification failure, not bad usage.
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error("revision mismatch: {0}")]
    Mismatch(String),
    #[error("{0}")]
    Unresolvable(String),
}

pub fn is_hf_repo(root: &Path) -> bool {
    root.join("snapshots").is_dir() && root.join("refs").is_dir()
}

fn is_commit(text: &str) -> bool {
    text.len() == 40
        && text
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// A ref name is used as a path under `refs/`, so it gets the same scrutiny as a manifest path.
fn ref_is_safe(name: &str) -> bool {
    super::paths::check_relative_path(name).is_ok()
}

/// Resolves a revision name (a commit or a ref such as `main` or `pr/1`) to a commit.
fn resolve(root: &Root, name: &str) -> Result<String, RevisionError> {
    if is_commit(name) {
        return Ok(name.to_string());
    }
    if !ref_is_safe(name) {
        return Err(RevisionError::Unresolvable(format!(
            "{name:?} is neither a commit hash nor a usable ref name"
        )));
    }
    let rel = format!("refs/{name}");
    let opened = root.open_file(&rel).map_err(|e| {
        RevisionError::Unresolvable(format!(
            "revision {name:?} is not a commit hash and {}/{rel} cannot be read ({e:?})",
            root.path().display()
        ))
    })?;
    // A ref is one line; anything longer is not a ref, so read no more than a page of it.
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(&opened.file, 4096), &mut text)
        .map_err(|e| {
            RevisionError::Unresolvable(format!("{}/{rel}: {e}", root.path().display()))
        })?;
    let commit = text.trim();
    if !is_commit(commit) {
        return Err(RevisionError::Unresolvable(format!(
            "{}/{rel} holds {commit:?}, not a 40-digit commit hash",
            root.path().display()
        )));
    }
    Ok(commit.to_string())
}

/// Decides the layout and settles the revision.
///
/// * `requested`: `--revision`, a commit or (for a hub cache) a ref name;
/// * `manifest_revision`: the revision the trusted manifest was made for.
///
/// Returns the layout and the revision to report.
pub fn settle_revision(
    root: &Root,
    requested: Option<&str>,
    manifest_revision: Option<&str>,
) -> Result<(Layout, Option<String>), RevisionError> {
    if !is_hf_repo(root.path()) {
        return match (requested, manifest_revision) {
            (Some(requested), Some(manifest)) if requested != manifest => Err(RevisionError::Mismatch(format!(
                "the expected revision (--revision, or the model's revision) is {requested:?} but the manifest is for {manifest:?}"
            ))),
            (Some(_), None) => Err(RevisionError::Unresolvable(
                "an expected revision (--revision, or the model's revision) was given, but the manifest names no revision and ROOT is not a Hugging Face cache, so there is nothing to check it against".into(),
            )),
            _ => Ok((Layout::Plain, manifest_revision.or(requested).map(str::to_string))),
        };
    }

    let wanted = requested.or(manifest_revision).unwrap_or("main");
    let commit = resolve(root, wanted)?;
    for (what, name) in [
        (
            "the expected revision (--revision, or the model's revision)",
            requested,
        ),
        ("the manifest's revision", manifest_revision),
    ] {
        let Some(name) = name else { continue };
        let other = resolve(root, name)?;
        if other != commit {
            return Err(RevisionError::Mismatch(format!(
                "{what} {name:?} is commit {other}, but the snapshot verified is {commit}"
            )));
        }
    }
    let snapshot = format!("snapshots/{commit}");
    if !root.exists_nofollow(&snapshot) {
        return Err(RevisionError::Unresolvable(format!(
            "{} has no snapshot for revision {wanted:?} (commit {commit}): the model is not downloaded at that revision",
            root.path().display()
        )));
    }
    Ok((
        Layout::HfRepo {
            commit: commit.clone(),
        },
        Some(commit),
    ))
}

impl Layout {
    /// The path of a manifest file relative to ROOT.
    pub fn locate(&self, rel: &str) -> String {
        match self {
            Layout::Plain => rel.to_string(),
            Layout::HfRepo { commit } => format!("snapshots/{commit}/{rel}"),
        }
    }

    /// The directory, relative to ROOT, whose files the manifest describes ("" for ROOT).
    pub fn model_dir(&self) -> String {
        match self {
            Layout::Plain => String::new(),
            Layout::HfRepo { commit } => format!("snapshots/{commit}"),
        }
    }

    /// Opens a located path (see [`Layout::locate`]) under ROOT. A hub cache's blob may also live in
    /// huggingface_hub's cache-wide store of Xet files: reached only through links of exactly the
    /// forms the hub writes (see [`open_shared_blob`]), anything else stays refused.
    pub fn open(&self, root: &Root, located: &str) -> Result<OpenedFile, OpenFailure> {
        match (self, root.open_file(located)) {
            (Layout::HfRepo { commit }, Err(OpenFailure::EscapesRoot(reason))) => located
                .strip_prefix(&format!("snapshots/{commit}/"))
                .and_then(|rel| open_shared_blob(root, self, rel))
                .unwrap_or(Err(OpenFailure::EscapesRoot(reason))),
            (_, opened) => opened,
        }
    }

    /// Checks the form of a hub snapshot entry: a regular file, or a symlink of exactly the form
    /// the hub writes, `../../blobs/<40 or 64 hex>` with one more `../` per directory level.
    /// Returns the blob name the entry points to, if it is a link.
    pub fn check_snapshot_entry(&self, root: &Root, rel: &str) -> Result<Option<String>, String> {
        let Layout::HfRepo { .. } = self else {
            return Ok(None);
        };
        let target = match root.read_link(&self.locate(rel)) {
            Ok(Some(target)) => target,
            Ok(None) | Err(_) => return Ok(None),
        };
        let target = target.to_string_lossy();
        let depth = rel.matches('/').count() + 2;
        let prefix = format!("{}blobs/", "../".repeat(depth));
        let blob = target
            .strip_prefix(prefix.as_str())
            .filter(|blob| is_blob_name(blob));
        match blob {
            Some(blob) => Ok(Some(blob.to_string())),
            None => Err(format!(
                "snapshot entry is a symlink to {target:?}, not {prefix}<40 or 64 hex digits> as the hub writes it"
            )),
        }
    }

    /// Whether a download of this file is under way, judged by what the Hugging Face downloaders
    /// leave: for a hub cache `.locks/<repo>/<hash>.lock` and `blobs/<hash>[.<8 hex>].incomplete`,
    /// for `--local-dir` downloads `.cache/huggingface/download/<path>.{incomplete,lock}`, and a
    /// plain `<path>.incomplete`. Where a lock file exists, only a held lock is a download (the
    /// file outlives every download); without one, a partial file is taken as one. Only asked
    /// about files that failed, so that markers never hide a good file.
    pub fn download_in_progress(
        &self,
        root: &Root,
        partials: &PartialBlobs,
        rel: &str,
        blob: Option<&str>,
    ) -> bool {
        match self {
            Layout::Plain => {
                let local_dir = format!(".cache/huggingface/download/{rel}");
                let marker = [
                    format!("{rel}.incomplete"),
                    format!("{local_dir}.incomplete"),
                ]
                .iter()
                .any(|marker| root.exists_nofollow(marker));
                under_way(&root.path().join(format!("{local_dir}.lock")), marker)
            }
            Layout::HfRepo { .. } => blob.is_some_and(|blob| blob_under_way(root, partials, blob)),
        }
    }

    /// The downloads of a hub cache that did not finish and that no file of `explained` accounts
    /// for: blobs with an `.incomplete` file, and blobs whose lock someone holds. Without a
    /// manifest these are the only trace of a file whose snapshot link was never made, so each
    /// fails the verification: `in_progress` while its lock is held (or, with no lock file, while
    /// its partial file is there), `missing` once the download died.
    pub fn unfinished_downloads(
        &self,
        root: &Root,
        partials: &PartialBlobs,
        explained: &HashSet<String>,
    ) -> Vec<UnfinishedDownload> {
        let Layout::HfRepo { .. } = self else {
            return Vec::new();
        };
        let mut blobs: BTreeSet<&str> = partials
            .all(root)
            .keys()
            .map(String::as_str)
            .filter(|blob| !explained.contains(*blob))
            .collect();
        let held: Vec<String> = locks_dir(root)
            .and_then(|dir| std::fs::read_dir(&dir).ok().map(|entries| (dir, entries)))
            .map(|(dir, entries)| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|entry| {
                        let name = entry.file_name().into_string().ok()?;
                        let blob = name.strip_suffix(".lock")?;
                        (is_blob_name(blob)
                            && !explained.contains(blob)
                            && lock_state(&dir.join(&name)) == LockState::Held)
                            .then(|| blob.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        blobs.extend(held.iter().map(String::as_str));
        blobs
            .into_iter()
            .map(|blob| UnfinishedDownload {
                blob: blob.to_string(),
                partial_files: partials.of(root, blob).to_vec(),
                under_way: blob_under_way(root, partials, blob),
            })
            .collect()
    }
}

/// A download in a hub cache that left no snapshot link (see [`Layout::unfinished_downloads`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnfinishedDownload {
    pub blob: String,
    /// Its `.incomplete` files in `blobs/`.
    pub partial_files: Vec<String>,
    /// Its lock is held (or, without a lock file, a partial file is there).
    pub under_way: bool,
}

/// A blob's name: a git blob id or a SHA-256, in lower-case hex.
fn is_blob_name(name: &str) -> bool {
    (name.len() == 40 || name.len() == 64)
        && name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The hub keeps its locks beside the repo folders: `<hub>/.locks/<repo folder>/`.
fn locks_dir(root: &Root) -> Option<PathBuf> {
    let root_path = root.path();
    let (hub, repo) = (root_path.parent()?, root_path.file_name()?);
    Some(hub.join(".locks").join(repo))
}

/// Whether a hub blob's download runs: its lock `<hub>/.locks/<repo>/<blob>.lock` held, or, with no
/// lock file, a partial file of it in `blobs/`.
fn blob_under_way(root: &Root, partials: &PartialBlobs, blob: &str) -> bool {
    locks_dir(root).is_some_and(|dir| {
        under_way(
            &dir.join(format!("{blob}.lock")),
            !partials.of(root, blob).is_empty(),
        )
    })
}

/// huggingface_hub holds a download's lock for the whole download and leaves the file behind when
/// it is done (or dies): only a held lock is a download under way; without a lock file, a partial
/// file (`marker`) is taken as one.
fn under_way(lock: &Path, marker: bool) -> bool {
    match lock_state(lock) {
        LockState::Held => true,
        LockState::Free => false,
        LockState::Absent => marker,
    }
}

/// The partial downloads in a hub cache's `blobs/`, by the blob they are for:
/// `<blob>.incomplete` (huggingface_hub before 2.x) and `<blob>.<8 hex>.incomplete` (2.x writes a
/// process-unique file: `_download_to_tmp_and_move` in its `file_download.py`). The directory is
/// listed at most once, on the first question, however many files ask: a verification of many
/// missing files would otherwise list it once per file.
#[derive(Debug, Default)]
pub struct PartialBlobs {
    listed: OnceLock<BTreeMap<String, Vec<String>>>,
}

impl PartialBlobs {
    /// The `.incomplete` files of `blob`, by name.
    pub fn of(&self, root: &Root, blob: &str) -> &[String] {
        self.all(root).get(blob).map_or(&[], Vec::as_slice)
    }

    fn all(&self, root: &Root) -> &BTreeMap<String, Vec<String>> {
        self.listed.get_or_init(|| {
            let mut partials: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let Ok(entries) = std::fs::read_dir(root.path().join("blobs")) else {
                return partials;
            };
            for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
                if let Some(blob) = partial_blob_of(&name) {
                    partials
                        .entry(blob.to_string())
                        .or_default()
                        .push(name.clone());
                }
            }
            partials.values_mut().for_each(|names| names.sort());
            partials
        })
    }
}

/// The blob a partial download's file name is for, if it is one.
fn partial_blob_of(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".incomplete")?;
    let blob = match stem.rsplit_once('.') {
        Some((blob, tag)) if tag.len() == 8 && tag.bytes().all(|b| b.is_ascii_hexdigit()) => blob,
        _ => stem,
    };
    is_blob_name(blob).then_some(blob)
}

/// The marker huggingface_hub writes in its shared store, and the layout version it holds
/// (`SHARED_BLOBS_MARKER_NAME`, `SHARED_BLOBS_LAYOUT_VERSION` in `utils/_shared_blobs.py`).
const SHARED_STORE_MARKER: &str = ".huggingface-shared-blobs";
const SHARED_STORE_VERSION: &[u8] = b"1\n";

/// The store entry (`<first 2 hex>/<64 hex Xet hash>`, relative to the store) that a repo blob's
/// link names, when the link has exactly the form huggingface_hub writes:
/// `../../blobs/<first 2 hex>/<64 hex>`.
pub fn shared_store_entry(blob_link: &std::ffi::OsStr) -> Option<String> {
    let entry = blob_link.to_str()?.strip_prefix("../../blobs/")?;
    let (prefix, hash) = entry.split_once('/')?;
    let is_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    (hash.len() == 64 && is_hex(hash) && prefix == &hash[..2]).then(|| entry.to_string())
}

/// `<cache>/blobs` beside the repo folder `repo`, when it is huggingface_hub's marked shared store.
pub fn shared_store_of(repo: &Path) -> Option<std::path::PathBuf> {
    open_shared_store(repo)
        .ok()
        .map(|store| store.path().to_path_buf())
}

/// The shared store beside `repo`, opened so that nothing in it is reached through a symlink,
/// once its marker says it is huggingface_hub's: a directory the hub marks with
/// `.huggingface-shared-blobs` holding "1\n", whose entries are regular files.
fn open_shared_store(repo: &Path) -> Result<Root, OpenFailure> {
    let store_dir = repo
        .parent()
        .ok_or_else(|| OpenFailure::Io(format!("{} has no parent", repo.display())))?
        .join("blobs");
    let store = Root::open(&store_dir)
        .map_err(|e| OpenFailure::Io(format!("{}: {e}", store_dir.display())))?
        .without_symlinks();
    if store.read_at_most(SHARED_STORE_MARKER, 16).as_deref() == Some(SHARED_STORE_VERSION) {
        Ok(store)
    } else {
        Err(OpenFailure::EscapesRoot(format!(
            "its blob links to {}, which is not a huggingface_hub shared blob store (no {SHARED_STORE_MARKER} holding version 1)",
            store_dir.display()
        )))
    }
}

/// A snapshot file whose blob is in huggingface_hub 2.x's cache-wide Xet store
/// (`utils/_shared_blobs.py`): the snapshot entry is of the hub's form
/// ([`Layout::check_snapshot_entry`]), and the blob it names is itself a link of the form
/// [`shared_store_entry`] reads, into the store beside the repo folder. None when `located` is not
/// of exactly these forms (its own error then stands); otherwise the store entry, opened beneath
/// the store without following any symlink.
fn open_shared_blob(
    root: &Root,
    layout: &Layout,
    rel: &str,
) -> Option<Result<OpenedFile, OpenFailure>> {
    let etag = layout.check_snapshot_entry(root, rel).ok()??;
    let blob_link = root.read_link(&format!("blobs/{etag}")).ok()??;
    let entry = shared_store_entry(&blob_link)?;
    Some(open_shared_store(root.path()).and_then(|store| store.open_file(&entry)))
}

#[derive(Debug, PartialEq, Eq)]
enum LockState {
    Absent,
    /// The file exists and nobody holds it: a download that finished, or died.
    Free,
    /// Another process holds it exclusively (filelock's `flock(LOCK_EX)`): a live download.
    Held,
}

/// Whether someone holds the lock file at `path`, asked without waiting: a shared lock is tried
/// and let go at once. The file is opened without following a symlink and without blocking, and
/// anything but a regular file counts as no lock.
fn lock_state(path: &Path) -> LockState {
    use std::os::fd::AsRawFd;
    let Ok(file) = mlnode_files::open_regular(path, libc::O_NOFOLLOW) else {
        return LockState::Absent;
    };
    // SAFETY: flock on a descriptor this function owns; closing it releases the lock.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        LockState::Free
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK) {
        LockState::Held
    } else {
        LockState::Free
    }
}

#[cfg(test)]
mod download_tests {
    use super::*;

    /// One listing of blobs/ answers every question of a verification: a cache of many missing
    /// files costs one directory read, not one per file (10k+10k listed files took 29.5 s).
    #[test]
    fn blobs_are_listed_once_per_verification() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("blobs")).unwrap();
        let (a, b) = ("a".repeat(64), "b".repeat(40));
        std::fs::write(
            dir.path().join(format!("blobs/{a}.0badf00d.incomplete")),
            b"",
        )
        .unwrap();
        std::fs::write(dir.path().join(format!("blobs/{a}.incomplete")), b"").unwrap();
        std::fs::write(dir.path().join("blobs/notablob.incomplete"), b"").unwrap();
        let root = Root::open(dir.path()).unwrap();
        let partials = PartialBlobs::default();
        assert_eq!(
            partials.of(&root, &a),
            [
                format!("{a}.0badf00d.incomplete"),
                format!("{a}.incomplete")
            ]
        );
        std::fs::write(dir.path().join(format!("blobs/{b}.incomplete")), b"").unwrap();
        assert!(
            partials.of(&root, &b).is_empty(),
            "listed once, at the first question"
        );
        assert_eq!(
            PartialBlobs::default().of(&root, &b),
            [format!("{b}.incomplete")]
        );
        assert_eq!(PartialBlobs::default().all(&root).len(), 2);
    }

    #[test]
    fn only_a_held_lock_is_a_live_download() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc.lock");
        assert_eq!(lock_state(&path), LockState::Absent);
        let holder = std::fs::File::create(&path).unwrap();
        assert_eq!(
            lock_state(&path),
            LockState::Free,
            "left behind by a finished download"
        );
        // SAFETY: flock on a descriptor the test owns.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert_eq!(lock_state(&path), LockState::Held);
        drop(holder);
        assert_eq!(lock_state(&path), LockState::Free);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        assert_eq!(
            lock_state(&path),
            LockState::Absent,
            "a symlink is not followed"
        );
    }
}
