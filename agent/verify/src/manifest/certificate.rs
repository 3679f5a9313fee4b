//! `model_signing sign certificate` bundles: the signer is a certificate the operator's
//! certificates vouch for. What model_signing's verifier checks (`_signing/sign_certificate.py`,
//! OpenSSL's `X509_verify_cert` with the operator's certificates as the trust store and the rest of
//! the bundle's chain as untrusted intermediates), checked here the same way:
//!
//! - a path from the bundle's signing certificate, through the bundle's other certificates, to one
//!   of the operator's (a root, or an intermediate the operator chose to trust), each certificate
//!   signed by the next (RSA PKCS#1 v1.5 or ECDSA on P-256/P-384, SHA-256 to SHA-512);
//! - every certificate on it valid at the signing certificate's `notBefore`, model_signing's stand-in
//!   for the signing time (such bundles carry no timestamp), so that an expired certificate does
//!   not break old signatures;
//! - every issuer a CA (basic constraints) within its path length constraint, allowed to sign
//!   certificates where it says what it may do (key usage); no critical extension this check does
//!   not understand;
//! - the signing certificate meant for signing: key usage `digitalSignature` or extended key usage
//!   `codeSigning`.
//!
//! Deliberately like OpenSSL and unlike a web PKI validator: a signing certificate marked CA is
//! accepted (model-transparency's own test certificates are).

use std::path::{Path, PathBuf};

use base64::Engine;
use sigstore_verify::crypto::SigningScheme;
use sigstore_verify::types::{DerPublicKey, SignatureBytes};
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages};
use x509_cert::Certificate;

use super::ManifestError;

const BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
const KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");
const EXTENDED_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const CODE_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.3");

/// A chain longer than this is not a signing chain; the walk stops there.
pub(super) const MAX_DEPTH: usize = 8;
/// A PEM file of a few certificates.
const CHAIN_FILE_LIMIT: u64 = 1 << 20;

