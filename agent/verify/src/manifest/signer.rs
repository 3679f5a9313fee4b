//! The signer fields an operator writes, the same in a model's config and on `verify`'s command
//! line, and the one place that decides what they mean together: a [`TrustPolicy`] is only ever
//! built from them by [`TryFrom`], which refuses a contradiction naming the field at fault.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{SigstoreRoot, SigstoreSigner, TrustPolicy};

/// Who must have signed a model_signing bundle, as `model_signing verify` takes it: one of a key,
/// a certificate chain or a keyless identity, or an explicit permission to trust it unchecked.
/// The field names are the config keys; with the `clap` feature they are also flags
/// (`--public-key`, or `--public_key`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default)]
pub struct SignerFields {
    /// PEM public key (ECDSA P-256, P-384 or P-521) that must have signed a model_signing bundle
    /// (`model_signing verify key`); with any signer given, an unsigned manifest is refused.
    #[cfg_attr(feature = "clap", arg(long, visible_alias = "public_key"))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<PathBuf>,
    /// PEM certificates (a root, or intermediates you trust) the bundle's signing certificate must
    /// chain to (`model_signing verify certificate`); repeat for several files.
    #[cfg_attr(feature = "clap", arg(long, visible_alias = "certificate_chain"))]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificate_chain: Vec<PathBuf>,
    /// Keyless (`model_signing verify sigstore`): the signer's identity in its certificate (an
    /// email, or a workload URI), matched exactly.
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// Keyless: the OpenID Connect issuer that vouched for the identity, matched exactly.
    #[cfg_attr(feature = "clap", arg(long, visible_alias = "identity_provider"))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_provider: Option<String>,
    /// Keyless: a trusted_root.json for a private Sigstore deployment, or model_signing's
    /// --trust-config file holding one (default: the public-good instance's, built in; nothing is
    /// fetched).
    #[cfg_attr(
        feature = "clap",
        arg(long, visible_aliases = ["trust_root", "trust-config"])
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust_root: Option<PathBuf>,
    /// Keyless: a bundle signed with Sigstore's staging instance (its root is built in too).
    #[cfg_attr(feature = "clap", arg(long, visible_alias = "use_staging"))]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub use_staging: bool,
    /// Trust a model_signing bundle's digests without checking its signature.
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_unsigned: bool,
}

/// One of the [`SignerFields`], for a front end to name in its own words (a config key, a flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignerField {
    PublicKey,
    CertificateChain,
    Identity,
    IdentityProvider,
    TrustRoot,
    UseStaging,
    AllowUnsigned,
}

impl SignerField {
    /// The field's name in [`SignerFields`] (and so its config key).
    pub fn key(self) -> &'static str {
        match self {
            SignerField::PublicKey => "public_key",
            SignerField::CertificateChain => "certificate_chain",
            SignerField::Identity => "identity",
            SignerField::IdentityProvider => "identity_provider",
            SignerField::TrustRoot => "trust_root",
            SignerField::UseStaging => "use_staging",
            SignerField::AllowUnsigned => "allow_unsigned",
        }
    }
}

/// Why [`SignerFields`] cannot be taken together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// A second way to check the signer, or a permission beside a signer.
    Contradicts(SignerField),
    /// A keyless signer needs both its identity and its issuer.
    KeylessNeedsBoth,
    /// A Sigstore instance chosen without a keyless signer.
    KeylessOnly,
}

/// [`SignerFields`] that cannot be taken together: the field at fault and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.explain(|field| field.key().to_string()))]
pub struct TrustConflict {
    pub field: SignerField,
    pub conflict: Conflict,
}

impl TrustConflict {
    /// The conflict in words, each field named by `name`.
    pub fn explain(&self, name: impl Fn(SignerField) -> String) -> String {
        format!("{}: {}", name(self.field), self.why(name))
    }

