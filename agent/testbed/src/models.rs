//! Model caches on disk as the agent finds them on a node: a plain model folder with its native
//! manifest, a Hugging Face hub cache (laid out by huggingface_hub's own code where the layout is
//! the point, tests/hf_cache), and the files' ages the agent's trust at a restart depends on.

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::{repo_root, wait_until};

/// The SHA-256 of `bytes`, in lower-case hex, as manifests write it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Deterministic, incompressible-looking content of `len` bytes.
pub fn content(seed: u8, len: usize) -> Vec<u8> {
    let mut state = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A plain model directory and the native manifest that describes it.
pub struct PlainModel {
    pub dir: tempfile::TempDir,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl PlainModel {
    /// config.json, tokenizer.json and two weight shards in a subdirectory-free layout, plus one
    /// nested file.
    pub fn new() -> PlainModel {
        let dir = tempfile::tempdir().unwrap();
        let mut files = BTreeMap::new();
        files.insert(
            "config.json".to_string(),
            br#"{"model_type": "llama"}"#.to_vec(),
        );
        files.insert("tokenizer/tokenizer.json".to_string(), content(1, 5000));
        files.insert(
            "model-00001-of-00002.safetensors".to_string(),
            content(2, 300_000),
        );
        files.insert(
            "model-00002-of-00002.safetensors".to_string(),
            content(3, 200_000),
        );
        for (path, bytes) in &files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, bytes).unwrap();
        }
        PlainModel { dir, files }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The native manifest JSON for the files, with or without sizes.
    pub fn manifest_json(&self, revision: &str, with_sizes: bool) -> String {
        let entries: BTreeMap<&str, serde_json::Value> = self
            .files
            .iter()
            .map(|(path, bytes)| {
                let value = if with_sizes {
                    serde_json::json!({"sha256": sha256_hex(bytes), "size": bytes.len()})
                } else {
                    serde_json::json!(sha256_hex(bytes))
                };
                (path.as_str(), value)
            })
            .collect();
        serde_json::json!({"revision": revision, "files": entries}).to_string()
    }
}

/// The revision an [`HfCache`]'s `main` points at.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// Another revision, for a cache at the wrong one.
pub const OTHER_COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

/// A Hugging Face hub cache: `<hub>/models--org--tiny/{blobs,refs,snapshots}`, laid out as
/// huggingface_hub writes it (LFS files stored under their SHA-256, snapshot entries relative
/// symlinks into blobs/).
pub struct HfCache {
    pub hub: tempfile::TempDir,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl HfCache {
    /// A hub cache of one repo at [`COMMIT`], its blobs and snapshot links as the hub writes them.
    pub fn new() -> HfCache {
        let hub = tempfile::tempdir().unwrap();
        let mut files = BTreeMap::new();
        files.insert(
            "config.json".to_string(),
            br#"{"architectures": ["LlamaForCausalLM"]}"#.to_vec(),
        );
        files.insert("model.safetensors".to_string(), content(7, 400_000));
        files.insert(
            "sub/extra.json".to_string(),
            br#"{"nested": true}"#.to_vec(),
        );
        let cache = HfCache { hub, files };
        std::fs::create_dir_all(cache.root().join("blobs")).unwrap();
        std::fs::create_dir_all(cache.root().join("refs")).unwrap();
        std::fs::write(cache.root().join("refs/main"), COMMIT).unwrap();
        for (path, bytes) in cache.files.clone() {
            cache.add_entry(COMMIT, &path, &bytes);
        }
        cache
    }

    pub fn root(&self) -> PathBuf {
        self.hub.path().join("models--org--tiny")
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.root().join("snapshots").join(commit)
    }

    /// Writes the blob and the snapshot symlink the way the hub does.
    pub fn add_entry(&self, commit: &str, path: &str, bytes: &[u8]) {
        let blob = sha256_hex(bytes);
        std::fs::write(self.root().join("blobs").join(&blob), bytes).unwrap();
        let entry = self.snapshot(commit).join(path);
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        let depth = path.matches('/').count() + 2;
        symlink(format!("{}blobs/{blob}", "../".repeat(depth)), entry).unwrap();
    }

    /// A file the hub keeps in git rather than LFS: its blob is named by its git blob id (SHA-1 of
    /// `blob <size>\0` and the content).
    pub fn add_git_entry(&self, commit: &str, path: &str, bytes: &[u8]) {
        use sha1::Digest as _;
        let mut sha1 = sha1::Sha1::new();
        sha1.update(format!("blob {}\0", bytes.len()).as_bytes());
        sha1.update(bytes);
        let blob = hex::encode(sha1.finalize());
        std::fs::write(self.root().join("blobs").join(&blob), bytes).unwrap();
        let entry = self.snapshot(commit).join(path);
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        let depth = path.matches('/').count() + 2;
        symlink(format!("{}blobs/{blob}", "../".repeat(depth)), entry).unwrap();
    }

    pub fn manifest_json(&self, revision: &str) -> String {
        let entries: BTreeMap<&str, String> = self
            .files
            .iter()
            .map(|(p, b)| (p.as_str(), sha256_hex(b)))
            .collect();
        serde_json::json!({"revision": revision, "files": entries}).to_string()
    }
}

/// A cache laid out by huggingface_hub 2.x's own code (tests/hf_cache/shared_store.py): two repos
/// whose weights are one entry of the cache-wide Xet store, each repo's blob a link into it.
pub struct SharedStoreCache {
    pub dir: tempfile::TempDir,
    pub weights: Vec<u8>,
}

/// The revision a [`SharedStoreCache`]'s repos point at.
pub const SHARED_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl SharedStoreCache {
    /// Two repos whose files are in the shared xet store, laid out by huggingface_hub's own code.
    pub fn new() -> SharedStoreCache {
        let dir = tempfile::tempdir().unwrap();
        let weights = content(11, 300_000);
        let sources = dir.path().join("sources");
        std::fs::create_dir_all(&sources).unwrap();
        std::fs::write(sources.join("weights"), &weights).unwrap();
        std::fs::write(sources.join("config"), b"{\"model_type\": \"llama\"}").unwrap();
        let list = sources.join("list");
        std::fs::write(
            &list,
            format!(
                "model.safetensors {}\nsub/config.json {}\n",
                sources.join("weights").display(),
                sources.join("config").display()
            ),
        )
        .unwrap();
        let cache = dir.path().join("hub");
        run_python_helper(
            "hf_cache/shared_store.py",
            &[
                cache.as_os_str(),
                SHARED_COMMIT.as_ref(),
                list.as_os_str(),
                "org/llama".as_ref(),
                "org/llama-copy".as_ref(),
            ],
        );
        SharedStoreCache { dir, weights }
    }

    pub fn repo(&self, name: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("hub")
            .join(format!("models--org--{name}"))
    }

    /// Flips a byte of the weights' store entry (huggingface_hub leaves it read-only) and returns
    /// its path.
    pub fn corrupt_store_entry(&self) -> PathBuf {
        let entry = self.store_entry();
        let mut permissions = std::fs::metadata(&entry).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o600);
        std::fs::set_permissions(&entry, permissions).unwrap();
        let mut bytes = self.weights.clone();
        bytes[1234] ^= 1;
        std::fs::write(&entry, &bytes).unwrap();
        entry
    }

    /// The store entry of the weights (the target of the repo blob's link).
    pub fn store_entry(&self) -> std::path::PathBuf {
        let blob = self
            .repo("llama")
            .join("blobs")
            .join(sha256_hex(&self.weights));
        let target = std::fs::read_link(&blob).unwrap();
        assert!(target.starts_with("../../blobs/"), "{target:?}");
        blob.parent().unwrap().join(target)
    }
}

/// Runs one of the tests' Python helpers, `tests/<script>`, which must succeed.
pub fn run_python_helper(script: &str, args: &[&std::ffi::OsStr]) {
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("tests").join(script))
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "tests/{script} failed (scripts/test.sh installs what it needs): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Until every file under `root` last changed more than the racy window (2 s) ago: a file changed
/// later than that before its hash is never trusted unchanged at a restart
/// (`mlnode_verify::fingerprint`), so a test of trust starts from files older than that.
pub fn wait_until_settled(root: &Path) {
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    let newest = walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::symlink_metadata(e.path()).ok())
        .map(|m| m.ctime().max(m.mtime()))
        .max()
        .unwrap_or(0);
    wait_until(
        "files older than the racy window",
        Duration::from_secs(10),
        || {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            (now > newest + 2).then_some(()).ok_or_else(String::new)
        },
    );
}

impl Default for PlainModel {
    fn default() -> PlainModel {
        PlainModel::new()
    }
}

impl Default for HfCache {
    fn default() -> HfCache {
        HfCache::new()
    }
}

impl Default for SharedStoreCache {
    fn default() -> SharedStoreCache {
        SharedStoreCache::new()
    }
}
