//! OpenSSF model_signing bundles (`model_signing sign ...`, PyPI `model-signing` 1.x).
//!
//! A sigstore bundle holds a DSSE envelope whose payload is an in-toto statement; the statement's
//! predicate lists every file (`files` serialization) or every byte range of every file (`shards`
//! serialization, resource names `path:start:end`) with its SHA-256. We check, in this order:
//! who signed it, as the operator requires (the three ways `model_signing verify` does: the DSSE
//! signature over the envelope's pre-authentication encoding with a public key on P-256, P-384 or
//! P-521; a signing certificate that chains to the operator's certificates ([`super::certificate`]);
//! or keyless, a Fulcio certificate for an identity and issuer, logged in Rekor, checked offline by
//! `sigstore-verify`), then that the statement's subject digest is the SHA-256 of the resource
//! digests in order (as model_signing's own verifier does), and only then hand the digests to the
//! verifier.

use std::collections::HashMap;
use std::path::Path;

use aws_lc_rs::signature::{self as ecdsa, UnparsedPublicKey, VerificationAlgorithm};
use base64::Engine;
use serde::Deserialize;
use sha2::Digest as _;
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::pem::LineEnding;
use x509_cert::der::{Decode, EncodePem};
use x509_cert::spki::SubjectPublicKeyInfoOwned;

use super::{
    parse_json, Digest, ExpectedFile, Manifest, ManifestError, ManifestFormat, Sha256, Shard,
    SigstoreRoot, SigstoreSigner, TrustPolicy,
};

const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// What model_signing before 1.0 (0.2.x) signed: a digest list in another layout, signed over a
/// pre-authentication encoding with a known bug (its own verifier keeps a compatibility path).
const PREDICATE_TYPE_V0_2: &str = "https://model_signing/Digests/v0.1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    #[serde(default)]
    verification_material: Option<VerificationMaterial>,
    dsse_envelope: Envelope,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VerificationMaterial {
    #[serde(default)]
    public_key: Option<PublicKeyIdentifier>,
    /// `model_signing sign certificate`: the signing certificate first, then what leads to a root.
    #[serde(default)]
    x509_certificate_chain: Option<CertificateChain>,
}

