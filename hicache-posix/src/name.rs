//! Names of files and dirs under a storage root, built in a stack buffer with their NUL
//! (no allocation per syscall): object names, temp names, spare names.

use std::ffi::CStr;
use std::hash::BuildHasher;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// What every spare's name starts with ([`Name::spare`]).
pub(crate) const SPARE_PREFIX: &[u8] = b".s";

/// Hex digits of a spare pool's tag.
pub(crate) const SPARE_TAG_LEN: usize = 16;

/// Whether `name` (a file in a bucket dir) is a spare: a file a writer keeps for reuse, never
/// a page. Tools that walk bucket dirs skip it; the next writer to start reclaims the spares of
/// a process that is gone.
pub fn is_spare_name(name: &[u8]) -> bool {
    spare_tag(name).is_some()
}

/// The pool tag in a spare's name `.s<tag>-<id>`, if `name` is one.
pub(crate) fn spare_tag(name: &[u8]) -> Option<&[u8]> {
    let rest = name.strip_prefix(SPARE_PREFIX)?;
    let (tag, id) = (rest.get(..SPARE_TAG_LEN)?, rest.get(SPARE_TAG_LEN..)?);
    let id = id.strip_prefix(b"-")?;
    (is_lower_hex(tag) && is_lower_hex(id) && id.len() <= 16).then_some(tag)
}

/// Whether `b` is lowercase hex digits (as tags and ids are written), and not empty.
pub(crate) fn is_lower_hex(b: &[u8]) -> bool {
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// Room for one name component and its NUL (Linux NAME_MAX is 255).
pub(crate) const NAME_CAP: usize = 256;

/// A NUL-terminated name component in a stack buffer.
#[derive(Clone)]
pub(crate) struct Name {
    buf: [u8; NAME_CAP],
    len: usize,
}

impl Name {
    pub(crate) fn new() -> Self {
        Name {
            buf: [0; NAME_CAP],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.len + bytes.len() + 1 > NAME_CAP || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "name longer than NAME_MAX or holding a NUL byte",
            ));
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        // The terminator follows the name at all times, so borrowing it as a C string
        // needs no write.
        self.buf[self.len] = 0;
        Ok(())
    }

    /// An object's name.
    pub(crate) fn object(name: &[u8]) -> io::Result<Self> {
        let mut n = Self::new();
        n.push(name)?;
        Ok(n)
    }

    /// A spare's name in a bucket dir: `.s<pool tag>-<id in hex>`. No key can take it (keys
    /// never start with `.`), and the tag says which process's pool it belongs to.
    pub(crate) fn spare(tag: &[u8; SPARE_TAG_LEN], id: u64) -> Self {
        let mut n = Self::new();
        n.push(SPARE_PREFIX).expect("fits");
        n.push(tag).expect("fits");
        n.push(b"-").expect("fits");
        n.push(hex(id, &mut [0; 16])).expect("16 hex digits fit");
        n
    }

    /// `.t<random>`: a temporary name no key can take (keys never start with `.`), unique
    /// and unpredictable, so nobody can plant a file or link under it in advance.
    pub(crate) fn temp() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        // RandomState is seeded from the OS's random source once per process.
        let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut name = Self::new();
        name.push(b".t").expect("fits");
        name.push(hex(keys.hash_one(n), &mut [0; 16]))
            .expect("fits");
        name.push(b"-").expect("fits");
        name.push(hex(n, &mut [0; 16])).expect("fits");
        name
    }

    pub(crate) fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.buf[..=self.len]).expect("no interior NUL in names")
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

pub(crate) fn hex(mut v: u64, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = 16;
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(v & 0xf) as usize];
        v >>= 4;
        if v == 0 {
            return &buf[i..];
        }
    }
}
