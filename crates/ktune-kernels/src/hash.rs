//! SHA-256 as lowercase hex: the one hashing helper behind device fingerprints,
//! cache keys and kernel-set hashes.

use sha2::{Digest, Sha256};

/// An incremental SHA-256 whose result is lowercase hex.
#[derive(Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn new() -> Hasher {
        Hasher::default()
    }

    /// Feeds `bytes` as they are.
    pub fn update(&mut self, bytes: impl AsRef<[u8]>) -> &mut Hasher {
        self.0.update(bytes.as_ref());
        self
    }

    /// Feeds `bytes` followed by a zero byte, so that consecutive parts cannot run
    /// into each other (`"ab", "c"` and `"a", "bc"` hash differently).
    pub fn part(&mut self, bytes: impl AsRef<[u8]>) -> &mut Hasher {
        self.update(bytes).update([0u8])
    }

    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    let mut h = Hasher::new();
    h.update(bytes);
    h.finish()
}

/// SHA-256 of `parts`, each followed by a zero byte, hex.
pub fn sha256_parts<I>(parts: I) -> String
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let mut h = Hasher::new();
    for p in parts {
        h.part(p);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        // Parts are separated: the same bytes split differently hash differently.
        assert_ne!(sha256_parts(["ab", "c"]), sha256_parts(["a", "bc"]));
        assert_eq!(sha256_parts(["a", "b"]), sha256_hex(b"a\0b\0"));
    }
}
