//! The sigstore bundle as model_signing writes it (`model_signing sign`, bundle v0.3): the DSSE
//! envelope and the verification material, read with every list of untrusted, costly items
//! bounded as it is read.

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Bundle {
    pub(super) media_type: String,
    #[serde(default)]
    pub(super) verification_material: Option<VerificationMaterial>,
    pub(super) dsse_envelope: Envelope,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct VerificationMaterial {
    #[serde(default)]
    pub(super) public_key: Option<PublicKeyIdentifier>,
    /// `model_signing sign certificate`: the signing certificate first, then what leads to a root.
    #[serde(default)]
    pub(super) x509_certificate_chain: Option<CertificateChain>,
}

#[derive(Deserialize)]
pub(super) struct CertificateChain {
    #[serde(deserialize_with = "at_most_certificates")]
    pub(super) certificates: Vec<RawCertificate>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawCertificate {
    /// Base64 DER.
    pub(super) raw_bytes: String,
}

#[derive(Deserialize)]
pub(super) struct PublicKeyIdentifier {
    #[serde(default)]
    pub(super) hint: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Envelope {
    pub(super) payload: String,
    pub(super) payload_type: String,
    #[serde(deserialize_with = "at_most_signatures")]
    pub(super) signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
pub(super) struct EnvelopeSignature {
    pub(super) sig: String,
}

/// DSSE allows several signatures on one envelope; model_signing writes one.
const MAX_SIGNATURES: usize = 16;
/// The certificates a bundle's chain may carry: a signing certificate and what leads from it to a
/// root is a handful (the walk stops at [`crate::manifest::certificate::MAX_DEPTH`]). Each one costs a DER
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
