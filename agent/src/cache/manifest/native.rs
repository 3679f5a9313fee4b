//! The native manifest: `{"revision": "<rev>", "files": {"<path>": "<sha256>" | {"sha256", "size"}}}`.
//!
//! It is what `mlnode-agent manifest` writes and what a release pipeline publishes next to the
//! weights. Parsing is strict: unknown keys, duplicate paths and digests in any spelling but 64
//! lower-case hex digits are errors, because each of them hides a mistake in the pipeline.

use std::fmt;
use std::path::Path;

use serde::de::{self, Deserializer, MapAccess};
use serde::{Deserialize, Serialize};

use super::{
    parse_json, Digest, ExpectedFile, Manifest, ManifestError, ManifestFormat, Sha256, UniqueMap,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeDocument {
    revision: Option<String>,
    files: UniqueMap<NativeEntry>,
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

pub(super) fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let document: NativeDocument = parse_json(path, bytes)?;
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
    let files = document
        .files
        .0
        .into_iter()
        .map(|(path, entry)| ExpectedFile {
            path,
            size: entry.size,
            digest: Digest::Whole(entry.sha256),
        })
        .collect();
    Ok(Manifest::new(
        ManifestFormat::Native,
        document.revision,
        files,
    ))
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
