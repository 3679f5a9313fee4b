//! A keyless bundle (`model_signing sign sigstore`): a Fulcio certificate for an identity and
//! issuer, logged in Rekor, checked offline by `sigstore-verify` against a trusted root.

use std::path::Path;

use super::bundle::Bundle;
use super::statement::Statement;
use crate::manifest::{ManifestError, SigstoreRoot, SigstoreSigner};

/// Keyless: `sigstore-verify` checks the Fulcio certificate chain and its SCT against the trusted
/// root, the identity and issuer exactly, the Rekor entry's inclusion proof, checkpoint and promise,
/// the certificate's validity at the logged time, and the DSSE signature; the statement's subject
/// is what the signature must bind (its resources are checked to hash to it afterwards).
pub(super) fn check(
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
        SigstoreRoot::File(file) => mlnode_files::read_bounded_text(file, TRUST_ROOT_LIMIT)
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
