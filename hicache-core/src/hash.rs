//! The name hash SGLang's `nixl_routing` uses: blake2b with an 8-byte digest, read
//! big-endian. Keys record it when they are built; routing picks dirs and buckets by it.

use blake2::digest::consts::U8;
use blake2::{Blake2b, Digest};

/// The stable 64-bit hash of an object name.
pub fn key_hash(name: &str) -> u64 {
    let digest = Blake2b::<U8>::digest(name.as_bytes());
    u64::from_be_bytes(digest.into())
}
