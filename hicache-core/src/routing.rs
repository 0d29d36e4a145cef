//! Routing of objects over several storage dirs and 256 bucket dirs, bit-compatible with
//! SGLang's `nixl_routing`: `h = blake2b-64(name)` big-endian, dir `(h >> 16) % n`,
//! bucket = two hex chars of `h & 0xff`.

use crate::error::{Error, Result};
use crate::key::ObjectKey;

/// Number of bucket dirs under each storage dir.
pub const BUCKETS: usize = 256;

pub use crate::hash::key_hash;

/// Where an object lives among `dirs` storage dirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Index of the storage dir.
    pub dir: usize,
    /// Bucket number `0..256`; its dir name is [`bucket_name`].
    pub bucket: u8,
}

/// Routes `key` over `dirs` storage dirs.
pub fn route(key: &ObjectKey, dirs: usize) -> Result<Route> {
    route_hash(key.hash(), dirs)
}

/// Routes a precomputed hash over `dirs` storage dirs.
pub fn route_hash(hash: u64, dirs: usize) -> Result<Route> {
    if dirs == 0 {
        return Err(Error::InvalidBatch {
            reason: "routing needs at least one storage dir".into(),
        });
    }
    Ok(Route {
        dir: ((hash >> 16) % dirs as u64) as usize,
        bucket: (hash & 0xff) as u8,
    })
}

/// The two-hex-char dir name of a bucket (`00`..`ff`).
pub fn bucket_name(bucket: u8) -> [u8; 2] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    [HEX[(bucket >> 4) as usize], HEX[(bucket & 0xf) as usize]]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routes SGLang's NIXL routing (`nixl_routing.py`: blake2b-64, disk `(h >> 16) % n`,
    /// bucket `h & 0xFF`) gives these keys.
    #[test]
    fn sglang_vectors() {
        let zeros = "0".repeat(64);
        let cases: [(String, u64, [usize; 4], &str); 4] = [
            ("abc".into(), 0xd8bb14d833d59559, [0, 1, 0, 1], "59"),
            (
                format!("{zeros}_Qwen-Qwen3-8B_0_1_k"),
                0x4ac0feaa9c9d94d6,
                [0, 1, 1, 1],
                "d6",
            ),
            (
                format!("{zeros}_Qwen-Qwen3-8B_0_1_v"),
                0xb7e70498f9970746,
                [0, 1, 1, 3],
                "46",
            ),
            (
                format!("{zeros}_Qwen-Qwen3-8B_0_1"),
                0xe44a2b4d4d37aa79,
                [0, 1, 2, 3],
                "79",
            ),
        ];
        for (name, hash, disks, bucket) in cases {
            let key = ObjectKey::new(name.clone()).unwrap();
            assert_eq!(key.hash(), hash, "{name}");
            for (n, want) in (1..=4).zip(disks) {
                let r = route(&key, n).unwrap();
                assert_eq!(r.dir, want, "{name} over {n} dirs");
                assert_eq!(&bucket_name(r.bucket), bucket.as_bytes());
            }
        }
    }

    #[test]
    fn zero_dirs_is_an_error() {
        let key = ObjectKey::new("abc").unwrap();
        assert!(route(&key, 0).is_err());
    }

    #[test]
    fn bucket_names() {
        assert_eq!(&bucket_name(0), b"00");
        assert_eq!(&bucket_name(0xff), b"ff");
        assert_eq!(&bucket_name(0x0a), b"0a");
    }
}
