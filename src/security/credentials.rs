//! Stored credentials: SHA-256 digests, matched in constant time.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Prefix of a stored credential digest in the client registry.
pub const PREFIX: &str = "sha256:";

/// The SHA-256 digest of a secret (API key, bearer token, or `user:password`).
///
/// Secrets are issued high-entropy (`proxy-pool hash-credential --generate`),
/// so a fast hash is enough; only digests are ever stored.
#[derive(Clone, PartialEq, Eq)]
pub struct CredentialHash([u8; 32]);

impl std::fmt::Debug for CredentialHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialHash(..)")
    }
}

impl CredentialHash {
    /// Hashes a presented secret.
    pub fn of(secret: &[u8]) -> Self {
        Self(Sha256::digest(secret).into())
    }

    /// Parses `sha256:<64 hex>` from the registry document.
    pub fn parse(s: &str) -> Option<Self> {
        let hex_digest = s.strip_prefix(PREFIX)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_digest, &mut out).ok()?;
        Some(Self(out))
    }

    /// The registry form, `sha256:<64 hex>`.
    pub fn encode(&self) -> String {
        format!("{PREFIX}{}", self.hex())
    }

    /// The digest in lowercase hex.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Constant-time equality.
    pub fn matches(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

/// Index of the entry matching `presented`, comparing against every entry in
/// constant time, so a wrong and an unknown credential take the same path.
pub fn find<'a, T>(
    presented: &CredentialHash,
    entries: impl Iterator<Item = (&'a CredentialHash, T)>,
) -> Option<T> {
    let mut found = None;
    for (stored, value) in entries {
        // No early exit: every stored digest is compared.
        if stored.matches(presented) && found.is_none() {
            found = Some(value);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digests round-trip through their registry form and match only themselves.
    #[test]
    fn round_trip_and_match() {
        let h = CredentialHash::of(b"pk_live_secret");
        let parsed = CredentialHash::parse(&h.encode()).unwrap();
        assert!(parsed.matches(&h));
        assert!(!parsed.matches(&CredentialHash::of(b"pk_live_secreT")));
        assert!(CredentialHash::parse("sha256:zz").is_none());
        assert!(CredentialHash::parse(&h.encode().replace("sha256:", "md5:")).is_none());
        assert_eq!(format!("{h:?}"), "CredentialHash(..)");
    }

    /// `find` returns the first match among many.
    #[test]
    fn finds_among_many() {
        let stored: Vec<CredentialHash> = (0..10)
            .map(|i| CredentialHash::of(format!("k{i}").as_bytes()))
            .collect();
        let hit = find(
            &CredentialHash::of(b"k7"),
            stored.iter().enumerate().map(|(i, h)| (h, i)),
        );
        assert_eq!(hit, Some(7));
        let miss = find(
            &CredentialHash::of(b"k10"),
            stored.iter().enumerate().map(|(i, h)| (h, i)),
        );
        assert_eq!(miss, None);
    }
}
