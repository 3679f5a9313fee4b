//! Which work a file event calls for: the pure part of continuous verification, so that it is
//! tested without a file system watcher.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::event::{AccessKind, AccessMode, EventKind, MetadataKind, ModifyKind};
use notify::Event;

use super::layout;
use super::manifest::{Digest, Manifest};

/// What an event asks of the monitor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Verify everything: the watch lost events, or the revision may have moved.
    Full,
    /// The manifest's directory changed (a ConfigMap update swaps its `..data` symlink).
    ReloadManifest,
    /// Re-verify these manifest files.
    Files(HashSet<String>),
    /// Something that is not a manifest file appeared or went: list the extras again.
    Listing,
    /// The permissions or ownership of these manifest files (or a directory above them) changed:
    /// the ones whose last verification could not open or read them deserve another look.
    Access(HashSet<String>),
}

/// Maps event paths to the model's manifest files.
pub struct Router {
    root: PathBuf,
    /// ROOT is a single-file model: the watch is on the file itself.
    single_file: bool,
    manifest_dir: PathBuf,
    /// `Some(commit)` for a Hugging Face cache: files live under `snapshots/<commit>/`.
    hf_commit: Option<String>,
    /// The manifest in force: its sorted files tell which paths are the model's.
    manifest: Arc<Manifest>,
    /// Hub blob name → the manifest files whose snapshot entries point at it.
    blobs: HashMap<String, Vec<String>>,
    /// huggingface_hub 2.x's cache-wide Xet store (watched too), and its entries (`<2 hex>/<hash>`)
    /// → the manifest files whose blobs link there.
    shared_store: Option<PathBuf>,
    store_entries: HashMap<String, Vec<String>>,
}

/// Suffixes of the partial and lock files downloaders write beside (or for) the real file.
const DOWNLOAD_SUFFIXES: [&str; 3] = [".incomplete", ".lock", ".metadata"];
const LOCAL_DIR_METADATA: &str = ".cache/huggingface/download/";

impl Router {
    /// `root` and `manifest_dir` must be canonical, as the watcher reports paths under what it
    /// was asked to watch.
    pub fn new(
        root: &Path,
        manifest_dir: &Path,
        hf_commit: Option<String>,
        manifest: Arc<Manifest>,
    ) -> Router {
        let mut blobs: HashMap<String, Vec<String>> = HashMap::new();
        // Blob names matter only in a hub cache, where snapshot entries point at them; a plain
        // directory's events name the files themselves (and a map per file would cost ~200 bytes
        // each on a million-file cache).
        for file in manifest.files.iter().filter(|_| hf_commit.is_some()) {
            if let Digest::Whole(sha256) = &file.digest {
                blobs
                    .entry(sha256.to_hex())
                    .or_default()
                    .push(file.path.to_string());
            }
            if let Some(commit) = &hf_commit {
                let entry = root.join("snapshots").join(commit).join(&*file.path);
                if let Some(blob) = std::fs::read_link(entry)
                    .ok()
                    .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
                {
                    let paths = blobs.entry(blob).or_default();
                    if !paths.iter().any(|p| **p == *file.path) {
                        paths.push(file.path.to_string());
                    }
                }
            }
        }
        let shared_store = hf_commit
            .as_ref()
            .and_then(|_| layout::shared_store_of(root))
            .and_then(|store| std::fs::canonicalize(store).ok());
        let mut store_entries: HashMap<String, Vec<String>> = HashMap::new();
        if shared_store.is_some() {
            for (blob, paths) in &blobs {
                let link = std::fs::read_link(root.join("blobs").join(blob));
                if let Some(entry) = link
                    .ok()
                    .and_then(|l| layout::shared_store_entry(l.as_os_str()))
                {
                    store_entries
                        .entry(entry)
                        .or_default()
                        .extend(paths.iter().cloned());
                }
            }
        }
        Router {
            root: root.to_path_buf(),
            single_file: root.is_file(),
            manifest_dir: manifest_dir.to_path_buf(),
            hf_commit,
            manifest,
            blobs,
            shared_store,
            store_entries,
        }
    }

    pub fn route(&self, event: &Event) -> Vec<Work> {
        if event.need_rescan() {
            return vec![Work::Full];
        }
        // chmod, chown (inotify's IN_ATTRIB, which notify reports as `Any`): content is the same,
        // access may not be. A timestamp alone changes neither.
        if matches!(
            event.kind,
            EventKind::Modify(ModifyKind::Metadata(
                MetadataKind::Any | MetadataKind::Permissions | MetadataKind::Ownership
            ))
        ) {
            return event
                .paths
                .iter()
                .filter_map(|path| match self.route_path(path)? {
                    Work::Files(files) => Some(Work::Access(files)),
                    _ => None,
                })
                .collect();
        }
        if !changes_content(&event.kind) {
            return Vec::new();
        }
        event
            .paths
            .iter()
            .filter_map(|path| self.route_path(path))
            .collect()
    }

