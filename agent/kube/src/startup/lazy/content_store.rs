//! The layers of a pod's image, and when each came in, read from containerd's content store
//! (`<root>/io.containerd.content.v1.content/blobs/sha256/<hex>`), which the agent mounts
//! read-only. A lazily pulled image keeps its index, manifest and config there; only its layers'
//! blobs are missing, fetched later by the snapshotter.
//!
//! A blob's modification time is when containerd committed it: its local content store renames
//! the finished ingest into `blobs/` and then sets the file's times to the commit's
//! (containerd v2.4 plugins/content/local/writer.go, `Commit`: `os.Chtimes(target, commitTime,
//! commitTime)`), so a layer's time is the end of its fetch.
//!
//! The kubelet reports a container's image as `imageID`, which containerd's CRI sets to the
//! repository digest (`registry/name@sha256:…`): the image index for a multi-platform or
//! SOCI-converted image, else the manifest. An index is resolved to this node's platform, skipping
//! the SOCI index artifact that `soci convert` adds beside the image (it names linux/amd64 too).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::Digest;

/// Registries refuse manifests over 4 MiB (distribution's and containerd's limit); a larger blob
/// is not one, and is not read.
const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// An index of indexes is allowed by OCI; deeper nesting is not an image anyone pushes.
const MAX_DEPTH: usize = 3;
/// The SOCI index (v2) beside the image in the index `soci convert` writes.
const SOCI_INDEX_ARTIFACT: &str = "application/vnd.amazon.soci.index.v2+json";
const SOCI_IMAGE_MANIFEST_ANNOTATION: &str = "com.amazon.soci.image-manifest-digest";

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error("imageID {image:?} names no digest: {reason}")]
    NoDigest { image: String, reason: String },
    #[error("{digest} is not in containerd's content store ({path}): {reason}")]
    Unreadable {
        digest: Digest,
        path: String,
        reason: String,
    },
    #[error("{digest} is over {MAX_MANIFEST_BYTES} bytes, larger than any manifest; not read")]
    TooLarge { digest: Digest },
    #[error("{digest} is not an image index or manifest: {reason}")]
    NotManifest { digest: Digest, reason: String },
    #[error("image index {digest} has no manifest for {platform}")]
    NoPlatform { digest: Digest, platform: String },
    #[error(
        "{missing} of the image's {layers} layers are not in containerd's content store (none is \
         for an image a snapshotter loads lazily, nor where containerd discards unpacked layers: \
         discard_unpacked_layers)"
    )]
    LayersMissing { missing: usize, layers: usize },
}

impl ImageError {
    /// The kind of failure, to say each once.
    pub fn kind(&self) -> &'static str {
        match self {
            ImageError::NoDigest { .. } => "no digest",
            ImageError::Unreadable { .. } => "unreadable",
            ImageError::TooLarge { .. } => "too large",
            ImageError::NotManifest { .. } => "not a manifest",
            ImageError::NoPlatform { .. } => "no platform",
            ImageError::LayersMissing { .. } => "layers missing",
        }
    }
}

/// When containerd committed an image's blobs, as Unix seconds: the one the kubelet's `imageID`
/// names (an index or a manifest, the first fetched in a pull) and each layer's.
#[derive(Clone, Debug, PartialEq)]
pub struct Commits {
    pub image: f64,
    pub layers: Vec<f64>,
}

/// containerd's content store, at the folder holding `blobs/`.
#[derive(Clone, Debug)]
pub struct ContentStore {
    root: PathBuf,
}

#[derive(Deserialize)]
struct Document {
    manifests: Option<Vec<Entry>>,
    layers: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
struct Entry {
    digest: String,
    platform: Option<Platform>,
    #[serde(rename = "artifactType")]
    artifact_type: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
}

impl ContentStore {
    pub fn new(root: impl Into<PathBuf>) -> ContentStore {
        ContentStore { root: root.into() }
    }

    /// The layers of the image the kubelet reports as `image_id`, in the manifest's order, for
    /// this node's platform.
    pub fn layers_of(&self, image_id: &str) -> Result<Vec<Digest>, ImageError> {
        self.layers_under(top_digest(image_id)?, &node_platform(), MAX_DEPTH)
    }

    /// When the image the kubelet reports as `image_id`, and each of its layers for this node's
    /// platform, came into the store.
    pub fn commits(&self, image_id: &str) -> Result<Commits, ImageError> {
        let image = self.committed(&top_digest(image_id)?)?;
        let layers = self.layers_of(image_id)?;
        let mut times = Vec::with_capacity(layers.len());
        for layer in &layers {
            match self.committed(layer) {
                Ok(time) => times.push(time),
                Err(ImageError::Unreadable { .. }) if !self.blob_path(layer).exists() => {}
                Err(e) => return Err(e),
            }
        }
        if times.len() < layers.len() {
            return Err(ImageError::LayersMissing {
                missing: layers.len() - times.len(),
                layers: layers.len(),
            });
        }
        Ok(Commits {
            image,
            layers: times,
        })
    }

