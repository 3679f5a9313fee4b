//! The in-toto statement model_signing signs: its subject, and the predicate that lists every file
//! (`files` serialization) or every byte range of every file (`shards`, resource names
//! `path:start:end`) with its digest. The subject must be the SHA-256 of the resource digests in
//! order, as model_signing's own verifier checks, before any digest becomes a [`Manifest`].

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use sha2::Digest as _;

use crate::manifest::{
    parse_json, ContentDigest, Digest, ExpectedFile, HashAlgorithm, Manifest, ManifestError,
    ManifestFormat, Sha256, Shard,
};

const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// What model_signing before 1.0 (0.2.x) signed: a digest list in another layout, signed over a
/// pre-authentication encoding with a known bug (its own verifier keeps a compatibility path).
const PREDICATE_TYPE_V0_2: &str = "https://model_signing/Digests/v0.1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Statement {
    #[serde(rename = "_type")]
    pub(super) statement_type: String,
    pub(super) subject: Vec<Subject>,
    pub(super) predicate_type: String,
    pub(super) predicate: Predicate,
}

#[derive(Deserialize)]
pub(super) struct Subject {
    pub(super) digest: SubjectDigest,
}

#[derive(Deserialize)]
pub(super) struct SubjectDigest {
    pub(super) sha256: Sha256,
}

#[derive(Deserialize)]
pub(super) struct Predicate {
    pub(super) serialization: Serialization,
    pub(super) resources: Vec<Resource>,
}

#[derive(Deserialize)]
pub(super) struct Serialization {
    pub(super) method: String,
    /// Paths (relative to the model, files or folders) the signer left out; model_signing's
    /// verifier ignores them too, and so do we when listing extras.
    #[serde(default)]
    pub(super) ignore_paths: Vec<String>,
    /// Whether the signer let symlinks be followed; model_signing's verifier refuses them otherwise.
    #[serde(default)]
    pub(super) allow_symlinks: bool,
}

#[derive(Deserialize)]
pub(super) struct Resource {
    pub(super) name: String,
    pub(super) algorithm: String,
    /// Hex, parsed once the algorithm is known to be one we verify (a BLAKE2 digest is longer).
    pub(super) digest: String,
}

/// Just the statement's predicate type, read before the predicate is: an older model_signing's
/// predicate has another shape, and deserves "unsupported version" rather than a field error.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatementKind {
    predicate_type: Option<String>,
}

pub(super) fn parse(path: &Path, payload: &[u8]) -> Result<Statement, ManifestError> {
    let in_payload = |e| match e {
        ManifestError::Invalid { path, at, reason } => ManifestError::Invalid {
            path,
            at: format!("$[\"dsseEnvelope\"][\"payload\"] (decoded) {at}"),
            reason,
        },
        other => other,
    };
    let kind: StatementKind = parse_json(path, payload).map_err(in_payload)?;
    if kind.predicate_type.as_deref() == Some(PREDICATE_TYPE_V0_2) {
        return Err(ManifestError::invalid(
            path,
            "$[\"dsseEnvelope\"][\"payload\"] (decoded) $.predicateType",
            format!("unsupported format version: {PREDICATE_TYPE_V0_2:?} is model_signing 0.2's; sign the model again with model_signing 1.x (predicate {PREDICATE_TYPE:?})"),
        ));
    }
    parse_json(path, payload).map_err(in_payload)
}

pub(super) fn to_manifest(path: &Path, statement: Statement) -> Result<Manifest, ManifestError> {
    let at_payload = |field: &str| format!("$[\"dsseEnvelope\"][\"payload\"] (decoded) $.{field}");
    if statement.statement_type != STATEMENT_TYPE {
        return Err(ManifestError::invalid(
            path,
            at_payload("_type"),
            format!(
                "expected {STATEMENT_TYPE:?}, found {:?}",
                statement.statement_type
            ),
        ));
    }
    if statement.predicate_type != PREDICATE_TYPE {
        return Err(ManifestError::invalid(
            path,
            at_payload("predicateType"),
            format!(
                "expected {PREDICATE_TYPE:?} (model_signing 1.x), found {:?}",
                statement.predicate_type
            ),
        ));
    }
    let [subject] = statement.subject.as_slice() else {
        return Err(ManifestError::invalid(
            path,
            at_payload("subject"),
            format!(
                "expected exactly one subject, found {}",
                statement.subject.len()
            ),
        ));
    };
    let resources = &statement.predicate.resources;
    let serialization = &statement.predicate.serialization;
    let method = serialization.method.as_str();
    if method != "files" && method != "shards" {
        return Err(ManifestError::invalid(
            path,
            at_payload("predicate.serialization.method"),
            format!("unknown serialization {method:?}; expected \"files\" or \"shards\""),
        ));
    }
    let digests = resources
        .iter()
        .enumerate()
        .map(|(index, resource)| {
            // `sha256`, `blake3`, `blake2b` for files; `<that>-sharded-<shard size>` for shards.
            let name = match method {
                "files" => Some(resource.algorithm.as_str()),
                _ => resource
                    .algorithm
                    .split_once("-sharded-")
                    .filter(|(_, size)| size.parse::<u64>().is_ok())
                    .map(|(name, _)| name),
            };
            let Some(algorithm) = name.and_then(HashAlgorithm::from_name) else {
                return Err(unsupported_algorithm(path, index, &resource.algorithm));
            };
            ContentDigest::parse_hex(algorithm, &resource.digest).map_err(|reason| {
                ManifestError::invalid(
                    path,
                    at_payload(&format!("predicate.resources[{index}].digest")),
                    reason,
                )
            })
        })
        .collect::<Result<Vec<ContentDigest>, ManifestError>>()?;
    // The subject is SHA-256 over the resources' digests in order, whatever hashed the files
    // (model_signing's `_manifest_to_statement`).
    let mut root = sha2::Sha256::new();
    for digest in &digests {
        root.update(digest.bytes());
    }
    let computed = Sha256(root.finalize().into());
    if computed != subject.digest.sha256 {
        return Err(ManifestError::Inconsistent {
            path: path.to_path_buf(),
            reason: format!(
                "its subject digest is {:?} but its resources hash to {:?}",
                subject.digest.sha256, computed
            ),
        });
    }
    if resources.is_empty() {
        return Err(ManifestError::invalid(
            path,
            at_payload("predicate.resources"),
            "lists no files; an empty manifest would verify anything",
        ));
    }
    let mut manifest = match method {
        "files" => files_manifest(path, resources, &digests)?,
        _ => shards_manifest(path, resources, &digests)?,
    };
    manifest.allow_symlinks = serialization.allow_symlinks;
    manifest.root_digest = Some(computed);
    manifest.ignore_paths = serialization
        .ignore_paths
        .iter()
        .map(|p| p.trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty())
        .collect();
    Ok(manifest)
}

