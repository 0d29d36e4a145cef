//! `hicache scrub`: walk stored objects, verify envelopes and checksums, report (and
//! optionally remove) torn, corrupt or foreign pages and stale temporary files.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hicache_core::envelope::{self, HEADER_FIELDS_LEN, Header};
use hicache_core::routing::{bucket_name, key_hash};
use hicache_core::{Error, Result};
use serde::Serialize;

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
}

/// One problem found.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The file.
    pub path: PathBuf,
    /// torn | corrupt | foreign | stale-temp
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

/// Scrubs every bucket dir (`00`..`ff`) of every storage dir.
pub fn scrub(opts: &ScrubOptions) -> Result<ScrubReport> {
    let mut report = ScrubReport::default();
    for dir in &opts.dirs {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| Error::io("scrub", "read dir", Some(dir.clone()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("scrub", "read dir", Some(dir.clone()), e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let is_bucket = name.len() == 2
                && name
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
            let ft = entry
                .file_type()
                .map_err(|e| Error::io("scrub", "stat", Some(entry.path()), e))?;
            if !is_bucket || !ft.is_dir() {
                continue;
            }
            scrub_bucket(&entry.path(), &name, opts, &mut report)?;
        }
    }
    Ok(report)
}

fn scrub_bucket(
    bucket_dir: &Path,
    bucket: &str,
    opts: &ScrubOptions,
    report: &mut ScrubReport,
) -> Result<()> {
    let entries = std::fs::read_dir(bucket_dir)
        .map_err(|e| Error::io("scrub", "read dir", Some(bucket_dir.to_path_buf()), e))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| Error::io("scrub", "read dir", Some(bucket_dir.to_path_buf()), e))?;
        let path = entry.path();
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() => m,
            _ => continue,
        };
        report.files += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        let finding = if name.starts_with('.') {
            let age = meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
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
            check_object(&path, &name, bucket, opts, report)
        };
        if let Some((kind, reason)) = finding {
            let deleted = opts.delete && std::fs::remove_file(&path).is_ok();
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
    path: &Path,
    name: &str,
    bucket: &str,
    opts: &ScrubOptions,
    report: &mut ScrubReport,
) -> Option<(&'static str, String)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return Some(("corrupt", format!("cannot read: {e}"))),
    };
    if bytes.len() < HEADER_FIELDS_LEN || bytes[..8] != envelope::MAGIC {
        report.raw += 1;
        return None;
    }
    let header = match Header::decode(&bytes) {
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
    let end = header.header_len + header.payload_len;
    if (bytes.len() as u64) < end {
        return Some((
            "torn",
            format!("{} bytes, the header promises {end}", bytes.len()),
        ));
    }
    if envelope::checksum([&bytes[header.header_len as usize..end as usize]]) != header.checksum {
        return Some(("corrupt", "payload checksum mismatch".into()));
    }
    if let Some(want) = &opts.namespace
        && *want != ns
    {
        return Some(("foreign", format!("namespace {ns}, expected {want}")));
    }
    report.valid += 1;
    report.valid_bytes += bytes.len() as u64;
    None
}