#[derive(Deserialize)]
struct CertificateChain {
    #[serde(deserialize_with = "at_most_certificates")]
    certificates: Vec<RawCertificate>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCertificate {
    /// Base64 DER.
    raw_bytes: String,
}

#[derive(Deserialize)]
struct PublicKeyIdentifier {
    #[serde(default)]
    hint: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    #[serde(deserialize_with = "at_most_signatures")]
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
struct EnvelopeSignature {
    sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    statement_type: String,
    subject: Vec<Subject>,
    predicate_type: String,
    predicate: Predicate,
}

#[derive(Deserialize)]
struct Subject {
    digest: SubjectDigest,
}

#[derive(Deserialize)]
struct SubjectDigest {
    sha256: Sha256,
}

#[derive(Deserialize)]
struct Predicate {
    serialization: Serialization,
    resources: Vec<Resource>,
}

#[derive(Deserialize)]
struct Serialization {
    method: String,
    /// Paths (relative to the model, files or folders) the signer left out; model_signing's
    /// verifier ignores them too, and so do we when listing extras.
    #[serde(default)]
    ignore_paths: Vec<String>,
    /// Whether the signer let symlinks be followed; model_signing's verifier refuses them otherwise.
    #[serde(default)]
    allow_symlinks: bool,
}

#[derive(Deserialize)]
struct Resource {
    name: String,
    algorithm: String,
    /// Hex, parsed once the algorithm is known to be one we verify (a BLAKE2 digest is longer).
    digest: String,
}

pub(super) fn parse(
    path: &Path,
    bytes: &[u8],
    trust: &TrustPolicy,
) -> Result<Manifest, ManifestError> {
    let bundle: Bundle = parse_json(path, bytes)?;
    if !bundle
        .media_type
        .starts_with("application/vnd.dev.sigstore.bundle")
    {
        return Err(ManifestError::invalid(
            path,
            "$[\"mediaType\"]",
            format!(
                "{:?} is not a sigstore bundle media type",
                bundle.media_type
            ),
        ));
    }
    let envelope = &bundle.dsse_envelope;
    if envelope.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(ManifestError::invalid(
            path,
            "$[\"dsseEnvelope\"][\"payloadType\"]",
            format!(
                "expected {IN_TOTO_PAYLOAD_TYPE:?}, found {:?}",
                envelope.payload_type
            ),
        ));
    }
    let payload = base64_decode(&envelope.payload)
        .map_err(|e| ManifestError::invalid(path, "$[\"dsseEnvelope\"][\"payload\"]", e))?;
    // Read before it is trusted: a keyless check binds the signature to the statement's subject.
    let statement = parse_statement(path, &payload)?;
    // The configured signer in words, for every error that names it.
    let signer = trust.signer().unwrap_or_default();
    match trust {
        TrustPolicy::PublicKey(key_path) => {
            check_signature(path, key_path, &signer, &bundle, &payload)?
        }
        TrustPolicy::CertificateChain(chain_files) => {
            let chain: Option<Vec<&str>> = bundle
                .verification_material
                .as_ref()
                .and_then(|m| m.x509_certificate_chain.as_ref())
                .map(|c| {
                    c.certificates
                        .iter()
                        .map(|c| c.raw_bytes.as_str())
                        .collect()
                });
            let spki =
                super::certificate::signing_key(path, chain_files, &signer, chain.as_deref())?;
            let key = SignerKey::from_spki_der(&spki).map_err(|e| ManifestError::WrongSigner {
                path: path.to_path_buf(),
                signer: signer.clone(),
                reason: format!("the signing certificate: {e}"),
            })?;
            verify_envelope(path, &signer, &key, &bundle, &payload)?;
        }
        TrustPolicy::Sigstore(sigstore) => {
            check_keyless(path, bytes, &bundle, &statement, sigstore, &signer)?
        }
        TrustPolicy::AllowUnsigned => {}
        TrustPolicy::RequireKey => {
            return Err(ManifestError::Unsigned {
                path: path.to_path_buf(),
            })
        }
    }
    statement_to_manifest(path, statement)
}

/// Just the statement's predicate type, read before the predicate is: an older model_signing's
/// predicate has another shape, and deserves "unsupported version" rather than a field error.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatementKind {
    predicate_type: Option<String>,
}

