//! `hicache scrub`: walk stored objects, verify envelopes and checksums, report (and
//! optionally remove) torn, corrupt or foreign pages and stale temporary files.
//!
//! Safe to point at anything: the header is read first and every length in it is checked,
//! the payload is streamed (memory stays bounded whatever the file size), links are reported
//! and never followed, and `--delete` removes only what was proven torn, corrupt, foreign or
//! stale — a file that cannot be read is reported as unreadable and kept.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, fstatat};
use std::time::{Duration, SystemTime};

use hicache::raw::envelope::{self, HEADER_FIELDS_LEN, Header};
use hicache::raw::routing::{bucket_name, key_hash};
use hicache::{Error, Result};
use serde::Serialize;

use crate::progress;

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
    /// The file.
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

/// Scrubs every bucket dir (`00`..`ff`) of every storage dir.
///
/// Everything under a storage dir is reached from an open handle of its parent dir, by one
/// name, without following links (`openat` with `O_NOFOLLOW`, `fstatat` with
/// `AT_SYMLINK_NOFOLLOW`, `unlinkat`): a link swapped in while scrub runs cannot take it, or
/// `--delete`, outside the dir.
pub fn scrub(opts: &ScrubOptions) -> Result<ScrubReport> {
    let mut opts = opts.clone();
    opts.namespace = opts.namespace.as_deref().map(parse_namespace).transpose()?;
    let opts = &opts;
    let mut report = ScrubReport::default();
    // The bar counts bucket dirs; each root adds its own once listed.
    let progress = progress::bar(opts.progress, "scrub", 0);
    for dir in &opts.dirs {
        let io_err = |op, e: nix::Error| {
            Error::io(
                hicache::Component::Tool("scrub"),
                op,
                Some(dir.clone()),
                e.into(),
            )
        };
        // The configured dir itself may be a link; nothing beneath it is followed.
        let root = nix::fcntl::open(
            dir.as_path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", e))?;
        let listed = names(&root).map_err(|e| io_err("read dir", e))?;
        progress.inc_length(listed.iter().filter(|n| is_bucket_name(n)).count() as u64);
        for name in listed {
            let shown = name.to_string_lossy().into_owned();
            let path = dir.join(&shown);
            let Ok(st) = fstatat(&root, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue; // gone since the listing
            };
            let is_bucket = is_bucket_name(&name);
            if is_bucket {
                progress.inc(1);
                progress.set_message(format!("bucket dirs, {} files", report.files));
            }
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                report.findings.push(Finding {
                    path,
                    kind: "symlink",
                    reason: "a symbolic link under the storage dir; scrub does not follow it"
                        .into(),
                    deleted: false,
                });
                continue;
            }
            if !is_bucket || st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                continue;
            }
            let bucket = match open_beneath(&root, &name, OFlag::O_DIRECTORY) {
                Ok(fd) => fd,
                Err(e) => {
                    report.findings.push(Finding {
                        path,
                        kind: "unreadable",
                        reason: format!("cannot open the bucket dir: {e}"),
                        deleted: false,
                    });
                    continue;
                }
            };
            scrub_bucket(&bucket, &path, &shown, opts, &mut report)?;
        }
    }
    progress.finish_and_clear();
    Ok(report)
}

/// Whether a name is a bucket dir's: two lowercase hex digits.
fn is_bucket_name(name: &CStr) -> bool {
    let name = name.to_bytes();
    name.len() == 2
        && name
            .iter()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// Names in an open dir, without `.` and `..`.
fn names(dir: &OwnedFd) -> nix::Result<Vec<CString>> {
    let mut d = nix::dir::Dir::from_fd(dir.try_clone().map_err(|_| nix::Error::EMFILE)?)?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Opens `name` in `dir` read-only, never through a link, never blocking on a FIFO.
fn open_beneath(dir: &OwnedFd, name: &CStr, extra: OFlag) -> std::io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | extra,
        Mode::empty(),
    )
    .map_err(Into::into)
}

