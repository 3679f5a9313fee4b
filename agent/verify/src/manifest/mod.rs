//! Trusted manifests: what the files under ROOT must contain.
//!
//! Two formats are read, detected by their top-level keys: the native JSON manifest
//! ([`native`], `{"revision", "files"}`) and an OpenSSF model_signing sigstore bundle
//! ([`model_signing`], `{"mediaType", "dsseEnvelope"}`). Both become one [`Manifest`], so the
//! verifier never knows which it was given.

pub mod certificate;
pub mod hub;
pub mod model_signing;
pub mod native;
mod signer;

pub use signer::{Conflict, SignerField, SignerFields, TrustConflict};

use std::fmt;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use serde::de::{self, Deserializer};
use serde::Deserialize;

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// Parses the only spelling manifests may use: 64 lower-case hex digits. Upper case is refused
    /// rather than folded because a manifest tool that writes it is not the one we were told about.
    pub fn parse_hex(text: &str) -> Result<Sha256, String> {
        if text.len() != 64 {
            return Err(format!(
                "a SHA-256 digest is 64 lower-case hex digits, found {} characters ({text:?})",
                text.chars().count()
            ));
        }
        if let Some(bad) = text.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
            return Err(format!(
                "a SHA-256 digest is 64 lower-case hex digits, found {bad:?} in {text:?}"
            ));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|e| e.to_string())?;
        Ok(Sha256(bytes))
    }

    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Sha256::parse_hex(&text).map_err(de::Error::custom)
    }
}

/// The hash functions a manifest may pin content with: SHA-256 in every format; BLAKE3 and BLAKE2b
/// (512-bit) as model_signing 1.1 signs with them (`hashing_algorithm: blake3 | blake2`), and
/// BLAKE3 in native manifests (`mlnode-agent manifest --hash blake3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashAlgorithm {
    Sha256,
    Blake3,
    Blake2b,
}

impl HashAlgorithm {
    /// The name manifests use: model_signing's `algorithm` (and the key in a native entry).
    pub fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Blake3 => "blake3",
            HashAlgorithm::Blake2b => "blake2b",
        }
    }

    pub fn from_name(name: &str) -> Option<HashAlgorithm> {
        [
            HashAlgorithm::Sha256,
            HashAlgorithm::Blake3,
            HashAlgorithm::Blake2b,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }

    fn digest_len(self) -> usize {
        match self {
            HashAlgorithm::Sha256 | HashAlgorithm::Blake3 => 32,
            HashAlgorithm::Blake2b => 64,
        }
    }
}

/// A content digest under one of the [`HashAlgorithm`]s. A BLAKE2b digest is boxed, so that the
/// million entries of a large manifest stay as small as SHA-256 alone keeps them.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum ContentDigest {
    Sha256(Sha256),
    Blake3([u8; 32]),
    Blake2b(Box<[u8; 64]>),
}

impl ContentDigest {
    pub fn algorithm(&self) -> HashAlgorithm {
        match self {
            ContentDigest::Sha256(_) => HashAlgorithm::Sha256,
            ContentDigest::Blake3(_) => HashAlgorithm::Blake3,
            ContentDigest::Blake2b(_) => HashAlgorithm::Blake2b,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            ContentDigest::Sha256(sha256) => &sha256.0,
            ContentDigest::Blake3(bytes) => bytes,
            ContentDigest::Blake2b(bytes) => &bytes[..],
        }
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.bytes())
    }

    /// Parses a digest of `algorithm` in the only spelling manifests may use: lower-case hex of
    /// the algorithm's length.
    pub fn parse_hex(algorithm: HashAlgorithm, text: &str) -> Result<ContentDigest, String> {
        if algorithm == HashAlgorithm::Sha256 {
            return Sha256::parse_hex(text).map(ContentDigest::Sha256);
        }
        let (name, len) = (algorithm.name().to_uppercase(), algorithm.digest_len());
        if text.len() != 2 * len || text.chars().any(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
            return Err(format!(
                "a {name} digest is {} lower-case hex digits, found {text:?}",
                2 * len
            ));
        }
        let bytes = hex::decode(text).map_err(|e| e.to_string())?;
        ContentDigest::from_bytes(algorithm, &bytes)
            .ok_or_else(|| format!("{text:?} is not a {name} digest"))
    }

    /// The digest of `algorithm` in `bytes`, None unless they are the algorithm's length.
    fn from_bytes(algorithm: HashAlgorithm, bytes: &[u8]) -> Option<ContentDigest> {
        Some(match algorithm {
            HashAlgorithm::Sha256 => ContentDigest::Sha256(Sha256(bytes.try_into().ok()?)),
            HashAlgorithm::Blake3 => ContentDigest::Blake3(bytes.try_into().ok()?),
            HashAlgorithm::Blake2b => ContentDigest::Blake2b(Box::new(bytes.try_into().ok()?)),
        })
    }
}