fn parse_statement(path: &Path, payload: &[u8]) -> Result<Statement, ManifestError> {
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

/// Keyless: `sigstore-verify` checks the Fulcio certificate chain and its SCT against the trusted
/// root, the identity and issuer exactly, the Rekor entry's inclusion proof, checkpoint and promise,
/// the certificate's validity at the logged time, and the DSSE signature; the statement's subject
/// is what the signature must bind (its resources are checked to hash to it afterwards).
fn check_keyless(
    path: &Path,
    bytes: &[u8],
    ours: &Bundle,
    statement: &Statement,
    sigstore: &SigstoreSigner,
    signer: &str,
) -> Result<(), ManifestError> {
    use sigstore_verify::trust_root::{
        TrustedRoot, SIGSTORE_PRODUCTION_TRUSTED_ROOT, SIGSTORE_STAGING_TRUSTED_ROOT,
    };
    use sigstore_verify::types::{Artifact, ArtifactDigest, Sha256Hash};
    if let Some(material) = &ours.verification_material {
        let other = if material.x509_certificate_chain.is_some() {
            Some("a certificate chain (model_signing sign certificate)")
        } else if material.public_key.is_some() {
            Some("a key (model_signing sign key)")
        } else {
            None
        };
        if let Some(other) = other {
            return Err(ManifestError::WrongSigner {
                path: path.to_path_buf(),
                signer: signer.to_string(),
                reason: format!("the bundle is not keyless: it was signed with {other}"),
            });
        }
    }
    let embedded = |json: &str, name: &str| {
        TrustedRoot::from_json(json).map_err(|e| ManifestError::BadTrustMaterial {
            what: "trusted root",
            path: name.into(),
            reason: e.to_string(),
        })
    };
    let root = match &sigstore.root {
        SigstoreRoot::File(file) => crate::files::read_bounded_text(file, TRUST_ROOT_LIMIT)
            .map_err(|e| format!("cannot read: {e}"))
            .and_then(|json| {
                // model_signing's --trust-config file is a ClientTrustConfig that holds the root.
                let embedded = serde_json::from_str::<serde_json::Value>(&json)
                    .ok()
                    .and_then(|v| v.get("trustedRoot").map(ToString::to_string));
                TrustedRoot::from_json(embedded.as_deref().unwrap_or(&json))
                    .map_err(|e| format!("not a Sigstore trusted_root.json (nor a ClientTrustConfig holding one): {e}"))
            })
            .map_err(|reason| ManifestError::BadTrustMaterial {
                what: "trusted root",
                path: file.clone(),
                reason,
            })?,
        SigstoreRoot::PublicGood => embedded(
            SIGSTORE_PRODUCTION_TRUSTED_ROOT,
            "(embedded public-good Sigstore root)",
        )?,
        SigstoreRoot::Staging => {
            embedded(SIGSTORE_STAGING_TRUSTED_ROOT, "(embedded Sigstore staging root)")?
        }
    };
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ManifestError::invalid(path, "$", format!("not UTF-8: {e}")))?;
    let bundle = sigstore_verify::types::Bundle::from_json(text)
        .map_err(|e| ManifestError::invalid(path, "$", format!("not a sigstore bundle: {e}")))?;
    let [subject] = statement.subject.as_slice() else {
        return Err(ManifestError::invalid(
            path,
            "$[\"dsseEnvelope\"][\"payload\"] (decoded) $.subject",
            "expected exactly one subject",
        ));
    };
    let artifact = Artifact::Digest(ArtifactDigest::sha256(Sha256Hash::new(
        subject.digest.sha256.0,
    )));
    let policy = sigstore_verify::VerificationPolicy::new(
        sigstore.identity.as_str(),
        sigstore.issuer.as_str(),
    );
    match sigstore_verify::verify(artifact, &bundle, &policy, &root) {
        Ok(_) => Ok(()),
        Err(
            e @ (sigstore_verify::Error::IdentityMismatch { .. }
            | sigstore_verify::Error::IssuerMismatch { .. }),
        ) => Err(ManifestError::WrongSigner {
            path: path.to_path_buf(),
            signer: signer.to_string(),
            reason: e.to_string(),
        }),
        Err(
            e @ (sigstore_verify::Error::InvalidBundle(_)
            | sigstore_verify::Error::UnsupportedBundle(_)
            | sigstore_verify::Error::Bundle(_)
            | sigstore_verify::Error::Types(_)),
        ) => Err(ManifestError::invalid(path, "$", e.to_string())),
        Err(e) => Err(ManifestError::BadSignature {
            path: path.to_path_buf(),
            signer: signer.to_string(),
            reason: e.to_string(),
        }),
    }
}

/// A trusted root is a few tens of kilobytes.
const TRUST_ROOT_LIMIT: u64 = 4 << 20;

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not valid base64: {e}"))
}

/// DSSE v1 pre-authentication encoding: what the signer actually signed.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

fn check_signature(
    path: &Path,
    key_path: &Path,
    signer: &str,
    bundle: &Bundle,
    payload: &[u8],
) -> Result<(), ManifestError> {
    let bad_key = |reason: String| ManifestError::BadKey {
        path: key_path.to_path_buf(),
        reason,
    };
    let pem = crate::files::read_bounded_text(key_path, KEY_FILE_LIMIT)
        .map_err(|e| bad_key(format!("cannot read: {e}")))?;
    let key = SignerKey::from_pem(&pem).map_err(bad_key)?;

    // model_signing records sha256(PEM of the key) as a hint; a mismatch means the bundle was made
    // with another key, which is a clearer message than "signature invalid".
    let hint = bundle
        .verification_material
        .as_ref()
        .and_then(|m| m.public_key.as_ref())
        .and_then(|k| k.hint.as_deref());
    if let Some(hint) = hint {
        let canonical = key.canonical_pem().map_err(bad_key)?;
        let ours = hex::encode(sha2::Sha256::digest(canonical.as_bytes()));
        if ours != hint {
            return Err(ManifestError::BadSignature {
                path: path.to_path_buf(),
                signer: signer.to_string(),
                reason: format!(
                    "the bundle was signed with another key (its key hint is {hint}, this key's is {ours})"
                ),
            });
        }
    }
    verify_envelope(path, signer, &key, bundle, payload)
}