    fn route_path(&self, path: &Path) -> Option<Work> {
        // A single-file model: any change to the file is a change to the whole model.
        if self.single_file && path == self.root {
            return Some(Work::Full);
        }
        if let Ok(rel) = path.strip_prefix(&self.root) {
            let rel = rel.to_string_lossy();
            return match &self.hf_commit {
                Some(commit) => self.route_hf(&rel, commit),
                None => Some(self.route_model_path(&rel)),
            };
        }
        if let Some(entry) = self
            .shared_store
            .as_ref()
            .and_then(|store| path.strip_prefix(store).ok())
        {
            // Other repos' entries, and the store's own lock and reference files, are not ours.
            return self
                .store_entries
                .get(entry.to_string_lossy().as_ref())
                .map(|paths| Work::Files(paths.iter().cloned().collect()));
        }
        (path.parent() == Some(self.manifest_dir.as_path())).then_some(Work::ReloadManifest)
    }

    fn route_hf(&self, rel: &str, commit: &str) -> Option<Work> {
        if rel == "refs" || rel.starts_with("refs/") {
            return Some(Work::Full);
        }
        if let Some(name) = rel.strip_prefix("blobs/") {
            let blob = strip_download_suffix(name);
            return Some(match self.blobs.get(blob) {
                Some(paths) => Work::Files(paths.iter().cloned().collect()),
                None => Work::Listing,
            });
        }
        let snapshot = format!("snapshots/{commit}");
        if rel == snapshot {
            return Some(Work::Full);
        }
        rel.strip_prefix(&snapshot)?
            .strip_prefix('/')
            .map(|inner| self.route_model_path(inner))
    }

    /// A path relative to the model directory (ROOT, or the snapshot).
    fn route_model_path(&self, rel: &str) -> Work {
        let named = rel.strip_prefix(LOCAL_DIR_METADATA).unwrap_or(rel);
        let candidate = strip_download_suffix(named);
        if self.manifest.lists(candidate) {
            return Work::Files(HashSet::from([candidate.to_string()]));
        }
        // A directory that was renamed or removed takes its files with it.
        let under: HashSet<String> = self
            .manifest
            .under(rel)
            .iter()
            .map(|f| f.path.to_string())
            .collect();
        if under.is_empty() {
            Work::Listing
        } else {
            Work::Files(under)
        }
    }
}