    /// Why the field at fault cannot be taken, other fields named by `name`.
    pub fn why(&self, name: impl Fn(SignerField) -> String) -> String {
        match self.conflict {
            Conflict::Contradicts(other) if self.field == SignerField::AllowUnsigned => {
                format!("contradicts {}: give one or the other", name(other))
            }
            Conflict::Contradicts(other) if self.field == SignerField::UseStaging => format!(
                "contradicts {}: one Sigstore instance vouches for the signer",
                name(other)
            ),
            Conflict::Contradicts(other) => format!(
                "contradicts {}: a bundle has one signer, give one way to check it",
                name(other)
            ),
            Conflict::KeylessNeedsBoth => format!(
                "keyless verification needs both {} and {} (the OpenID issuer)",
                name(SignerField::Identity),
                name(SignerField::IdentityProvider)
            ),
            Conflict::KeylessOnly => format!(
                "is for keyless verification: give {} and {} too",
                name(SignerField::Identity),
                name(SignerField::IdentityProvider)
            ),
        }
    }
}

impl TryFrom<SignerFields> for TrustPolicy {
    type Error = TrustConflict;

    fn try_from(fields: SignerFields) -> Result<TrustPolicy, TrustConflict> {
        let conflict = |field, conflict| Err(TrustConflict { field, conflict });
        let signers: Vec<SignerField> = [
            (SignerField::PublicKey, fields.public_key.is_some()),
            (
                SignerField::CertificateChain,
                !fields.certificate_chain.is_empty(),
            ),
            (SignerField::Identity, fields.identity.is_some()),
        ]
        .into_iter()
        .filter_map(|(field, given)| given.then_some(field))
        .collect();
        if let [first, second, ..] = signers[..] {
            return conflict(second, Conflict::Contradicts(first));
        }
        match (&fields.identity, &fields.identity_provider) {
            (Some(_), None) => {
                return conflict(SignerField::IdentityProvider, Conflict::KeylessNeedsBoth)
            }
            (None, Some(_)) => return conflict(SignerField::Identity, Conflict::KeylessNeedsBoth),
            _ => {}
        }
        for (field, given) in [
            (SignerField::TrustRoot, fields.trust_root.is_some()),
            (SignerField::UseStaging, fields.use_staging),
        ] {
            if given && fields.identity.is_none() {
                return conflict(field, Conflict::KeylessOnly);
            }
        }
        if fields.trust_root.is_some() && fields.use_staging {
            return conflict(
                SignerField::UseStaging,
                Conflict::Contradicts(SignerField::TrustRoot),
            );
        }
        if let (Some(&signer), true) = (signers.first(), fields.allow_unsigned) {
            return conflict(SignerField::AllowUnsigned, Conflict::Contradicts(signer));
        }
        Ok(match fields {
            SignerFields {
                public_key: Some(key),
                ..
            } => TrustPolicy::PublicKey(key),
            SignerFields {
                certificate_chain, ..
            } if !certificate_chain.is_empty() => TrustPolicy::CertificateChain(certificate_chain),
            SignerFields {
                identity: Some(identity),
                identity_provider: Some(issuer),
                trust_root,
                use_staging,
                ..
            } => TrustPolicy::Sigstore(SigstoreSigner {
                identity,
                issuer,
                root: match (trust_root, use_staging) {
                    (Some(file), _) => SigstoreRoot::File(file),
                    (None, true) => SigstoreRoot::Staging,
                    (None, false) => SigstoreRoot::PublicGood,
                },
            }),
            SignerFields {
                allow_unsigned: true,
                ..
            } => TrustPolicy::AllowUnsigned,
            _ => TrustPolicy::RequireKey,
        })
    }
}

/// The fields a policy was read from, so that `mlnode-agent config` prints what was written.
impl From<TrustPolicy> for SignerFields {
    fn from(policy: TrustPolicy) -> SignerFields {
        match policy {
            TrustPolicy::PublicKey(key) => SignerFields {
                public_key: Some(key),
                ..SignerFields::default()
            },
            TrustPolicy::CertificateChain(chain) => SignerFields {
                certificate_chain: chain,
                ..SignerFields::default()
            },
            TrustPolicy::Sigstore(signer) => SignerFields {
                identity: Some(signer.identity),
                identity_provider: Some(signer.issuer),
                trust_root: match &signer.root {
                    SigstoreRoot::File(file) => Some(file.clone()),
                    SigstoreRoot::PublicGood | SigstoreRoot::Staging => None,
                },
                use_staging: signer.root == SigstoreRoot::Staging,
                ..SignerFields::default()
            },
            TrustPolicy::AllowUnsigned => SignerFields {
                allow_unsigned: true,
                ..SignerFields::default()
            },
            TrustPolicy::RequireKey => SignerFields::default(),
        }
    }
}
