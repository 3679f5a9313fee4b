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

//!
//! By layer: [`bundle`] reads the bundle (its own bounded types: a flood of signatures or
//! certificates is refused before it is read whole, which sigstore's unbounded types would read
//! first, so they only ever see a bundle this has bounded); [`key`] and [`keyless`] check the
//! signer (the certificate chain is [`super::certificate`]); [`statement`] checks the signed
//! statement and turns it into a [`Manifest`].

mod bundle;
mod key;
mod keyless;
mod statement;

use std::path::Path;

use base64::Engine;

use super::{parse_json, Manifest, ManifestError, TrustPolicy};
use bundle::Bundle;
use key::SignerKey;

/// The DSSE payload type of an in-toto statement, the only one model_signing signs.
const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

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
    let statement = statement::parse(path, &payload)?;
    // The configured signer in words, for every error that names it.
    let signer = trust.signer().unwrap_or_default();
    match trust {
        TrustPolicy::PublicKey(key_path) => {
            key::check_signature(path, key_path, &signer, &bundle, &payload)?
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
            key::verify_envelope(path, &signer, &key, &bundle, &payload)?;
        }
        TrustPolicy::Sigstore(sigstore) => {
            keyless::check(path, bytes, &bundle, &statement, sigstore, &signer)?
        }
        TrustPolicy::AllowUnsigned => {}
        TrustPolicy::RequireKey => {
            return Err(ManifestError::Unsigned {
                path: path.to_path_buf(),
            })
        }
    }
    statement::to_manifest(path, statement)
}

pub(super) fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not valid base64: {e}"))
}