    /// A blob's modification time: when containerd committed it. Only a regular file is one.
    fn committed(&self, digest: &Digest) -> Result<f64, ImageError> {
        let path = self.blob_path(digest);
        let unreadable = |reason: String| ImageError::Unreadable {
            digest: digest.clone(),
            path: path.display().to_string(),
            reason,
        };
        let metadata = std::fs::symlink_metadata(&path).map_err(|e| unreadable(e.to_string()))?;
        if !metadata.is_file() {
            return Err(unreadable("not a regular file".into()));
        }
        let modified = metadata
            .modified()
            .map_err(|e| unreadable(e.to_string()))?
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| unreadable("modified before 1970".into()))?;
        Ok(modified.as_secs_f64())
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    fn layers_under(
        &self,
        digest: Digest,
        platform: &(String, String),
        depth: usize,
    ) -> Result<Vec<Digest>, ImageError> {
        let document: Document =
            serde_json::from_slice(&self.blob(&digest)?).map_err(|e| ImageError::NotManifest {
                digest: digest.clone(),
                reason: e.to_string(),
            })?;
        let not_manifest = |reason: String| ImageError::NotManifest {
            digest: digest.clone(),
            reason,
        };
        match (document.manifests, document.layers) {
            (_, Some(layers)) => layers
                .iter()
                .map(|layer| Digest::parse(&layer.digest).map_err(not_manifest))
                .collect(),
            (Some(entries), None) if depth > 1 => {
                let entry = pick(&entries, platform).ok_or_else(|| ImageError::NoPlatform {
                    digest: digest.clone(),
                    platform: format!("{}/{}", platform.0, platform.1),
                })?;
                let next = Digest::parse(&entry.digest).map_err(not_manifest)?;
                self.layers_under(next, platform, depth - 1)
            }
            (Some(_), None) => Err(not_manifest(format!(
                "indexes nested over {MAX_DEPTH} deep"
            ))),
            (None, None) => Err(not_manifest(
                "neither `manifests` nor `layers` (an image config?)".into(),
            )),
        }
    }

    fn blob(&self, digest: &Digest) -> Result<Vec<u8>, ImageError> {
        let path = self.blob_path(digest);
        let unreadable = |e: std::io::Error| ImageError::Unreadable {
            digest: digest.clone(),
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        // Without blocking and regular files only: a FIFO planted in the store must not hang the
        // startup tracker.
        mlnode_files::read_bounded(&path, MAX_MANIFEST_BYTES).map_err(|e| {
            if e.kind() == std::io::ErrorKind::FileTooLarge {
                ImageError::TooLarge {
                    digest: digest.clone(),
                }
            } else {
                unreadable(e)
            }
        })
    }
}

/// The digest the kubelet's `imageID` (`registry/name@sha256:…`, or the digest alone) names.
fn top_digest(image_id: &str) -> Result<Digest, ImageError> {
    let digest = image_id.rsplit('@').next().unwrap_or(image_id);
    Digest::parse(digest).map_err(|reason| ImageError::NoDigest {
        image: image_id.to_string(),
        reason,
    })
}

/// The index entry for `platform`: the image's, never the SOCI index artifact's; an entry without
/// a platform only where it is the one candidate.
fn pick<'a>(entries: &'a [Entry], platform: &(String, String)) -> Option<&'a Entry> {
    let images: Vec<&Entry> = entries
        .iter()
        .filter(|entry| {
            entry.artifact_type.as_deref() != Some(SOCI_INDEX_ARTIFACT)
                && !entry
                    .annotations
                    .contains_key(SOCI_IMAGE_MANIFEST_ANNOTATION)
        })
        .collect();
    images
        .iter()
        .find(|entry| {
            entry
                .platform
                .as_ref()
                .is_some_and(|p| p.os == platform.0 && p.architecture == platform.1)
        })
        .or_else(|| match images.as_slice() {
            [only] if only.platform.is_none() => Some(only),
            _ => None,
        })
        .copied()
}