impl fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm().name(), self.to_hex())
    }
}

/// One byte range of a file and the digest of exactly those bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub start: u64,
    pub end: u64,
    pub digest: ContentDigest,
}

/// How a file's content is pinned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Digest {
    Whole(ContentDigest),
    /// Contiguous ranges from offset 0 to the file's size, in order. Each is hashed on its own, so
    /// one large file can keep every core busy.
    Shards(Vec<Shard>),
    /// A git blob id (SHA-1): only from a Hugging Face cache's own blob names, never a manifest.
    GitBlob([u8; 20]),
    /// Nothing names the content: a hub snapshot entry, checked without a manifest, that is not a
    /// link to a content-addressed blob. It never verifies.
    Unaddressed,
}

impl Digest {
    /// The name a Hugging Face cache stores a file with this digest under, in `blobs/`.
    pub fn blob_name(&self) -> Option<String> {
        match self {
            Digest::Whole(ContentDigest::Sha256(sha256)) => Some(sha256.to_hex()),
            Digest::GitBlob(id) => Some(hex::encode(id)),
            Digest::Whole(_) | Digest::Shards(_) | Digest::Unaddressed => None,
        }
    }
}

/// One file the manifest requires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedFile {
    /// The path as the manifest spells it, relative to the model directory. It is not trusted yet:
    /// [`crate::verify`] checks it before touching the file system. Boxed: a million-file
    /// manifest keeps a million of these, and a `String`'s capacity word is 8 MB of them.
    pub path: Box<str>,
    /// Known for sharded entries and native entries that give it: lets a truncated file be
    /// reported without reading it.
    pub size: Option<u64>,
    pub digest: Digest,
}

/// Which format the manifest came in; reported so an operator can tell what was trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManifestFormat {
    Native,
    ModelSigningFiles,
    ModelSigningShards,
    /// No manifest: a hub cache checked against the content addresses its blobs are named by.
    HubBlobNames,
}

/// The trusted description of a model release.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub format: ManifestFormat,
    /// The release revision (a commit hash or tag). model_signing bundles carry none.
    pub revision: Option<String>,
    pub files: Vec<ExpectedFile>,
    /// Paths the signer left out on purpose (a bundle's `ignore_paths`): never extra.
    pub ignore_paths: Vec<String>,
    /// Whether a listed file may be reached through a symlink in a plain directory: a bundle says
    /// (`allow_symlinks`, false unless it says true, as model_signing verifies); a native manifest
    /// allows those that stay inside ROOT.
    pub allow_symlinks: bool,
    /// A bundle's root digest: the SHA-256 over its resources' digests in order, the in-toto
    /// subject its signature binds (model_signing's `digest`), checked against the resources before
    /// the manifest is made. It ties a verified cache to an attestation of the same subject.
    pub root_digest: Option<Sha256>,
}

impl Manifest {
    /// A manifest that lists what it covers and nothing it leaves out. Its files are kept sorted
    /// by path: looking one up (an event's path, a listed file) needs no index of its own, which
    /// on a million-file cache would cost as much as the manifest.
    pub fn new(
        format: ManifestFormat,
        revision: Option<String>,
        mut files: Vec<ExpectedFile>,
    ) -> Self {
        files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        Manifest {
            format,
            revision,
            files,
            ignore_paths: Vec::new(),
            allow_symlinks: true,
            root_digest: None,
        }
    }

    fn signed(format: ManifestFormat, files: Vec<ExpectedFile>) -> Self {
        Manifest::new(format, None, files)
    }

    /// A signed bundle describes the whole model: a file it does not list fails the verification,
    /// as model_signing's own verifier fails it, unless the operator asks otherwise.
    pub fn covers_the_whole_model(&self) -> bool {
        matches!(
            self.format,
            ManifestFormat::ModelSigningFiles | ManifestFormat::ModelSigningShards
        )
    }

