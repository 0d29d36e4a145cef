//! Property tests for routing, key validation and envelope decoding.

use hicache_core::PageKey;
use hicache_core::raw::envelope::{Header, MAGIC};
use hicache_core::raw::routing::{bucket_name, route, route_hash};
use hicache_core::raw::{Namespace, ObjectKey};
use proptest::prelude::*;

proptest! {
    #[test]
    fn routing_is_stable_and_in_range(name in "[a-zA-Z0-9_:-]{1,100}", dirs in 1usize..16) {
        let key = ObjectKey::new(name.clone()).unwrap();
        let r = route(&key, dirs).unwrap();
        prop_assert!(r.dir < dirs);
        prop_assert_eq!(r, route(&ObjectKey::new(name).unwrap(), dirs).unwrap());
        prop_assert_eq!(r.bucket as u64, key.hash() & 0xff);
        prop_assert_eq!(r.dir as u64, (key.hash() >> 16) % dirs as u64);
        let b = bucket_name(r.bucket);
        prop_assert!(b.iter().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn route_hash_never_panics(h in any::<u64>(), dirs in 0usize..64) {
        let r = route_hash(h, dirs);
        prop_assert_eq!(r.is_ok(), dirs > 0);
    }

    #[test]
    fn accepted_keys_cannot_escape_a_root(s in "\\PC{0,200}") {
        if let Ok(k) = PageKey::new(s.clone()) {
            let k = k.as_str();
            prop_assert!(!k.is_empty() && !k.contains('/') && !k.contains('\\'));
            prop_assert!(!k.starts_with('.') && !k.chars().any(char::is_control));
        }
        if s.contains('/') || s.starts_with('.') {
            prop_assert!(ObjectKey::new(s).is_err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_decode_and_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        prop_assert!(Header::decode(&bytes).is_err());
        let mut with_magic = bytes.clone();
        if with_magic.len() >= 8 {
            with_magic[..8].copy_from_slice(&MAGIC);
            prop_assert!(Header::decode(&with_magic).is_err());
        }
    }

    #[test]
    fn headers_round_trip_and_detect_any_flip(
        ns in any::<[u8; 16]>(), key_hash in any::<u64>(), len in any::<u64>(), sum in any::<u64>(),
        flags in any::<u16>(), flip in 0usize..(64 * 8),
    ) {
        let h = Header { flags, header_len: 4096, namespace: Namespace::from_bytes(ns), key_hash, payload_len: len, checksum: sum };
        let mut buf = vec![0u8; 4096];
        buf[..64].copy_from_slice(&h.encode());
        prop_assert_eq!(Header::decode(&buf).unwrap(), h);
        buf[flip / 8] ^= 1 << (flip % 8);
        prop_assert!(Header::decode(&buf).is_err());
    }
}