/// This node's platform in OCI's (Go's) names.
fn node_platform() -> (String, String) {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    (std::env::consts::OS.to_string(), architecture.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The content store of the tests' node as containerd left it for a lazily pulled image
    /// (tests/fixtures/SOURCES).
    fn fixture_store() -> (tempfile::TempDir, ContentStore) {
        let dir = tempfile::tempdir().unwrap();
        let blobs = dir.path().join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/soci/blobs");
        for entry in std::fs::read_dir(fixtures).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), blobs.join(entry.file_name())).unwrap();
        }
        let store = ContentStore::new(dir.path());
        (dir, store)
    }

    const INDEX: &str = "sha256:85acc76c69b63036bc0272ec39686538cb14c313f705c3af0ddb71849b241ab4";

    #[test]
    fn a_soci_converted_images_index_resolves_to_the_images_layers_not_the_soci_index() {
        let (_dir, store) = fixture_store();
        let image_id = format!("127.0.0.1:5000/workload@{INDEX}");
        let platform = ("linux".to_string(), "amd64".to_string());
        let index = Digest::parse(INDEX).unwrap();
        let layers: Vec<String> = store
            .layers_under(index.clone(), &platform, MAX_DEPTH)
            .unwrap()
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(
            layers,
            [
                "sha256:1d4d5568753473f6161e173a9c03d22cd3fa159c471630a69959981818539736",
                "sha256:507a7f7c82543fde896e979994ff940967d4f612a1bbbeca6a9ee07344d5155c"
            ]
        );
        if node_platform() == platform {
            assert_eq!(
                store.layers_of(&image_id).unwrap().len(),
                2,
                "by the kubelet's imageID"
            );
        }
        let arm = ("linux".to_string(), "arm64".to_string());
        assert_eq!(
            store.layers_under(index, &arm, MAX_DEPTH).unwrap_err(),
            ImageError::NoPlatform {
                digest: Digest::parse(INDEX).unwrap(),
                platform: "linux/arm64".into()
            }
        );
    }

    #[test]
    fn a_docker_schema_2_manifest_names_its_layers() {
        let (_dir, store) = fixture_store();
        let layers = store
            .layers_of("sha256:10a7fcaa578901425a44d4c62920ffced4d5759b48f7249b29b2a9530ac6afa9")
            .unwrap();
        assert_eq!(
            layers[0].as_str(),
            "sha256:0bfaf3a58a23eef7d3757ecda291f537e899a394f86ad6cb685c9a7ce68070fb"
        );
    }

    #[test]
    fn what_is_not_an_images_manifest_is_refused_with_the_reason() {
        let (dir, store) = fixture_store();
        let config = "sha256:568832eee098d570989c4d0a6577dcddd75a23789814acb626f8aec33050c327";
        assert!(store
            .layers_of(config)
            .unwrap_err()
            .to_string()
            .contains("neither `manifests` nor `layers`"));
        let absent = format!("sha256:{}", "0".repeat(64));
        assert!(matches!(
            store.layers_of(&absent),
            Err(ImageError::Unreadable { .. })
        ));
        for image in ["", "nginx:1.25", "repo@sha256:../../etc/passwd"] {
            assert!(
                matches!(store.layers_of(image), Err(ImageError::NoDigest { .. })),
                "{image}"
            );
        }
        let big = format!("sha256:{}", "1".repeat(64));
        let file =
            std::fs::File::create(dir.path().join("blobs/sha256").join("1".repeat(64))).unwrap();
        file.set_len(MAX_MANIFEST_BYTES + 1).unwrap();
        assert!(matches!(
            store.layers_of(&big),
            Err(ImageError::TooLarge { .. })
        ));
        // A FIFO where a blob should be: refused at once, never waited on for a writer.
        let fifo = format!("sha256:{}", "3".repeat(64));
        let path = dir.path().join("blobs/sha256").join("3".repeat(64));
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let refused = store.layers_of(&fifo).unwrap_err().to_string();
        assert!(refused.contains("a FIFO"), "{refused}");
        let looping = format!("sha256:{}", "2".repeat(64));
        std::fs::write(
            dir.path().join("blobs/sha256").join("2".repeat(64)),
            format!("{{\"manifests\":[{{\"digest\":\"{looping}\"}}]}}"),
        )
        .unwrap();
        assert!(store
            .layers_of(&looping)
            .unwrap_err()
            .to_string()
            .contains("nested over"));
    }

    #[test]
    fn a_layers_commit_is_its_blobs_modification_time_and_a_missing_layer_is_named() {
        let (dir, store) = fixture_store();
        // The node's base image as containerd left it: its manifest, not its layer.
        let manifest = "sha256:10a7fcaa578901425a44d4c62920ffced4d5759b48f7249b29b2a9530ac6afa9";
        assert_eq!(
            store.commits(manifest).unwrap_err(),
            ImageError::LayersMissing {
                missing: 1,
                layers: 1
            }
        );
        // The layer committed, its times set as containerd's Commit sets them.
        let layer = dir
            .path()
            .join("blobs/sha256/0bfaf3a58a23eef7d3757ecda291f537e899a394f86ad6cb685c9a7ce68070fb");
        let file = std::fs::File::create(&layer).unwrap();
        let committed =
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_796_472_012_345_678_901);
        file.set_modified(committed).unwrap();
        let commits = store.commits(manifest).unwrap();
        assert!(
            (commits.layers[0] - 1_796_472_012.345_678_9).abs() < 1e-6,
            "{commits:?}"
        );
        assert!(commits.image > 0.0);
        // A layer that is not a file: unreadable, named.
        std::fs::remove_file(&layer).unwrap();
        std::fs::create_dir(&layer).unwrap();
        let error = store.commits(manifest).unwrap_err().to_string();
        assert!(
            error.contains("not a regular file") && error.contains("0bfaf3a5"),
            "{error}"
        );
    }
}