    /// Whether the manifest lists `path`.
    pub fn lists(&self, path: &str) -> bool {
        self.files.binary_search_by(|f| (*f.path).cmp(path)).is_ok()
    }

    /// The listed files below directory `dir` (relative, no trailing `/`).
    pub fn under(&self, dir: &str) -> &[ExpectedFile] {
        let prefix = format!("{dir}/");
        let start = self.files.partition_point(|f| *f.path < *prefix);
        let len = self.files[start..].partition_point(|f| f.path.starts_with(&prefix));
        &self.files[start..start + len]
    }

    /// A path listed more than once, if any.
    pub fn first_duplicate(&self) -> Option<&str> {
        self.files
            .windows(2)
            .find(|pair| pair[0].path == pair[1].path)
            .map(|pair| &*pair[0].path)
    }

    /// Whether `path` (relative) is one the signer left out, or lies below one.
    pub fn ignores(&self, path: &str) -> bool {
        self.ignore_paths.iter().any(|i| {
            path == i
                || path
                    .strip_prefix(i.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        })
    }
}

/// What it takes for a model_signing bundle's digests to be trusted: the three ways
/// `model_signing verify` checks a signer (`key`, `certificate`, `sigstore`), or none. Read from
/// the fields an operator writes ([`SignerFields`]), so a policy that exists is never a
/// contradiction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(try_from = "SignerFields", into = "SignerFields")]
pub enum TrustPolicy {
    /// The DSSE signature must verify with this PEM public key (ECDSA P-256, P-384 or P-521).
    PublicKey(PathBuf),
    /// The bundle's signing certificate must chain to one of the certificates in these PEM files
    /// (a root, or an intermediate the operator trusts), be valid when it signed and be meant for
    /// signing; its key must verify the signature.
    CertificateChain(Vec<PathBuf>),
    /// Keyless: a Fulcio certificate for `identity` from the OpenID provider `issuer`, logged in
    /// Rekor, all checked offline against a Sigstore trusted root.
    Sigstore(SigstoreSigner),
    /// Trust the digests without checking who signed them (`--allow-unsigned`).
    AllowUnsigned,
    /// No signer and no permission: a bundle is refused. Native manifests are trusted as given,
    /// because their trust comes from where the operator keeps them.
    #[default]
    RequireKey,
}

/// Who must have signed a keyless bundle, and the trusted root that vouches for the certificate
/// authority and logs (the public-good instance's, embedded, unless one is given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigstoreSigner {
    /// The certificate's subject alternative name (an email, or a workload URI), matched exactly.
    pub identity: String,
    /// The OpenID Connect issuer that vouched for it, matched exactly.
    pub issuer: String,
    pub root: SigstoreRoot,
}

/// Which Sigstore instance vouches for keyless certificates and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SigstoreRoot {
    /// The public-good instance (embedded trusted root).
    PublicGood,
    /// Sigstore's staging instance (embedded trusted root; model_signing's `--use-staging`).
    Staging,
    /// A private deployment's `trusted_root.json`, or model_signing's `--trust-config` file.
    File(PathBuf),
}