fn files_manifest(
    path: &Path,
    resources: &[Resource],
    digests: &[ContentDigest],
) -> Result<Manifest, ManifestError> {
    let mut seen = HashMap::new();
    let mut files = Vec::with_capacity(resources.len());
    for (index, (resource, digest)) in resources.iter().zip(digests).enumerate() {
        if seen.insert(resource.name.as_str(), index).is_some() {
            return Err(ManifestError::invalid(
                path,
                format!("$[\"dsseEnvelope\"][\"payload\"] (decoded) $.predicate.resources[{index}].name"),
                format!("{:?} is listed twice", resource.name),
            ));
        }
        files.push(ExpectedFile {
            path: resource.name.clone().into(),
            size: None,
            digest: Digest::Whole(digest.clone()),
        });
    }
    Ok(Manifest::signed(ManifestFormat::ModelSigningFiles, files))
}

fn shards_manifest(
    path: &Path,
    resources: &[Resource],
    digests: &[ContentDigest],
) -> Result<Manifest, ManifestError> {
    let mut order: Vec<&str> = Vec::new();
    let mut by_file: HashMap<&str, Vec<Shard>> = HashMap::new();
    for (index, (resource, digest)) in resources.iter().zip(digests).enumerate() {
        let at =
            format!("$[\"dsseEnvelope\"][\"payload\"] (decoded) $.predicate.resources[{index}]");
        // The file name itself may hold ':', so the range is taken from the right.
        let mut parts = resource.name.rsplitn(3, ':');
        let (end, start, file) = (parts.next(), parts.next(), parts.next());
        let range = match (
            file,
            start.map(str::parse::<u64>),
            end.map(str::parse::<u64>),
        ) {
            (Some(file), Some(Ok(start)), Some(Ok(end))) if start < end => Some((file, start, end)),
            _ => None,
        };
        let Some((file, start, end)) = range else {
            return Err(ManifestError::invalid(
                path,
                format!("{at}.name"),
                format!(
                    "{:?} is not \"<path>:<start>:<end>\" with start < end",
                    resource.name
                ),
            ));
        };
        let shards = by_file.entry(file).or_insert_with(|| {
            order.push(file);
            Vec::new()
        });
        shards.push(Shard {
            start,
            end,
            digest: digest.clone(),
        });
    }

    let mut files = Vec::with_capacity(order.len());
    for file in order {
        let mut shards = by_file.remove(file).unwrap_or_default();
        shards.sort_by_key(|s| s.start);
        let mut covered = 0;
        for shard in &shards {
            if shard.start != covered {
                return Err(ManifestError::invalid(
                    path,
                    "$[\"dsseEnvelope\"][\"payload\"] (decoded) $.predicate.resources",
                    format!(
                        "the shards of {file:?} do not cover it contiguously: expected one starting at byte {covered}, found {}:{}",
                        shard.start, shard.end
                    ),
                ));
            }
            covered = shard.end;
        }
        files.push(ExpectedFile {
            path: file.into(),
            size: Some(covered),
            digest: Digest::Shards(shards),
        });
    }
    Ok(Manifest::signed(ManifestFormat::ModelSigningShards, files))
}

fn unsupported_algorithm(path: &Path, index: usize, algorithm: &str) -> ManifestError {
    ManifestError::invalid(
        path,
        format!("$[\"dsseEnvelope\"][\"payload\"] (decoded) $.predicate.resources[{index}].algorithm"),
        format!("unsupported hash algorithm {algorithm:?}; bundles hashed with sha256, blake3 or blake2b (model_signing's hashing_algorithm) are verified"),
    )
}