/// The SubjectPublicKeyInfo (DER) of the bundle's signing certificate, once it is shown to chain to
/// one of the certificates in `chain_files`. `chain` is the bundle's
/// `verificationMaterial.x509CertificateChain` (base64 DER, signing certificate first), or None
/// when the bundle has none; `signer` names the configured chain in errors.
pub(super) fn signing_key(
    path: &Path,
    chain_files: &[PathBuf],
    signer: &str,
    chain: Option<&[&str]>,
) -> Result<Vec<u8>, ManifestError> {
    let anchors = load_anchors(chain_files)?;
    let wrong_signer = |reason: String| ManifestError::WrongSigner {
        path: path.to_path_buf(),
        signer: signer.to_string(),
        reason,
    };
    let chain = chain.ok_or_else(|| {
        wrong_signer(
            "the bundle carries no certificate chain (was it signed with a key, or keyless?)"
                .into(),
        )
    })?;
    let certificates = chain
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let at = format!(
                "$[\"verificationMaterial\"][\"x509CertificateChain\"][\"certificates\"][{i}]"
            );
            base64::engine::general_purpose::STANDARD
                .decode(raw)
                .map_err(|e| e.to_string())
                .and_then(|der| Certificate::from_der(&der).map_err(|e| e.to_string()))
                .map_err(|e| {
                    ManifestError::invalid(path, at, format!("not a DER certificate: {e}"))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (leaf, intermediates) = certificates.split_first().ok_or_else(|| {
        ManifestError::invalid(
            path,
            "$[\"verificationMaterial\"][\"x509CertificateChain\"]",
            "lists no certificate",
        )
    })?;
    check_path(leaf, intermediates, &anchors).map_err(wrong_signer)?;
    leaf.tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| wrong_signer(format!("the signing certificate's key: {e}")))
}

fn load_anchors(files: &[PathBuf]) -> Result<Vec<Certificate>, ManifestError> {
    let mut anchors = Vec::new();
    for file in files {
        let bad = |reason: String| ManifestError::BadTrustMaterial {
            what: "certificate chain",
            path: file.clone(),
            reason,
        };
        let pem = mlnode_files::read_bounded_text(file, CHAIN_FILE_LIMIT)
            .map_err(|e| bad(format!("cannot read: {e}")))?;
        let certificates = Certificate::load_pem_chain(pem.as_bytes()).map_err(|e| {
            bad(format!(
                "not PEM certificates (\"-----BEGIN CERTIFICATE-----\"): {e}"
            ))
        })?;
        if certificates.is_empty() {
            return Err(bad("holds no certificate".into()));
        }
        anchors.extend(certificates);
    }
    Ok(anchors)
}

/// Walks from `leaf` to a trusted certificate; the error says where the path broke.
fn check_path(
    leaf: &Certificate,
    intermediates: &[Certificate],
    anchors: &[Certificate],
) -> Result<(), String> {
    let signing_time = leaf.tbs_certificate.validity.not_before.to_unix_duration();
    check_meant_for_signing(leaf)?;
    let mut current = leaf;
    // How many CA certificates stand between the issuer looked for and the signing certificate:
    // what an issuer's path length constraint limits.
    for cas_below in 0..MAX_DEPTH {
        check_valid_at(current, signing_time)?;
        check_critical_extensions(current)?;
        if anchors.contains(current) {
            return Ok(());
        }
        let issued_by = |candidate: &&Certificate| {
            candidate.tbs_certificate.subject == current.tbs_certificate.issuer
                && signed_by(current, candidate).is_ok()
        };
        if let Some(anchor) = anchors.iter().find(issued_by) {
            check_issuer(anchor, cas_below)?;
            return check_valid_at(anchor, signing_time);
        }
        let Some(next) = intermediates.iter().find(issued_by) else {
            return Err(format!(
                "no certificate given or in the bundle issued {} (issuer {}){}",
                subject(current),
                current.tbs_certificate.issuer,
                match intermediates
                    .iter()
                    .chain(anchors)
                    .find(|c| { c.tbs_certificate.subject == current.tbs_certificate.issuer })
                {
                    Some(named) => format!(
                        "; {} has that name, but its key did not sign it: {}",
                        subject(named),
                        signed_by(current, named).err().unwrap_or_default()
                    ),
                    None => String::new(),
                }
            ));
        };
        check_issuer(next, cas_below)?;
        current = next;
    }
    Err(format!(
        "no trusted certificate within {MAX_DEPTH} certificates"
    ))
}

fn subject(certificate: &Certificate) -> String {
    format!("\"{}\"", certificate.tbs_certificate.subject)
}

fn extension<'a, T: Decode<'a>>(
    certificate: &'a Certificate,
    oid: ObjectIdentifier,
) -> Result<Option<T>, String> {
    let Some(found) = certificate
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .find(|e| e.extn_id == oid)
    else {
        return Ok(None);
    };
    T::from_der(found.extn_value.as_bytes())
        .map(Some)
        .map_err(|e| {
            format!(
                "{}: extension {oid} is malformed: {e}",
                subject(certificate)
            )
        })
}

fn check_meant_for_signing(leaf: &Certificate) -> Result<(), String> {
    let signs = extension::<KeyUsage>(leaf, KEY_USAGE)?
        .is_some_and(|usage| usage.0.contains(KeyUsages::DigitalSignature));
    let code_signing = extension::<ExtendedKeyUsage>(leaf, EXTENDED_KEY_USAGE)?
        .is_some_and(|usage| usage.0.contains(&CODE_SIGNING));
    if signs || code_signing {
        Ok(())
    } else {
        Err(format!(
            "the signing certificate {} is not meant for signing (neither key usage digitalSignature nor extended key usage codeSigning)",
            subject(leaf)
        ))
    }
}

fn check_issuer(issuer: &Certificate, cas_below: usize) -> Result<(), String> {
    let constraints = extension::<BasicConstraints>(issuer, BASIC_CONSTRAINTS)?;
    let Some(constraints) = constraints.filter(|b| b.ca) else {
        return Err(format!(
            "{} signed a certificate but is not a CA (basic constraints)",
            subject(issuer)
        ));
    };
    if let Some(limit) = constraints.path_len_constraint {
        if cas_below > usize::from(limit) {
            return Err(format!(
                "{} allows at most {limit} CA certificates below it (path length constraint), the chain has {cas_below}",
                subject(issuer)
            ));
        }
    }
    if let Some(usage) = extension::<KeyUsage>(issuer, KEY_USAGE)? {
        if !usage.0.contains(KeyUsages::KeyCertSign) {
            return Err(format!(
                "{} signed a certificate but its key usage does not allow it (keyCertSign)",
                subject(issuer)
            ));
        }
    }
    Ok(())
}

fn check_valid_at(certificate: &Certificate, time: std::time::Duration) -> Result<(), String> {
    let validity = &certificate.tbs_certificate.validity;
    let (from, until) = (
        validity.not_before.to_unix_duration(),
        validity.not_after.to_unix_duration(),
    );
    if time < from || time > until {
        return Err(format!(
            "{} was not valid when the signing certificate was issued ({} to {})",
            subject(certificate),
            validity.not_before,
            validity.not_after
        ));
    }
    Ok(())
}

fn check_critical_extensions(certificate: &Certificate) -> Result<(), String> {
    let understood = [
        BASIC_CONSTRAINTS,
        KEY_USAGE,
        EXTENDED_KEY_USAGE,
        SUBJECT_ALT_NAME,
    ];
    match certificate
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .find(|e| e.critical && !understood.contains(&e.extn_id))
    {
        Some(e) => Err(format!(
            "{} has a critical extension this check does not enforce ({})",
            subject(certificate),
            e.extn_id
        )),
        None => Ok(()),
    }
}

/// Whether `issuer`'s key made `certificate`'s signature, for the signature algorithms CAs use.
fn signed_by(certificate: &Certificate, issuer: &Certificate) -> Result<(), String> {
    let schemes: &[SigningScheme] = match certificate.signature_algorithm.oid.to_string().as_str() {
        "1.2.840.113549.1.1.11" => &[SigningScheme::RsaPkcs1Sha256],
        "1.2.840.113549.1.1.12" => &[SigningScheme::RsaPkcs1Sha384],
        "1.2.840.113549.1.1.13" => &[SigningScheme::RsaPkcs1Sha512],
        "1.2.840.10045.4.3.2" => &[
            SigningScheme::EcdsaP256Sha256,
            SigningScheme::EcdsaP384Sha256,
        ],
        "1.2.840.10045.4.3.3" => &[
            SigningScheme::EcdsaP384Sha384,
            SigningScheme::EcdsaP256Sha384,
        ],
        other => return Err(format!("signature algorithm {other} is not supported")),
    };
    let tbs = certificate
        .tbs_certificate
        .to_der()
        .map_err(|e| e.to_string())?;
    let key = issuer
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| e.to_string())?;
    let signature = certificate
        .signature
        .as_bytes()
        .ok_or("the signature is not whole bytes")?;
    let mut last = String::new();
    for scheme in schemes {
        match sigstore_verify::crypto::verify_signature(
            &DerPublicKey::new(key.clone()),
            &tbs,
            &SignatureBytes::new(signature.to_vec()),
            *scheme,
        ) {
            Ok(()) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}