fn strip_download_suffix(name: &str) -> &str {
    DOWNLOAD_SUFFIXES
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// What an event asks before the first verification has mapped files to events (no [`Router`]
/// yet): a lost event or any change in the model means the verification must look at everything;
/// a change in the manifest's folder outside `root` (where other files may live: a ConfigMap's
/// `..data`, another model's manifest) only a reload, which verifies everything only if the
/// manifest changed. Without a watched `root`, every change is the model's.
pub fn before_first_verification(
    event: &Event,
    root: Option<&Path>,
    manifest_dir: &Path,
) -> Option<Work> {
    if event.need_rescan() {
        return Some(Work::Full);
    }
    if !changes_content(&event.kind) {
        return None;
    }
    let beside_the_model = |path: &PathBuf| {
        root.is_some_and(|root| path.parent() == Some(manifest_dir) && !path.starts_with(root))
    };
    Some(if event.paths.iter().all(beside_the_model) {
        Work::ReloadManifest
    } else {
        Work::Full
    })
}

/// Opens and reads (our own hashing among them) change nothing; metadata changes such as atime
/// do not change content. What remains can.
fn changes_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{ContentDigest, ExpectedFile, ManifestFormat, Sha256};
    use notify::event::{CreateKind, Flag, RemoveKind};

    fn manifest(paths: &[&str]) -> Manifest {
        Manifest::new(
            ManifestFormat::Native,
            None,
            paths
                .iter()
                .enumerate()
                .map(|(i, p)| ExpectedFile {
                    path: (*p).into(),
                    size: None,
                    digest: Digest::Whole(ContentDigest::Sha256(Sha256([i as u8; 32]))),
                })
                .collect(),
        )
    }

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    fn files(paths: &[&str]) -> Vec<Work> {
        vec![Work::Files(paths.iter().map(|p| p.to_string()).collect())]
    }

    fn plain() -> Router {
        Router::new(
            Path::new("/models/llama"),
            Path::new("/etc/mlnode"),
            None,
            Arc::new(manifest(&[
                "config.json",
                "weights/a.safetensors",
                "weights/b.safetensors",
            ])),
        )
    }

    #[test]
    fn a_written_file_reverifies_that_file_only() {
        let router = plain();
        let modify = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        assert_eq!(
            router.route(&event(modify, "/models/llama/config.json")),
            files(&["config.json"])
        );
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        assert_eq!(
            router.route(&event(closed, "/models/llama/weights/a.safetensors")),
            files(&["weights/a.safetensors"])
        );
    }

    #[test]
    fn reads_and_metadata_changes_are_ignored() {
        let router = plain();
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Read)),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Modify(ModifyKind::Metadata(
                notify::event::MetadataKind::AccessTime,
            )),
        ] {
            assert!(
                router
                    .route(&event(kind, "/models/llama/config.json"))
                    .is_empty(),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_removed_directory_reverifies_the_files_under_it() {
        let router = plain();
        let work = router.route(&event(
            EventKind::Remove(RemoveKind::Folder),
            "/models/llama/weights",
        ));
        assert_eq!(
            work,
            files(&["weights/a.safetensors", "weights/b.safetensors"])
        );
    }

    #[test]
    fn download_markers_point_at_their_file_and_strangers_at_the_listing() {
        let router = plain();
        let create = EventKind::Create(CreateKind::File);
        assert_eq!(
            router.route(&event(create, "/models/llama/config.json.incomplete")),
            files(&["config.json"])
        );
        assert_eq!(
            router.route(&event(
                create,
                "/models/llama/.cache/huggingface/download/weights/b.safetensors.lock"
            )),
            files(&["weights/b.safetensors"])
        );
        assert_eq!(
            router.route(&event(create, "/models/llama/stray.bin")),
            vec![Work::Listing]
        );
    }

    #[test]
    fn manifest_directory_changes_reload_the_manifest() {
        let router = plain();
        let create = EventKind::Create(CreateKind::Any);
        assert_eq!(
            router.route(&event(create, "/etc/mlnode/..data")),
            vec![Work::ReloadManifest]
        );
        assert!(router.route(&event(create, "/etc/other/x.json")).is_empty());
    }

    /// Before the first verification: the manifest's folder is not the model, unless the model is
    /// that folder.
    #[test]
    fn before_the_first_verification_only_the_model_asks_for_everything() {
        let create = EventKind::Create(CreateKind::Any);
        let (root, manifests) = (Some(Path::new("/models/llama")), Path::new("/etc/mlnode"));
        let beside = event(create, "/etc/mlnode/other-model.json");
        assert_eq!(
            before_first_verification(&beside, root, manifests),
            Some(Work::ReloadManifest)
        );
        let in_model = event(create, "/models/llama/model.safetensors");
        assert_eq!(
            before_first_verification(&in_model, root, manifests),
            Some(Work::Full)
        );
        // The manifest kept in the model's own folder: a file there is the model's.
        assert_eq!(
            before_first_verification(&in_model, root, root.unwrap()),
            Some(Work::Full)
        );
        let opened = event(
            EventKind::Access(AccessKind::Open(AccessMode::Read)),
            "/etc/mlnode/x",
        );
        assert_eq!(before_first_verification(&opened, root, manifests), None);
        assert_eq!(
            before_first_verification(&beside, None, manifests),
            Some(Work::Full),
            "nothing watched: every change is the model's"
        );
        let overflow = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        assert_eq!(
            before_first_verification(&overflow, root, manifests),
            Some(Work::Full)
        );
    }

    #[test]
    fn queue_overflow_forces_a_full_rescan() {
        let overflow = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        assert_eq!(plain().route(&overflow), vec![Work::Full]);
    }

    #[test]
    fn hub_cache_blob_and_ref_events() {
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let m = manifest(&["config.json", "model.safetensors"]);
        let blob = Sha256([1; 32]).to_hex(); // model.safetensors, stored under its SHA-256
        let router = Router::new(
            Path::new("/hub/models--a--b"),
            Path::new("/etc/mlnode"),
            Some(commit.into()),
            Arc::new(m),
        );
        let create = EventKind::Create(CreateKind::File);
        assert_eq!(
            router.route(&event(
                create,
                &format!("/hub/models--a--b/blobs/{blob}.incomplete")
            )),
            files(&["model.safetensors"])
        );
        assert_eq!(
            router.route(&event(create, "/hub/models--a--b/blobs/ffff")),
            vec![Work::Listing]
        );
        assert_eq!(
            router.route(&event(create, "/hub/models--a--b/refs/main")),
            vec![Work::Full]
        );
        assert_eq!(
            router.route(&event(
                create,
                &format!("/hub/models--a--b/snapshots/{commit}/config.json")
            )),
            files(&["config.json"])
        );
        assert!(router
            .route(&event(
                create,
                "/hub/models--a--b/snapshots/other/config.json"
            ))
            .is_empty());
    }

    #[test]
    fn a_permission_change_asks_for_another_look_at_the_files_below_it() {
        let router = plain();
        let chmod = |path: &str| {
            event(
                EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
                path,
            )
        };
        assert_eq!(
            router.route(&chmod("/models/llama/config.json")),
            vec![Work::Access(HashSet::from(["config.json".to_string()]))]
        );
        assert_eq!(
            router.route(&chmod("/models/llama/stray.txt")),
            Vec::new(),
            "not a manifest file"
        );
    }
}