impl TrustPolicy {
    /// The configured signer, in words; None when no signer is required.
    pub fn signer(&self) -> Option<String> {
        match self {
            TrustPolicy::PublicKey(key) => Some(format!("public key {}", key.display())),
            TrustPolicy::CertificateChain(chain) => Some(format!(
                "certificate chain {}",
                chain
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            TrustPolicy::Sigstore(signer) => Some(format!(
                "sigstore identity {} from {}",
                signer.identity, signer.issuer
            )),
            TrustPolicy::AllowUnsigned | TrustPolicy::RequireKey => None,
        }
    }
}

/// A manifest that cannot be used. Each variant names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifest {path} is empty")]
    Empty { path: PathBuf },
    #[error("manifest {path}: at {at}: {reason}")]
    Invalid {
        path: PathBuf,
        at: String,
        reason: String,
    },
    #[error("manifest {path} is not a native manifest (keys \"revision\", \"files\") nor a model_signing bundle (keys \"mediaType\", \"dsseEnvelope\")")]
    UnknownFormat { path: PathBuf },
    #[error("manifest {path} is a model_signing bundle, and its digests are only trusted once its signature is checked: say who signed it (a public key, a certificate chain, or a keyless identity and its issuer), or trust it unchecked")]
    Unsigned { path: PathBuf },
    #[error("manifest {path}: the signature does not verify with {signer}: {reason}")]
    BadSignature {
        path: PathBuf,
        signer: String,
        reason: String,
    },
    #[error("manifest {path}: signed, but not by {signer}: {reason}")]
    WrongSigner {
        path: PathBuf,
        signer: String,
        reason: String,
    },
    #[error("manifest {path}: the signed statement is inconsistent: {reason}")]
    Inconsistent { path: PathBuf, reason: String },
    #[error("manifest {path} is not a signed bundle, but a signer ({signer}) is configured: only a bundle that verifies with it is accepted (drop the signer to trust a native manifest by where it is kept)")]
    Downgrade { path: PathBuf, signer: String },
    #[error("{path} cannot be verified without a manifest: {reason}")]
    NoManifest { path: PathBuf, reason: String },
    #[error("public key {path}: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("{what} {path}: {reason}")]
    BadTrustMaterial {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

impl ManifestError {
    /// The stage of a verification that ran and failed (exit 1), as opposed to input that could
    /// not be used at all (exit 2): `signature` (does not verify with the key, certificate or log
    /// proof), `digest` (the signed statement's digests do not add up), `policy` (a signer is
    /// configured and this manifest is not signed by it: unsigned, another identity, a certificate
    /// outside the chain).
    pub fn failed_stage(&self) -> Option<&'static str> {
        match self {
            ManifestError::BadSignature { .. } => Some("signature"),
            ManifestError::WrongSigner { .. } => Some("policy"),
            ManifestError::Inconsistent { .. } => Some("digest"),
            ManifestError::Downgrade { .. } => Some("policy"),
            _ => None,
        }
    }

    /// The error and, where a setting would mend it, which: each signer field named by `name`
    /// in the front end's own words (a flag, a config key).
    pub fn explain(&self, name: impl Fn(SignerField) -> String) -> String {
        match self {
            ManifestError::Unsigned { .. } => format!(
                "{self}: give {} PEM, {} PEM, or {} with {}; or {}",
                name(SignerField::PublicKey),
                name(SignerField::CertificateChain),
                name(SignerField::Identity),
                name(SignerField::IdentityProvider),
                name(SignerField::AllowUnsigned)
            ),
            _ => self.to_string(),
        }
    }

    fn invalid(path: &Path, at: impl Into<String>, reason: impl Into<String>) -> Self {
        ManifestError::Invalid {
            path: path.to_path_buf(),
            at: at.into(),
            reason: reason.into(),
        }
    }
}

/// Just enough of the top level to tell the formats apart before a strict parse.
#[derive(Deserialize)]
struct FormatProbe {
    #[serde(rename = "mediaType")]
    media_type: Option<de::IgnoredAny>,
    #[serde(rename = "dsseEnvelope")]
    dsse_envelope: Option<de::IgnoredAny>,
    files: Option<de::IgnoredAny>,
}

/// The largest manifest read: a native manifest of a million files is about 150 MB.
pub const MANIFEST_LIMIT: u64 = 256 << 20;

/// Reads and checks a manifest file: a regular file of at most [`MANIFEST_LIMIT`] bytes (a FIFO
/// or device named as the manifest is refused, not waited on). A bundle's signature is checked
/// here, before any of its digests leave this function.
pub fn load(path: &Path, trust: &TrustPolicy) -> Result<Manifest, ManifestError> {
    Ok(load_with_digest(path, trust)?.0)
}

/// [`load`], and the SHA-256 of the bytes it read: what tells a rewritten manifest from a touched
/// one without keeping its bytes (about 110 per entry).
pub fn load_with_digest(
    path: &Path,
    trust: &TrustPolicy,
) -> Result<(Manifest, [u8; 32]), ManifestError> {
    let read_error = |source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    };
    let (file, _) = mlnode_files::open_bounded(path, MANIFEST_LIMIT).map_err(read_error)?;
    from_source(path, file, trust)
}

/// [`load`] on bytes already read; `path` only names the manifest in errors.
pub fn parse(path: &Path, bytes: &[u8], trust: &TrustPolicy) -> Result<Manifest, ManifestError> {
    Ok(from_source(path, std::io::Cursor::new(bytes), trust)?.0)
}

/// Two passes over the source, neither holding a native manifest's bytes: the first tells the
/// format from the top-level keys, the second parses it (streamed for a native manifest, whose
/// entries are all that is kept) and hashes what it reads.
fn from_source<S: Read + Seek>(
    path: &Path,
    mut source: S,
    trust: &TrustPolicy,
) -> Result<(Manifest, [u8; 32]), ManifestError> {
    let read_error = |source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    };
    let probe: FormatProbe = {
        let mut reader = BufReader::new(&mut source);
        match first_non_space(&mut reader).map_err(read_error)? {
            None => {
                return Err(ManifestError::Empty {
                    path: path.to_path_buf(),
                })
            }
            Some(b'{') => {}
            Some(_) => {
                return Err(ManifestError::invalid(
                    path,
                    "$",
                    "a manifest is a JSON object ({...}), this is not one",
                ))
            }
        }
        parse_json_from(path, serde_json::Deserializer::from_reader(reader))?
    };
    source.seek(SeekFrom::Start(0)).map_err(read_error)?;
    let mut hashing = HashingReader {
        inner: source.take(MANIFEST_LIMIT),
        sha256: sha2::Sha256::new(),
    };
    let manifest = if probe.media_type.is_some() || probe.dsse_envelope.is_some() {
        let mut bytes = Vec::new();
        hashing.read_to_end(&mut bytes).map_err(read_error)?;
        model_signing::parse(path, &bytes, trust)?
    } else if probe.files.is_some() {
        // A configured signer means "only what it signed": an unsigned manifest put in the
        // bundle's place must not be trusted instead (a downgrade).
        if let Some(signer) = trust.signer() {
            return Err(ManifestError::Downgrade {
                path: path.to_path_buf(),
                signer,
            });
        }
        native::parse(path, BufReader::new(&mut hashing))?
    } else {
        return Err(ManifestError::UnknownFormat {
            path: path.to_path_buf(),
        });
    };
    Ok((manifest, hashing.sha256.finalize().into()))
}

