//! The page envelope: an aligned header in front of the payload, so a torn, truncated,
//! corrupt or foreign object reads as a miss with a reason, never as data.
//!
//! ```text
//! offset  size  field
//!      0     8  magic  b"HICACHE\0"
//!      8     2  format version (1)
//!     10     2  flags (bit 0: anchor marker)
//!     12     4  header length = payload offset (4096, or the storage's alignment if larger)
//!     16    16  namespace digest
//!     32     8  object key hash (blake2b-64 of the object name)
//!     40     8  payload length (before padding)
//!     48     8  payload checksum (xxh3-64)
//!     56     8  header checksum (xxh3-64 of bytes 0..56)
//!     64     …  zero up to the header length, then the payload, then zero padding up to the
//!               I/O alignment
//! ```
//! The payload sits at an aligned offset, so an O_DIRECT read lands straight in host memory.
//! All integers are little-endian.

use std::hash::Hasher;

use std::sync::LazyLock;

use twox_hash::XxHash3_64;
use twox_hash::xxhash3_64::{DEFAULT_SECRET_LENGTH, RawHasher, SecretBuffer};

use crate::backend::MissReason;
use crate::key::Namespace;
use crate::memory::align_up;

/// Magic bytes at the start of every enveloped object.
pub const MAGIC: [u8; 8] = *b"HICACHE\0";
/// Current format version.
pub const VERSION: u16 = 1;
/// Smallest header length; larger when the storage's alignment is larger.
pub const MIN_HEADER_LEN: u64 = 4096;
/// Bytes of the header that carry fields (the rest is zero).
pub const HEADER_FIELDS_LEN: usize = 64;
/// Flag bit: the payload is an anchor marker, not KV bytes.
pub const FLAG_ANCHOR: u16 = 1;
/// Flag bit: the payload has no checksum (`checksum` is 0). Written for pages of a device
/// pool, whose bytes move between the GPU and storage by DMA and never pass through host
/// memory where a checksum could be computed; every other field is still checked on read.
pub const FLAG_UNCHECKED: u16 = 2;

/// How objects are framed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PageFormat {
    /// Header + payload + checksum (the default).
    #[default]
    Envelope,
    /// Payload only, as SGLang writes it; only the object length is checked on read.
    Raw,
}

impl std::fmt::Display for PageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageFormat::Envelope => "envelope",
            PageFormat::Raw => "raw",
        })
    }
}

/// Header length for a storage with I/O alignment `align`.
pub fn header_len(align: u64) -> u64 {
    align_up(MIN_HEADER_LEN, align.max(1))
}

/// Bytes an enveloped object of `payload_len` occupies under alignment `align`; `None` when
/// that does not fit in a `u64`.
pub fn object_len(payload_len: u64, align: u64) -> Option<u64> {
    let align = align.max(1);
    let payload = payload_len.checked_next_multiple_of(align)?;
    MIN_HEADER_LEN
        .checked_next_multiple_of(align)?
        .checked_add(payload)
}

/// The decoded fields of a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Flags.
    pub flags: u16,
    /// Header length (payload offset).
    pub header_len: u64,
    /// Namespace digest of the writer.
    pub namespace: Namespace,
    /// Hash of the object name.
    pub key_hash: u64,
    /// Payload length before padding.
    pub payload_len: u64,
    /// xxh3-64 of the payload.
    pub checksum: u64,
}

impl Header {
    /// The header's [`HEADER_FIELDS_LEN`] bytes, self-checksummed. `header_len` is stored in 32
    /// bits: lengths above `u32::MAX` are stored as `u32::MAX` (no writer makes such a header).
    pub fn encode(&self) -> [u8; HEADER_FIELDS_LEN] {
        let mut out = [0u8; HEADER_FIELDS_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&VERSION.to_le_bytes());
        out[10..12].copy_from_slice(&self.flags.to_le_bytes());
        let header_len = u32::try_from(self.header_len).unwrap_or(u32::MAX);
        out[12..16].copy_from_slice(&header_len.to_le_bytes());
        out[16..32].copy_from_slice(self.namespace.as_bytes());
        out[32..40].copy_from_slice(&self.key_hash.to_le_bytes());
        out[40..48].copy_from_slice(&self.payload_len.to_le_bytes());
        out[48..56].copy_from_slice(&self.checksum.to_le_bytes());
        let hc = XxHash3_64::oneshot(&out[0..56]);
        out[56..64].copy_from_slice(&hc.to_le_bytes());
        out
    }

