//! A key-signed bundle (`model_signing sign key`, and the key a certificate chain vouches for):
//! the DSSE signature over the envelope's pre-authentication encoding, ECDSA on P-256, P-384 or
//! P-521.

use std::path::Path;

use aws_lc_rs::signature::{self as ecdsa, UnparsedPublicKey, VerificationAlgorithm};
use sha2::Digest as _;
use sigstore_verify::types::pae;
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::pem::LineEnding;
use x509_cert::der::{Decode, EncodePem};
use x509_cert::spki::SubjectPublicKeyInfoOwned;

use super::bundle::Bundle;
use super::{base64_decode, IN_TOTO_PAYLOAD_TYPE};
use crate::manifest::ManifestError;

pub(super) fn check_signature(
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
    let pem = mlnode_files::read_bounded_text(key_path, KEY_FILE_LIMIT)
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
pub(super) fn verify_envelope(
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
pub(super) struct SignerKey {
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
    pub(super) fn from_spki_der(der: &[u8]) -> Result<SignerKey, String> {
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
