//! `hicache scrub`: walk stored objects, verify envelopes and checksums, report (and
//! optionally remove) torn, corrupt or foreign pages and stale temporary files.
//!
//! Two walks share one check of each object:
//! - [`scrub`] walks storage dirs laid out as the POSIX plugin lays them out, file by file:
//!   it also finds temporary files of killed writers, links and misrouted objects;
//! - [`scrub_backend`] walks any plugin that can list its objects (OBJ, KVDIR, ...) through
//!   [`StorageBackend::list`](hicache::raw::StorageBackend::list) and reads each object
//!   through the plugin.
//!
//! Safe to point at anything: the header is read first and every length in it is checked,
//! a file's payload is streamed (memory stays bounded whatever the file size; an object read
//! through a plugin is read whole, up to a limit), links are reported and never followed,
//! and `--delete` removes only what was proven torn, corrupt, foreign or stale — an object
//! that cannot be read is reported as unreadable and kept.

mod files;
mod listed;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use hicache::raw::Namespace;
use hicache::raw::envelope::{self, HEADER_FIELDS_LEN, Header};
use hicache::raw::routing::{bucket_name, key_hash};
use hicache::{Error, Result};
use serde::Serialize;

pub use files::scrub;
pub use listed::{ListScrubOptions, MAX_OBJECT_BYTES, scrub_backend};

/// What to scrub.
#[derive(Clone, Debug)]
pub struct ScrubOptions {
    /// Storage dirs.
    pub dirs: Vec<PathBuf>,
    /// Remove what is torn, corrupt or foreign.
    pub delete: bool,
    /// Only this namespace (16 hex chars, as in object names) counts as ours; others are
    /// reported as foreign.
    pub namespace: Option<String>,
    /// Temporary files older than this are leftovers of killed writers.
    pub temp_age: Duration,
    /// Show a bar over the bucket dirs on stderr when it is a terminal.
    pub progress: bool,
}

/// One problem found.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The file; for an object found through a plugin's listing, its key.
    pub path: PathBuf,
    /// torn | corrupt | foreign | stale-temp (removed by `--delete`) | unreadable | symlink
    /// (reported only)
    pub kind: &'static str,
    /// What is wrong.
    pub reason: String,
    /// Whether it was removed.
    pub deleted: bool,
}

/// Totals and findings.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScrubReport {
    /// Files looked at.
    pub files: u64,
    /// Valid enveloped objects.
    pub valid: u64,
    /// Objects without an envelope (raw / SGLang format), left alone.
    pub raw: u64,
    /// Bytes in valid objects.
    pub valid_bytes: u64,
    /// Of the valid objects, those whose payload carries no checksum (written from a GPU
    /// pool, whose bytes never pass through host memory): envelope, name, namespace and
    /// length checked, the payload's bytes not.
    pub unchecked: u64,
    /// Objects a listing showed that a read then did not find whole: removed or rewritten
    /// meanwhile, or stored where the plugin's reads do not look. Not judged, not counted
    /// in `files` (a file walk leaves it 0).
    pub skipped: u64,
    /// Problems.
    pub findings: Vec<Finding>,
}

impl ScrubReport {
    /// Problems of one kind.
    pub fn count(&self, kind: &str) -> usize {
        self.findings.iter().filter(|f| f.kind == kind).count()
    }
}

/// Kinds of finding that `--delete` removes: each is proof the file is not a valid page of
/// this namespace.
const DELETABLE: [&str; 4] = ["torn", "corrupt", "foreign", "stale-temp"];

/// Streamed payload chunk size.
const CHUNK: usize = 1 << 20;

/// Checks a `--namespace` value: 16 hex digits, any case; returns it in lowercase.
pub fn parse_namespace(value: &str) -> Result<String> {
    if value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(value.to_ascii_lowercase());
    }
    Err(Error::InvalidConfig {
        key: "--namespace".into(),
        source_desc: "the command line".into(),
        reason: format!("{value:?} is not a namespace (16 hex digits)"),
        hint: Some(
            "use the `namespace` that `hicache doctor` reports for the pool, e.g. 3f2a9c0d5e7b1a48"
                .into(),
        ),
    })
}

