//! The native manifest: `{"revision": "<rev>", "files": {"<path>": "<sha256>" | {"sha256", "size"}}}`.
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
    parse_json_from, Digest, ExpectedFile, Manifest, ManifestError, ManifestFormat, Sha256,
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
                        digest: Digest::Whole(entry.sha256),
                    });
                }
                Ok(NativeFiles(files))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A file entry: either the digest alone or `{"sha256", "size"}`.
struct NativeEntry {
    sha256: Sha256,
    size: Option<u64>,
}

impl<'de> Deserialize<'de> for NativeEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = NativeEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a SHA-256 hex string or an object {\"sha256\": ..., \"size\": ...}")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<NativeEntry, E> {
                let sha256 = Sha256::parse_hex(text).map_err(E::custom)?;
                Ok(NativeEntry { sha256, size: None })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<NativeEntry, A::Error> {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Detailed {
                    sha256: Sha256,
                    size: u64,
                }
                let detailed = Detailed::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(NativeEntry {
                    sha256: detailed.sha256,
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
    pub sha256: String,
    pub size: u64,
}