    /// Parses and self-checks a header (magic, version, header checksum).
    pub fn decode(bytes: &[u8]) -> Result<Header, MissReason> {
        let bad = |detail: &str| MissReason::BadHeader {
            detail: detail.to_string(),
        };
        if bytes.len() < HEADER_FIELDS_LEN {
            return Err(bad("object shorter than a header"));
        }
        if bytes[0..8] != MAGIC {
            return Err(bad("no hicache magic (raw or foreign object)"));
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        if u64_at(56) != XxHash3_64::oneshot(&bytes[0..56]) {
            return Err(bad("header checksum mismatch"));
        }
        let version = u16_at(8);
        if version != VERSION {
            return Err(MissReason::BadHeader {
                detail: format!("format version {version}, this build reads {VERSION}"),
            });
        }
        let mut ns = [0u8; 16];
        ns.copy_from_slice(&bytes[16..32]);
        let header = Header {
            flags: u16_at(10),
            header_len: u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as u64,
            namespace: Namespace::from_bytes(ns),
            key_hash: u64_at(32),
            payload_len: u64_at(40),
            checksum: u64_at(48),
        };
        // Every length a reader derives from the header must be representable: a header
        // whose checksum is valid can still be crafted.
        if header.header_len < HEADER_FIELDS_LEN as u64 {
            return Err(MissReason::BadHeader {
                detail: format!(
                    "header length {} is shorter than the header's fields",
                    header.header_len
                ),
            });
        }
        if header.header_len.checked_add(header.payload_len).is_none() {
            return Err(MissReason::BadHeader {
                detail: format!(
                    "payload length {} overflows the object size",
                    header.payload_len
                ),
            });
        }
        Ok(header)
    }

    /// Whether the payload carries a checksum ([`FLAG_UNCHECKED`] unset).
    pub fn has_checksum(&self) -> bool {
        self.flags & FLAG_UNCHECKED == 0
    }

    /// Bytes of the whole object (header and payload); representable for every decoded
    /// header.
    pub fn object_len(&self) -> u64 {
        self.header_len.saturating_add(self.payload_len)
    }

    /// Checks that the header is the one a reader of `expected` wants (all but the checksum,
    /// which needs the payload).
    pub fn check_identity(&self, expected: &Header) -> Result<(), MissReason> {
        if self.namespace != expected.namespace {
            return Err(MissReason::ForeignNamespace);
        }
        if self.key_hash != expected.key_hash {
            return Err(MissReason::KeyMismatch);
        }
        if self.header_len != expected.header_len || self.payload_len != expected.payload_len {
            return Err(MissReason::SizeMismatch {
                expected: expected.object_len(),
                found: self.object_len(),
            });
        }
        // Whether the payload carries a checksum is the writer's affair, not the identity.
        if self.flags & !FLAG_UNCHECKED != expected.flags & !FLAG_UNCHECKED {
            return Err(MissReason::BadHeader {
                detail: format!("flags {:#x}, expected {:#x}", self.flags, expected.flags),
            });
        }
        Ok(())
    }
}

/// XXH3's secret for seed 0 (its default secret), derived once: a streaming hasher over a
/// borrowed secret allocates nothing, where `XxHash3_64::with_seed` boxes a secret per
/// checksum, once per page on the hot path.
static SECRET: LazyLock<[u8; DEFAULT_SECRET_LENGTH]> = LazyLock::new(|| {
    SecretBuffer::with_seed(0, [0; DEFAULT_SECRET_LENGTH])
        .map(SecretBuffer::into_secret)
        .unwrap_or_else(|_| unreachable!("the default secret length is valid"))
});

/// A streaming XXH3-64 (seed 0) on the stack.
fn xxh3() -> RawHasher<&'static [u8; DEFAULT_SECRET_LENGTH]> {
    let secret: &'static [u8; DEFAULT_SECRET_LENGTH] = &SECRET;
    match SecretBuffer::new(0, secret) {
        Ok(buffer) => RawHasher::new(buffer),
        Err(_) => unreachable!("the default secret length is valid"),
    }
}