/// The envelope's signature over the in-toto payload, checked with `key` (`signer` names it).
fn verify_envelope(
    path: &Path,
    signer: &str,
    key: &SignerKey,
    bundle: &Bundle,
    payload: &[u8],
) -> Result<(), ManifestError> {
    let bad_signature = |reason: String| ManifestError::BadSignature {
        path: path.to_path_buf(),
        signer: signer.to_string(),
        reason,
    };
    let message = pae(IN_TOTO_PAYLOAD_TYPE, payload);
    let signatures = &bundle.dsse_envelope.signatures;
    if signatures.is_empty() {
        return Err(bad_signature("the envelope carries no signature".into()));
    }
    let mut last_error = String::new();
    for signature in signatures {
        match base64_decode(&signature.sig).and_then(|der| key.verify(&message, &der)) {
            Ok(()) => return Ok(()),
            Err(e) => last_error = e,
        }
    }
    Err(bad_signature(last_error))
}

/// A public key model_signing signs with: ECDSA on P-256, P-384 or P-521, each with the hash
/// model_signing pairs with it (SHA-256, SHA-384, SHA-512: `get_ec_key_hash` in its
/// `_signing/sign_ec_key.py`), which is each curve's own ECDSA digest here. Kept as its
/// SubjectPublicKeyInfo and the verification algorithm its curve names.
struct SignerKey {
    spki: SubjectPublicKeyInfoOwned,
    algorithm: &'static dyn VerificationAlgorithm,
}

/// id-ecPublicKey (RFC 5480 section 2.1.1).
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");

/// The named curves (RFC 5480 section 2.1.1.1) and their ECDSA verification with ASN.1 (DER)
/// signatures, as model_signing writes them.
const CURVES: [(ObjectIdentifier, &ecdsa::EcdsaVerificationAlgorithm); 3] = [
    (
        ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7"),
        &ecdsa::ECDSA_P256_SHA256_ASN1,
    ),
    (
        ObjectIdentifier::new_unwrap("1.3.132.0.34"),
        &ecdsa::ECDSA_P384_SHA384_ASN1,
    ),
    (
        ObjectIdentifier::new_unwrap("1.3.132.0.35"),
        &ecdsa::ECDSA_P521_SHA512_ASN1,
    ),
];

impl SignerKey {
    /// From a certificate's SubjectPublicKeyInfo (DER).
    fn from_spki_der(der: &[u8]) -> Result<SignerKey, String> {
        let not_ours = || {
            "its key is not ECDSA on P-256, P-384 or P-521, the keys model_signing signs with"
                .to_string()
        };
        let spki = SubjectPublicKeyInfoOwned::from_der(der).map_err(|_| not_ours())?;
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .filter(|_| spki.algorithm.oid == EC_PUBLIC_KEY)
            .and_then(|p| p.decode_as::<ObjectIdentifier>().ok())
            .ok_or_else(not_ours)?;
        let (_, algorithm) = CURVES
            .iter()
            .find(|(oid, _)| *oid == curve)
            .ok_or_else(not_ours)?;
        // An uncompressed point (SEC 1, 0x04), as model_signing and every X.509 library write
        // it: the canonical PEM of the hint is this encoding.
        if spki.subject_public_key.raw_bytes().first() != Some(&0x04) {
            return Err("its EC point is not in the uncompressed form model_signing writes".into());
        }
        Ok(SignerKey {
            spki,
            algorithm: *algorithm,
        })
    }