fn scrub_bucket(
    bucket_fd: &OwnedFd,
    bucket_dir: &Path,
    bucket: &str,
    opts: &ScrubOptions,
    report: &mut ScrubReport,
) -> Result<()> {
    let entries = names(bucket_fd).map_err(|e| {
        Error::io(
            "scrub",
            "read dir",
            Some(bucket_dir.to_path_buf()),
            e.into(),
        )
    })?;
    for cname in entries {
        let name = cname.to_string_lossy().into_owned();
        let path = bucket_dir.join(&name);
        let st = match fstatat(bucket_fd, cname.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => st,
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                report.findings.push(Finding {
                    path,
                    kind: "symlink",
                    reason: "a symbolic link among pages; scrub does not follow it".into(),
                    deleted: false,
                });
                continue;
            }
            _ => continue,
        };
        report.files += 1;
        let finding = if name.starts_with('.') {
            let modified = SystemTime::UNIX_EPOCH
                + Duration::from_secs(u64::try_from(st.st_mtime).unwrap_or(0));
            let age = SystemTime::now()
                .duration_since(modified)
                .unwrap_or_default();
            if age < opts.temp_age {
                continue; // a write may be in progress
            }
            Some((
                "stale-temp",
                format!(
                    "temporary file left by an interrupted write ({}s old)",
                    age.as_secs()
                ),
            ))
        } else {
            let file = open_beneath(bucket_fd, &cname, OFlag::empty()).map(File::from);
            check_object(file, &name, bucket, opts, report)
        };
        if let Some((kind, reason)) = finding {
            let deleted = opts.delete
                && DELETABLE.contains(&kind)
                && nix::unistd::unlinkat(
                    bucket_fd,
                    cname.as_c_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                )
                .is_ok();
            report.findings.push(Finding {
                path,
                kind,
                reason,
                deleted,
            });
        }
    }
    Ok(())
}

fn check_object(
    file: std::io::Result<File>,
    name: &str,
    bucket: &str,
    opts: &ScrubOptions,
    report: &mut ScrubReport,
) -> Option<(&'static str, String)> {
    let unreadable =
        |what: &str, e: std::io::Error| Some(("unreadable", format!("cannot {what}: {e}")));
    // Opened with O_NOFOLLOW: a file swapped for a link since the walk saw it fails here.
    let file = match file {
        Ok(f) => f,
        Err(e) => return unreadable("open", e),
    };
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return unreadable("stat", e),
    };
    let mut head = [0u8; HEADER_FIELDS_LEN];
    if len < HEADER_FIELDS_LEN as u64 {
        report.raw += 1;
        return None;
    }
    if let Err(e) = file.read_exact_at(&mut head, 0) {
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
    if bucket_name((hash & 0xff) as u8) != bucket.as_bytes() {
        return Some((
            "corrupt",
            format!(
                "misrouted: object belongs in bucket {}",
                String::from_utf8_lossy(&bucket_name((hash & 0xff) as u8))
            ),
        ));
    }
    let ns = header.namespace.short_hex();
    if let Some((_, suffix)) = name.rsplit_once('.')
        && suffix.len() == 16
        && suffix.bytes().all(|b| b.is_ascii_hexdigit())
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
    match payload_checksum(&file, header.header_len, header.payload_len) {
        Ok(sum) if sum == header.checksum => {}
        Ok(_) => return Some(("corrupt", "payload checksum mismatch".into())),
        Err(e) => return unreadable("read the payload", e),
    }
    if let Some(want) = &opts.namespace
        && *want != ns
    {
        return Some(("foreign", format!("namespace {ns}, expected {want}")));
    }
    report.valid += 1;
    report.valid_bytes += len;
    None
}

/// Streams `len` payload bytes at `offset` through the checksum, a chunk at a time.
fn payload_checksum(file: &File, offset: u64, len: u64) -> std::io::Result<u64> {
    let mut hasher = envelope::PayloadHasher::default();
    let mut buf = vec![0u8; CHUNK.min(usize::try_from(len).unwrap_or(CHUNK)).max(1)];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from(len - done).map_or(buf.len(), |left| left.min(buf.len()));
        file.read_exact_at(&mut buf[..n], offset + done)?;
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_cannot_be_read_is_unreadable_and_never_deletable() {
        let dir = tempfile::tempdir().unwrap();
        let opts = ScrubOptions {
            dirs: vec![dir.path().to_path_buf()],
            delete: true,
            namespace: None,
            temp_age: Duration::from_secs(60),
            progress: false,
        };
        let mut report = ScrubReport::default();
        // Gone between the walk and the open (or refused: EACCES, ELOOP, EIO alike).
        let gone = File::open(dir.path().join("gone"));
        let finding = check_object(gone, "gone", "00", &opts, &mut report);
        let (kind, reason) = finding.expect("a finding");
        assert_eq!(kind, "unreadable", "{reason}");
        assert!(!DELETABLE.contains(&kind));
    }

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
}