/// The payload checksum fed piece by piece (a payload streamed from a file).
#[derive(Clone)]
pub struct PayloadHasher(RawHasher<&'static [u8; DEFAULT_SECRET_LENGTH]>);

impl Default for PayloadHasher {
    fn default() -> Self {
        PayloadHasher(xxh3())
    }
}

impl std::fmt::Debug for PayloadHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PayloadHasher")
    }
}

impl PayloadHasher {
    /// Adds the next bytes of the payload.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    /// The checksum of everything added; equal to [`checksum`] over the same bytes.
    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// Streaming checksum (XXH3-64, seed 0; AVX2 when the CPU has it) over the pieces of a
/// payload, in order.
///
/// The bytes go to the hasher as they are. A checksum mostly reads bytes that are not in
/// cache (pool memory about to be written, a page a device just put in memory), and an
/// earlier version asked for each next 4 KiB block's cache lines while hashing the last. On
/// a 2-core cloud Xeon that lifted XXH3 from DRAM from 8.5 to 11.4 GB/s. On a 2-core AMD
/// EPYC cloud VM, where the benchmarks now run, it cost: over 1 GiB in 64 KiB and 1 MiB
/// pieces, 13-18 GB/s with the prefetches against 21-27 GB/s without, and 31-36 against
/// 53-57 GB/s over 64 KiB in cache. Inside `hicache bench` the gain is smaller, as the
/// kernel has often just copied the bytes and other threads share the memory bus: on tmpfs
/// with 1 MiB pages, the checksum's profile samples fell by 12 % (9.7 to 8.4 % of all), and
/// with 64 KiB pages by 28-29 % (two runs each).
pub fn checksum<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = xxh3();
    for p in pieces {
        h.write(p);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            flags: 0,
            header_len: 4096,
            namespace: Namespace::from_bytes([7; 16]),
            key_hash: 0xdead_beef,
            payload_len: 12345,
            checksum: checksum([&b"payload"[..]]),
        }
    }

    #[test]
    fn crafted_lengths_are_bad_headers_not_overflows() {
        for (header_len, payload_len) in
            [(4096, u64::MAX), (u32::MAX as u64, u64::MAX - 100), (8, 1)]
        {
            let h = Header {
                header_len,
                payload_len,
                ..header()
            };
            let mut buf = vec![0; 4096];
            buf[..HEADER_FIELDS_LEN].copy_from_slice(&h.encode());
            let err = Header::decode(&buf).unwrap_err();
            assert!(matches!(err, MissReason::BadHeader { .. }), "{err:?}");
        }
    }

    #[test]
    fn round_trip() {
        let h = header();
        let mut buf = vec![0xaa; 4096];
        buf[..HEADER_FIELDS_LEN].copy_from_slice(&h.encode());
        assert!(buf[64..].iter().all(|b| *b == 0xaa));
        let back = Header::decode(&buf).unwrap();
        assert_eq!(back, h);
        back.check_identity(&h).unwrap();
    }

    /// Every field keeps all its bits (a flag in the high byte, the smallest valid header
    /// length), and the format's names are what configs and reports spell.
    #[test]
    fn fields_round_trip_at_their_edges() {
        for (flags, header_len) in [(0x0100, HEADER_FIELDS_LEN as u64), (0xffff, 4096)] {
            let h = Header {
                flags,
                header_len,
                ..header()
            };
            let mut buf = vec![0; 4096];
            buf[..HEADER_FIELDS_LEN].copy_from_slice(&h.encode());
            assert_eq!(Header::decode(&buf), Ok(h));
        }
        let short = Header {
            header_len: HEADER_FIELDS_LEN as u64 - 1,
            ..header()
        };
        assert!(Header::decode(&short.encode()).is_err());
        assert_eq!(PageFormat::Envelope.to_string(), "envelope");
        assert_eq!(PageFormat::Raw.to_string(), "raw");
        assert_eq!(format!("{:?}", PayloadHasher::default()), "PayloadHasher");
    }

    #[test]
    fn every_single_bit_flip_in_fields_is_detected() {
        let h = header();
        let mut buf = vec![0; 4096];
        buf[..HEADER_FIELDS_LEN].copy_from_slice(&h.encode());
        for byte in 0..HEADER_FIELDS_LEN {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[byte] ^= 1 << bit;
                assert!(
                    Header::decode(&b).is_err(),
                    "flip at {byte}.{bit} not caught"
                );
            }
        }
    }

    #[test]
    fn identity_mismatches_are_typed() {
        let h = header();
        let other_ns = Header {
            namespace: Namespace::from_bytes([8; 16]),
            ..h
        };
        assert_eq!(
            other_ns.check_identity(&h),
            Err(MissReason::ForeignNamespace)
        );
        let other_key = Header { key_hash: 1, ..h };
        assert_eq!(other_key.check_identity(&h), Err(MissReason::KeyMismatch));
        let other_len = Header {
            payload_len: 1,
            ..h
        };
        assert!(matches!(
            other_len.check_identity(&h),
            Err(MissReason::SizeMismatch { .. })
        ));
        // Whether a payload carries a checksum is not identity; an anchor marker is.
        let unchecked = Header {
            flags: FLAG_UNCHECKED,
            checksum: 0,
            ..h
        };
        assert!(!unchecked.has_checksum() && h.has_checksum());
        assert_eq!(unchecked.check_identity(&h), Ok(()));
        assert_eq!(h.check_identity(&unchecked), Ok(()));
        let anchor = Header {
            flags: FLAG_ANCHOR | FLAG_UNCHECKED,
            ..h
        };
        assert!(matches!(
            anchor.check_identity(&h),
            Err(MissReason::BadHeader { .. })
        ));
    }

    #[test]
    fn arbitrary_bytes_never_decode_as_valid_by_accident() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut buf = [0u8; 64];
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            assert!(Header::decode(&buf).is_err());
            buf[0..8].copy_from_slice(&MAGIC);
            assert!(Header::decode(&buf).is_err());
        }
        assert!(Header::decode(&[0u8; 10]).is_err());
    }

    #[test]
    fn checksum_is_standard_xxh3_64() {
        // Reference values of XXH3-64 (seed 0), so stored objects stay readable whatever
        // implementation computes them.
        assert_eq!(checksum([&b""[..]]), 0x2d06800538d394c2);
        assert_eq!(checksum([&b"a"[..]]), 0xe6c632b61e964e1f);
        let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let split = checksum([&big[..333], &big[333..50_000], &big[50_000..]]);
        assert_eq!(split, checksum([&big[..]]));
        // Pieces that start and end at odd places (inside XXH3's 1 KiB blocks and its
        // 64-byte stripes), fed one by one.
        let mut h = PayloadHasher::default();
        for piece in [
            &big[..4095],
            &big[4095..4097],
            &big[4097..12_300],
            &big[12_300..13_000],
        ] {
            h.update(piece);
        }
        assert_eq!(h.finish(), XxHash3_64::oneshot(&big[..13_000]));
        // The streaming hasher over the borrowed secret agrees with the one-shot reference
        // on every input-length path (up to 16, 128 and 240 bytes, and longer), and about
        // 4 KiB boundaries.
        for len in [
            0, 5, 16, 17, 100, 128, 129, 240, 241, 1024, 4095, 4096, 4097, 8191, 8192, 12_289,
            100_000,
        ] {
            let mut h = PayloadHasher::default();
            h.update(&big[..len]);
            assert_eq!(h.finish(), XxHash3_64::oneshot(&big[..len]), "{len} bytes");
            assert_eq!(checksum([&big[..len]]), XxHash3_64::oneshot(&big[..len]));
        }
    }

    #[test]
    fn lengths() {
        assert_eq!(header_len(512), 4096);
        assert_eq!(header_len(1), 4096);
        assert_eq!(header_len(8192), 8192);
        assert_eq!(object_len(100, 4096), Some(8192));
        assert_eq!(object_len(100, 1), Some(4196));
        assert_eq!(object_len(u64::MAX - 10, 4096), None);
        assert_eq!(object_len(100, u64::MAX), None);
        assert_eq!(checksum([&b"ab"[..], &b"c"[..]]), checksum([&b"abc"[..]]));
    }
}