/// One stored object's bytes: a file, or an object a plugin read into memory.
pub(crate) trait Stored {
    /// Its length now.
    fn len(&self) -> std::io::Result<u64>;
    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl Stored for File {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl Stored for [u8] {
    fn len(&self) -> std::io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// Checks one object named `name`: its envelope, name, namespace, length and checksum.
/// `bucket` is the bucket dir a file was found in (checked against the name's routing);
/// `namespace` is ours, when given. Counts valid and raw objects in `report`; returns the
/// finding's kind and reason otherwise.
fn check_object<S: Stored + ?Sized>(
    object: &S,
    name: &str,
    bucket: Option<&str>,
    namespace: Option<&str>,
    report: &mut ScrubReport,
) -> Option<(&'static str, String)> {
    let unreadable =
        |what: &str, e: std::io::Error| Some(("unreadable", format!("cannot {what}: {e}")));
    let len = match object.len() {
        Ok(len) => len,
        Err(e) => return unreadable("stat", e),
    };
    let mut head = [0u8; HEADER_FIELDS_LEN];
    if len < HEADER_FIELDS_LEN as u64 {
        report.raw += 1;
        return None;
    }
    if let Err(e) = object.read_exact_at(&mut head, 0) {
        return unreadable("read the header", e);
    }
    if head[..8] != envelope::MAGIC {
        report.raw += 1;
        return None;
    }
    let header = match Header::decode(&head) {
        Ok(h) => h,
        Err(reason) => return Some(("corrupt", reason.to_string())),
    };
    let hash = key_hash(name);
    if header.key_hash != hash {
        return Some((
            "corrupt",
            "the header belongs to another object name".into(),
        ));
    }
    let home = bucket_name((hash & 0xff) as u8);
    if let Some(bucket) = bucket
        && home != bucket.as_bytes()
    {
        return Some((
            "corrupt",
            format!(
                "misrouted: object belongs in bucket {}",
                String::from_utf8_lossy(&home)
            ),
        ));
    }
    let ns = header.namespace.short_hex();
    if let Some(suffix) = Namespace::suffix_of(name)
        && suffix != ns
    {
        return Some((
            "corrupt",
            format!("name says namespace {suffix}, header says {ns}"),
        ));
    }
    let end = header.object_len();
    if len < end {
        return Some(("torn", format!("{len} bytes, the header promises {end}")));
    }
    if header.has_checksum() {
        match payload_checksum(object, header.header_len, header.payload_len) {
            Ok(sum) if sum == header.checksum => {}
            Ok(_) => return Some(("corrupt", "payload checksum mismatch".into())),
            Err(e) => return unreadable("read the payload", e),
        }
    }
    if let Some(want) = namespace
        && want != ns
    {
        return Some(("foreign", format!("namespace {ns}, expected {want}")));
    }
    report.valid += 1;
    report.valid_bytes += len;
    report.unchecked += u64::from(!header.has_checksum());
    None
}

/// Streams `len` payload bytes at `offset` through the checksum, a chunk at a time.
fn payload_checksum<S: Stored + ?Sized>(object: &S, offset: u64, len: u64) -> std::io::Result<u64> {
    let mut hasher = envelope::PayloadHasher::default();
    let mut buf = vec![0u8; CHUNK.min(usize::try_from(len).unwrap_or(CHUNK)).max(1)];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from(len - done).map_or(buf.len(), |left| left.min(buf.len()));
        object.read_exact_at(&mut buf[..n], offset + done)?;
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_sixteen_hex_digits_in_any_case() {
        assert_eq!(
            parse_namespace("DEADBEEF00112233").unwrap(),
            "deadbeef00112233"
        );
        for bad in ["deadbeef", "deadbeef0011223g", " deadbeef00112233", ""] {
            assert!(parse_namespace(bad).is_err(), "{bad:?}");
        }
    }

    /// Bytes in memory read like a file: a read past the end is an error, never a panic
    /// (an offset from a crafted header can be anything).
    #[test]
    fn bytes_in_memory_refuse_reads_past_their_end() {
        let bytes: &[u8] = b"0123456789";
        let mut buf = [0u8; 4];
        Stored::read_exact_at(bytes, &mut buf, 6).unwrap();
        assert_eq!(&buf, b"6789");
        for offset in [7, 10, u64::MAX, u64::MAX - 2] {
            assert!(
                Stored::read_exact_at(bytes, &mut buf, offset).is_err(),
                "{offset}"
            );
        }
        let mut report = ScrubReport::default();
        assert_eq!(check_object(bytes, "x", None, None, &mut report), None);
        assert_eq!(report.raw, 1);
    }

    /// An object written from a GPU pool carries no checksum: valid and counted as
    /// unchecked; the same header claiming a checksum is corrupt.
    #[test]
    fn unchecked_payloads_are_valid_and_counted_and_a_claimed_checksum_is_checked() {
        let object = |flags: u16| {
            let header = Header {
                flags,
                header_len: 4096,
                namespace: Namespace::from_bytes([3; 16]),
                key_hash: key_hash("x"),
                payload_len: 8,
                checksum: 0,
            };
            let mut bytes = vec![0u8; 4096 + 8];
            bytes[..HEADER_FIELDS_LEN].copy_from_slice(&header.encode());
            bytes[4096..].copy_from_slice(b"payload!");
            bytes
        };
        let mut report = ScrubReport::default();
        let unchecked = object(envelope::FLAG_UNCHECKED);
        assert_eq!(
            check_object(&unchecked[..], "x", None, None, &mut report),
            None
        );
        assert_eq!((report.valid, report.unchecked), (1, 1));
        let claimed = object(0);
        let finding = check_object(&claimed[..], "x", None, None, &mut report);
        assert_eq!(finding.map(|f| f.0), Some("corrupt"));
    }
}
