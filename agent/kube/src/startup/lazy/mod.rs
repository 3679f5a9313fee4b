//! Where a lazily loaded image's pull time went: under a lazily loading snapshotter (AWS's SOCI
//! snapshotter, as EKS's SOCI nodes run it) the `Pulled` event says little, and the image's bytes
//! are fetched while the container starts and the model loads. This splits the snapshotter's own
//! per-layer figures over one pod's startup phases.
//!
//! - [`soci`]: soci-snapshotter's Prometheus metrics, read into per-layer readings;
//! - [`content_store`]: the layers of a pod's image, from containerd's content store;
//! - [`split`]: the readings taken during a startup, split over its phases (pure);
//! - [`sampler`]: reading the snapshotter's metrics socket while pods start.

pub mod content_store;
pub mod sampler;
pub mod soci;
pub mod split;

/// A content digest as OCI writes it, `sha256:` and 64 lowercase hex digits: the only form read
/// as a file name or matched against the snapshotter's labels. Shared, not copied, between the
/// readings that name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(std::sync::Arc<str>);

impl Digest {
    pub fn parse(text: &str) -> Result<Digest, String> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("{text:?} is not a sha256 digest"))?;
        if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Digest(text.into()))
        } else {
            Err(format!(
                "{text:?} is not a sha256 digest (64 lowercase hex digits)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits: the blob's file name in a content store.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sha256_digest_of_64_lowercase_hex_digits_is_one() {
        let hex = "85acc76c69b63036bc0272ec39686538cb14c313f705c3af0ddb71849b241ab4";
        let digest = Digest::parse(&format!("sha256:{hex}")).unwrap();
        assert_eq!(digest.hex(), hex);
        for bad in [
            hex.to_string(),
            format!("sha512:{hex}"),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[1..]),
            format!("sha256:../../{}", &hex[6..]),
        ] {
            assert!(Digest::parse(&bad).is_err(), "{bad}");
        }
    }
}
