//! Scrub of storage dirs laid out as the POSIX plugin lays them out: every bucket dir
//! (`00`..`ff`) of every dir, file by file. Beyond what a listing shows, it finds temporary
//! files of killed writers, links, and objects in the wrong bucket dir. The plugin's spares
//! (files a writer keeps for reuse, `.s<tag>-<id>`) are not pages: they are skipped, and the
//! next writer to start reclaims those of a process that is gone.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, SystemTime};

use hicache::{Error, Result};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, fstatat};

use super::{DELETABLE, Finding, ScrubOptions, ScrubReport, check_object, parse_namespace};
use crate::progress;

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

/// Whether a file in a bucket dir is one of the POSIX plugin's spares.
fn is_spare(name: &[u8]) -> bool {
    #[cfg(feature = "posix")]
    {
        hicache::posix::is_spare_name(name)
    }
    #[cfg(not(feature = "posix"))]
    {
        // Without the plugin this build makes no spares; another build's writer may have.
        name.starts_with(b".s")
    }
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
            Ok(st) => {
                // Nothing the plugin writes: reported, never opened (a FIFO would block) and
                // never deleted (someone else's).
                let what = match st.st_mode & libc::S_IFMT {
                    libc::S_IFIFO => "a FIFO",
                    libc::S_IFSOCK => "a socket",
                    libc::S_IFDIR => "a dir",
                    libc::S_IFCHR | libc::S_IFBLK => "a device node",
                    _ => "something that is not a file",
                };
                report.findings.push(Finding {
                    path,
                    kind: "not-a-file",
                    reason: format!("{what} among pages; scrub neither reads nor deletes it"),
                    deleted: false,
                });
                continue;
            }
            Err(_) => continue, // gone since the listing
        };
        if is_spare(cname.to_bytes()) {
            continue;
        }
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
            check_file(file, &name, bucket, opts, report)
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

/// Checks a file the walk opened (with `O_NOFOLLOW`: one swapped for a link since the walk
/// saw it fails to open, and is unreadable).
fn check_file(
    file: std::io::Result<File>,
    name: &str,
    bucket: &str,
    opts: &ScrubOptions,
    report: &mut ScrubReport,
) -> Option<(&'static str, String)> {
    match file {
        Ok(file) => check_object(&file, name, Some(bucket), opts.namespace.as_deref(), report),
        Err(e) => Some(("unreadable", format!("cannot open: {e}"))),
    }
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
        let finding = check_file(gone, "gone", "00", &opts, &mut report);
        let (kind, reason) = finding.expect("a finding");
        assert_eq!(kind, "unreadable", "{reason}");
        assert!(!DELETABLE.contains(&kind));
    }
}