    fn from_pem(pem: &str) -> Result<SignerKey, String> {
        let not_pem = |e: &dyn std::fmt::Display| {
            format!("not a PEM ECDSA public key on P-256, P-384 or P-521 (\"-----BEGIN PUBLIC KEY-----\"): {e}")
        };
        let (label, der) =
            x509_cert::der::pem::decode_vec(pem.as_bytes()).map_err(|e| not_pem(&e))?;
        if label != "PUBLIC KEY" {
            return Err(not_pem(&format!("its label is {label:?}")));
        }
        SignerKey::from_spki_der(&der).map_err(|e| not_pem(&e))
    }

    /// The key as model_signing writes it for its hint: SubjectPublicKeyInfo PEM, LF line ends.
    fn canonical_pem(&self) -> Result<String, String> {
        self.spki.to_pem(LineEnding::LF).map_err(|e| e.to_string())
    }

    /// Verifies a DER-encoded signature over `message`.
    fn verify(&self, message: &[u8], der: &[u8]) -> Result<(), String> {
        UnparsedPublicKey::new(self.algorithm, self.spki.subject_public_key.raw_bytes())
            .verify(message, der)
            .map_err(|_| "ECDSA verification failed (or the signature is not DER)".to_string())
    }
}

/// A PEM public key is a few hundred bytes.
const KEY_FILE_LIMIT: u64 = 64 << 10;
/// DSSE allows several signatures on one envelope; model_signing writes one.
const MAX_SIGNATURES: usize = 16;
/// The certificates a bundle's chain may carry: a signing certificate and what leads from it to a
/// root is a handful (the walk stops at [`super::certificate::MAX_DEPTH`]). Each one costs a DER
/// decode and, for every issuer candidate, a signature check.
const MAX_CHAIN_CERTIFICATES: usize = 16;

fn at_most_certificates<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<RawCertificate>, D::Error> {
    at_most(
        deserializer,
        MAX_CHAIN_CERTIFICATES,
        "certificates (a signing certificate and the chain to its root is a handful)",
    )
}

fn at_most_signatures<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<EnvelopeSignature>, D::Error> {
    at_most(
        deserializer,
        MAX_SIGNATURES,
        "signatures (model_signing writes one)",
    )
}

/// A list of untrusted items, each of which costs a check: parsing stops at the first item past
/// `limit`, before the rest is read or kept, and the error names the bound.
fn at_most<'de, D, T>(deserializer: D, limit: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T> {
        limit: usize,
        what: &'static str,
        items: std::marker::PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {} {}", self.limit, self.what)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element()? {
                if items.len() == self.limit {
                    return Err(serde::de::Error::custom(format!(
                        "more than {} {}, refused without reading the rest",
                        self.limit, self.what
                    )));
                }
                items.push(item);
            }
            Ok(items)
        }
    }
    deserializer.deserialize_seq(Bounded {
        limit,
        what,
        items: std::marker::PhantomData,
    })
}

fn statement_to_manifest(path: &Path, statement: Statement) -> Result<Manifest, ManifestError> {
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
            let supported = match method {
                "files" => resource.algorithm == "sha256",
                _ => resource.algorithm.starts_with("sha256-sharded-"),
            };
            if !supported {
                return Err(unsupported_algorithm(path, index, &resource.algorithm));
            }
            Sha256::parse_hex(&resource.digest).map_err(|reason| {
                ManifestError::invalid(
                    path,
                    at_payload(&format!("predicate.resources[{index}].digest")),
                    reason,
                )
            })
        })
        .collect::<Result<Vec<Sha256>, ManifestError>>()?;
    let mut root = sha2::Sha256::new();
    for digest in &digests {
        root.update(digest.0);
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
    digests: &[Sha256],
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
            digest: Digest::Whole(*digest),
        });
    }
    Ok(Manifest::signed(ManifestFormat::ModelSigningFiles, files))
}

fn shards_manifest(
    path: &Path,
    resources: &[Resource],
    digests: &[Sha256],
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
            sha256: *digest,
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
        format!("unsupported hash algorithm {algorithm:?}; only sha256 bundles are verified (sign with hash_type sha256)"),
    )
}
