//! The native manifest: `{"revision": "<rev>", "files": {"<path>": "<sha256>" | {"sha256" | "blake3",
//! "size"}}}`.
//!
//! It is what `mlnode-agent manifest` writes and what a release pipeline publishes next to the
//! weights. Parsing is strict: unknown keys, duplicate paths and digests in any spelling but 64
//! lower-case hex digits are errors, because each of them hides a mistake in the pipeline.

use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::de::{self, Deserializer, MapAccess};
use serde::{Deserialize, Serialize};

use super::{
    parse_json_from, ContentDigest, Digest, ExpectedFile, HashAlgorithm, Manifest, ManifestError,
    ManifestFormat, Sha256,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeDocument {
    revision: Option<String>,
    files: NativeFiles,
}

/// The `files` object, read entry by entry into what the verifier keeps: no map of the paths on
/// the side (duplicates are found once the entries are sorted).
struct NativeFiles(Vec<ExpectedFile>);

impl<'de> Deserialize<'de> for NativeFiles {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = NativeFiles;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object of paths and digests")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NativeFiles, A::Error> {
                let mut files = Vec::new();
                while let Some(path) = map.next_key::<String>()? {
                    let entry: NativeEntry = map.next_value()?;
                    files.push(ExpectedFile {
                        path: path.into(),
                        size: entry.size,
                        digest: Digest::Whole(entry.digest),
                    });
                }
                Ok(NativeFiles(files))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A file entry: either its SHA-256 alone, or `{"sha256": ..., "size": ...}`, or
/// `{"blake3": ..., "size": ...}` (`mlnode-agent manifest --hash blake3`).
struct NativeEntry {
    digest: ContentDigest,
    size: Option<u64>,
}

impl<'de> Deserialize<'de> for NativeEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = NativeEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a SHA-256 hex string or an object {\"sha256\" or \"blake3\": ..., \"size\": ...}")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<NativeEntry, E> {
                let sha256 = Sha256::parse_hex(text).map_err(E::custom)?;
                Ok(NativeEntry {
                    digest: ContentDigest::Sha256(sha256),
                    size: None,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NativeEntry, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Detailed {
                    sha256: Option<Sha256>,
                    blake3: Option<String>,
                    size: u64,
                }
                let detailed = Detailed::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let digest = match (detailed.sha256, detailed.blake3) {
                    (Some(sha256), None) => ContentDigest::Sha256(sha256),
                    (None, Some(blake3)) => {
                        ContentDigest::parse_hex(HashAlgorithm::Blake3, &blake3)
                            .map_err(de::Error::custom)?
                    }
                    _ => {
                        return Err(de::Error::custom(
                            "an entry has one digest: \"sha256\" or \"blake3\"",
                        ))
                    }
                };
                Ok(NativeEntry {
                    digest,
                    size: Some(detailed.size),
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Parses a native manifest as it streams in.
pub(super) fn parse(path: &Path, source: impl Read) -> Result<Manifest, ManifestError> {
    let document: NativeDocument =
        parse_json_from(path, serde_json::Deserializer::from_reader(source))?;
    if document.files.0.is_empty() {
        return Err(ManifestError::invalid(
            path,
            "$[\"files\"]",
            "lists no files; an empty manifest would verify anything",
        ));
    }
    if let Some(revision) = &document.revision {
        if revision.trim().is_empty() || revision.trim() != revision {
            return Err(ManifestError::invalid(
                path,
                "$[\"revision\"]",
                format!("{revision:?} is not a revision"),
            ));
        }
    }
    let manifest = Manifest::new(ManifestFormat::Native, document.revision, document.files.0);
    // serde_json keeps the last of two equal keys without a word; in a manifest that would let a
    // second entry silently replace the digest of the first.
    if let Some(twice) = manifest.first_duplicate() {
        return Err(ManifestError::invalid(
            path,
            "$[\"files\"]",
            format!("duplicate key {twice:?}"),
        ));
    }
    Ok(manifest)
}

/// The native manifest as `mlnode-agent manifest` writes it: paths sorted, sizes included so
/// that a truncated file is caught without reading it.
#[derive(Serialize)]
pub struct NativeManifestOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    pub files: std::collections::BTreeMap<String, NativeEntryOut>,
}

#[derive(Serialize)]
pub struct NativeEntryOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    pub size: u64,
}

/// The hashes a native manifest records a file's content with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum NativeHash {
    #[default]
    Sha256,
    /// Several times faster to verify on the same cores.
    Blake3,
}

impl NativeHash {
    pub fn algorithm(self) -> HashAlgorithm {
        match self {
            NativeHash::Sha256 => HashAlgorithm::Sha256,
            NativeHash::Blake3 => HashAlgorithm::Blake3,
        }
    }
}

impl NativeEntryOut {
    /// The entry for a file of `size` bytes whose `hash` digest is `hex`.
    pub fn new(hash: NativeHash, hex: String, size: u64) -> NativeEntryOut {
        let (sha256, blake3) = match hash {
            NativeHash::Sha256 => (Some(hex), None),
            NativeHash::Blake3 => (None, Some(hex)),
        };
        NativeEntryOut {
            sha256,
            blake3,
            size,
        }
    }
}