/// The first byte that is not JSON white space, left unread; None at the end.
fn first_non_space(reader: &mut impl BufRead) -> std::io::Result<Option<u8>> {
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(None);
        }
        match buffer.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(at) => {
                let byte = buffer[at];
                reader.consume(at);
                return Ok(Some(byte));
            }
            None => {
                let all = buffer.len();
                reader.consume(all);
            }
        }
    }
}

/// Hashes what passes through it.
struct HashingReader<R> {
    inner: R,
    sha256: sha2::Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buffer)?;
        self.sha256.update(&buffer[..n]);
        Ok(n)
    }
}

/// Strict JSON parsing whose errors carry the JSON path of the offending value.
pub(crate) fn parse_json<'a, T: Deserialize<'a>>(
    path: &Path,
    bytes: &'a [u8],
) -> Result<T, ManifestError> {
    parse_json_from(path, serde_json::Deserializer::from_slice(bytes))
}

/// [`parse_json`] from any JSON source, a stream included; the whole input must be one value.
pub(crate) fn parse_json_from<'de, R: serde_json::de::Read<'de>, T: Deserialize<'de>>(
    path: &Path,
    mut de: serde_json::Deserializer<R>,
) -> Result<T, ManifestError> {
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = json_path(e.path());
        let inner = e.into_inner();
        ManifestError::invalid(path, at, describe_json_error(&inner))
    })?;
    de.end()
        .map_err(|e| ManifestError::invalid(path, "$", describe_json_error(&e)))?;
    Ok(value)
}

fn json_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::from("$");
    for segment in path.iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key } => out.push_str(&format!("[{key:?}]")),
            serde_path_to_error::Segment::Enum { variant } => out.push_str(&format!(".{variant}")),
            serde_path_to_error::Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

fn describe_json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        Category::Eof => format!("the JSON ends too early, truncated? ({e})"),
        Category::Syntax => format!("not valid JSON: {e}"),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each algorithm's digest in the one spelling manifests may use: lower-case hex of its
    /// length; a SHA-256-length BLAKE2b digest or upper case is refused, not padded or folded.
    #[test]
    fn content_digests_parse_strictly_per_algorithm() {
        let blake3 = ContentDigest::parse_hex(HashAlgorithm::Blake3, &"ab".repeat(32)).unwrap();
        assert_eq!(blake3.algorithm(), HashAlgorithm::Blake3);
        assert_eq!(blake3.to_hex(), "ab".repeat(32));
        let blake2b = ContentDigest::parse_hex(HashAlgorithm::Blake2b, &"cd".repeat(64)).unwrap();
        assert_eq!(blake2b.bytes().len(), 64);
        for (algorithm, text) in [
            (HashAlgorithm::Blake2b, "cd".repeat(32)),
            (HashAlgorithm::Blake3, "AB".repeat(32)),
            (HashAlgorithm::Blake3, "ab".repeat(31)),
        ] {
            assert!(
                ContentDigest::parse_hex(algorithm, &text).is_err(),
                "{algorithm:?} {text}"
            );
        }
        assert_eq!(
            HashAlgorithm::from_name("blake2b"),
            Some(HashAlgorithm::Blake2b)
        );
        assert_eq!(
            HashAlgorithm::from_name("blake2"),
            None,
            "model_signing's option, not its name"
        );
        assert!(
            std::mem::size_of::<Digest>() <= 40,
            "a manifest entry's digest stays as small as SHA-256 alone kept it"
        );
    }

    #[test]
    fn files_are_found_by_path_and_by_directory_without_an_index() {
        let digest = "a".repeat(64);
        let json = format!(
            r#"{{"files": {{"w/b": "{digest}", "c": "{digest}", "w/a": "{digest}", "w.x": "{digest}", "wz/a": "{digest}"}}}}"#
        );
        let manifest = parse(
            Path::new("m.json"),
            json.as_bytes(),
            &TrustPolicy::RequireKey,
        )
        .unwrap();
        assert!(manifest.lists("w/a") && manifest.lists("c"));
        assert!(!manifest.lists("w") && !manifest.lists("w/"));
        let under: Vec<&str> = manifest.under("w").iter().map(|f| &*f.path).collect();
        assert_eq!(under, ["w/a", "w/b"]);
        assert!(manifest.under("c").is_empty());
    }

    #[test]
    fn a_streamed_manifest_is_digested_whole_trailing_space_included() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let native = format!("  {{\"files\": {{\"a\": \"{}\"}}}}\n\n", "b".repeat(64));
        std::fs::write(&path, &native).unwrap();
        let (manifest, digest) = load_with_digest(&path, &TrustPolicy::RequireKey).unwrap();
        assert_eq!(manifest.files.len(), 1);
        assert_eq!(
            digest,
            <[u8; 32]>::from(sha2::Sha256::digest(native.as_bytes()))
        );
    }

    /// What the fields mean together: one signer, and a keyless one's Sigstore instance; no
    /// signer and no allowance requires one; a contradiction names the field at fault.
    #[test]
    fn signer_fields_give_one_policy_or_name_the_conflict() {
        let chain = vec![PathBuf::from("/pki/root.pem")];
        let keyless = SignerFields {
            identity: Some("ci@example.com".into()),
            identity_provider: Some("https://token.actions.githubusercontent.com".into()),
            use_staging: true,
            ..SignerFields::default()
        };
        match TrustPolicy::try_from(keyless.clone()).unwrap() {
            TrustPolicy::Sigstore(signer) => assert_eq!(signer.root, SigstoreRoot::Staging),
            other => panic!("{other:?}"),
        }
        let round_trip = SignerFields::from(TrustPolicy::try_from(keyless.clone()).unwrap());
        assert_eq!(
            round_trip, keyless,
            "a policy writes back the fields it was read from"
        );
        assert_eq!(
            TrustPolicy::try_from(SignerFields::default()).unwrap(),
            TrustPolicy::RequireKey
        );
        assert_eq!(
            TrustPolicy::try_from(SignerFields {
                certificate_chain: chain.clone(),
                ..SignerFields::default()
            })
            .unwrap(),
            TrustPolicy::CertificateChain(chain)
        );
        let conflict = TrustPolicy::try_from(SignerFields {
            public_key: Some("/k.pem".into()),
            allow_unsigned: true,
            ..SignerFields::default()
        })
        .unwrap_err();
        assert_eq!(conflict.field, SignerField::AllowUnsigned);
        assert_eq!(
            conflict.to_string(),
            "allow_unsigned: contradicts public_key: give one or the other"
        );
        assert_eq!(
            conflict.explain(|field| format!("--{}", field.key().replace('_', "-"))),
            "--allow-unsigned: contradicts --public-key: give one or the other",
            "a front end names the fields in its own words"
        );
    }
}
