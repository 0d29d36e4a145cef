//! The functional probe: can this plugin store pages in these dirs, on this machine, now?

use std::path::{Path, PathBuf};

use hicache_core::raw::{AlignedBuf, PluginContext, Probe};
use hicache_core::{ByteSize, FactValue};

use crate::config::{EngineChoice, PosixConfig};
use crate::fsinfo::{self, FsInfo};

/// What the probe found in one dir.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DirProbe {
    /// The dir.
    pub path: PathBuf,
    /// Its filesystem.
    pub fs: FsInfo,
    /// Bytes free for this user.
    pub free_bytes: u64,
    /// Whether an aligned O_DIRECT write + read + verify worked (None: not asked for).
    pub direct_io: Option<bool>,
    /// Why O_DIRECT did not work, if it did not.
    pub direct_io_error: Option<String>,
}

/// Why a dir cannot be used, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirProblem {
    /// What failed.
    pub reason: String,
    /// How to fix it.
    pub hint: String,
}

/// Creates `dir` if needed and proves a probe object can be written, read back and verified
/// (with O_DIRECT when `direct` is set; a filesystem that refuses O_DIRECT is reported, and
/// the round trip is repeated with buffered I/O).
pub fn probe_dir(dir: &Path, direct: bool) -> Result<DirProbe, DirProblem> {
    let unwritable = |what: &str, e: std::io::Error| {
        DirProblem {
        reason: format!("{what} {}: {e}", dir.display()),
        hint: "create the dir with write permission for this user, or choose another one with --dir or HICACHE_STORAGE_DIR".into(),
    }
    };
    if let Ok(meta) = std::fs::metadata(dir)
        && !meta.is_dir()
    {
        return Err(DirProblem {
            reason: format!("storage dir {} exists and is not a dir", dir.display()),
            hint: "choose a dir with --dir or HICACHE_STORAGE_DIR, or move the file away".into(),
        });
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(crate::config::DEFAULT_DIR_MODE)
            .create(dir)
            .map_err(|e| unwritable("cannot create storage dir", e))?;
    }
    if let Err(e) = crate::beneath::RootDir::open(dir, crate::config::DEFAULT_DIR_MODE) {
        // The refusal of `/` is the one error without an OS error code.
        return Err(match e.raw_os_error() {
            None => DirProblem {
                reason: format!("storage dir {}: {e}", dir.display()),
                hint: "name it with --dir or HICACHE_STORAGE_DIR".into(),
            },
            _ => unwritable("cannot open storage dir", e),
        });
    }
    let fs = fsinfo::fs_info(dir).map_err(|e| unwritable("cannot stat storage dir", e))?;
    let (free_bytes, _) =
        fsinfo::space(dir).map_err(|e| unwritable("cannot statvfs storage dir", e))?;
    let mut report = DirProbe {
        path: dir.to_path_buf(),
        fs,
        free_bytes,
        direct_io: None,
        direct_io_error: None,
    };
    if direct {
        match round_trip(dir, report.fs.io_alignment(), true) {
            Ok(()) => report.direct_io = Some(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                report.direct_io = Some(false);
                report.direct_io_error = Some(format!(
                    "{} refuses O_DIRECT (EINVAL); pages there use buffered I/O",
                    report.fs.fs_type
                ));
            }
            Err(e) => return Err(unwritable("probe object failed in", e)),
        }
    }
    if report.direct_io != Some(true) {
        round_trip(dir, 4096, false).map_err(|e| unwritable("probe object failed in", e))?;
    }
    Ok(report)
}

/// Writes, reads back and compares two aligned blocks in a probe file, then removes it. The
/// file has an unpredictable name and is created exclusively, never through a link.
fn round_trip(dir: &Path, align: u64, direct: bool) -> std::io::Result<()> {
    let root = crate::beneath::RootDir::open(dir, crate::config::DEFAULT_DIR_MODE)?;
    let name = crate::name::Name::temp();
    let len = (2 * align.max(4096)) as usize;
    let mut out = AlignedBuf::zeroed(len, align.max(4096) as usize)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut back = AlignedBuf::zeroed(len, align.max(4096) as usize)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let pattern: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    out.copy_from(0, &pattern)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    if direct {
        flags |= libc::O_DIRECT;
    }
    let fd = crate::beneath::open(root.fd(), name.as_cstr(), flags, 0o600)?;
    let result = (|| {
        let w = nix::sys::uio::pwrite(&fd, out.as_slice(), 0)?;
        let r = nix::sys::uio::pread(&fd, back.as_mut_slice(), 0)?;
        let mut got = vec![0u8; len];
        back.copy_to(0, &mut got)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if w as usize != len || r as usize != len || got != pattern {
            return Err(std::io::Error::other(format!(
                "probe data did not round-trip (wrote {w}, read {r} of {len} bytes)"
            )));
        }
        Ok(())
    })();
    drop(fd);
    let _ = crate::beneath::unlink(root.fd(), name.as_cstr());
    result
}

/// The plugin's probe: config valid, every dir writable with a verified round trip.
/// `None` when `dir` exists (or cannot be looked at: the full probe says why); otherwise
/// whether it could be created, judged without creating anything.
fn missing_dir(dir: &Path) -> Option<Result<String, DirProblem>> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => return None,
    }
    let cannot = |reason: String| {
        DirProblem {
        reason,
        hint: "create the dir with write permission for this user, or choose another one with --dir or HICACHE_STORAGE_DIR".into(),
    }
    };
    let mut ancestor = dir;
    let existing = loop {
        match ancestor.parent() {
            Some(p) if p.as_os_str().is_empty() => break Path::new("."),
            Some(p) => {
                if std::fs::symlink_metadata(p).is_ok() {
                    break p;
                }
                ancestor = p;
            }
            None => break Path::new("/"),
        }
    };
    if !existing.is_dir() {
        return Some(Err(cannot(format!(
            "storage dir {} cannot be created: {} is not a directory",
            dir.display(),
            existing.display()
        ))));
    }
    let Ok(c) = fsinfo::cstring(existing) else {
        return Some(Err(cannot(format!(
            "storage dir {} cannot be created: {} has a NUL byte",
            dir.display(),
            existing.display()
        ))));
    };
    use nix::unistd::AccessFlags;
    if let Err(e) = nix::unistd::access(c.as_c_str(), AccessFlags::W_OK | AccessFlags::X_OK) {
        return Some(Err(cannot(format!(
            "storage dir {} cannot be created: {} is not writable: {}",
            dir.display(),
            existing.display(),
            std::io::Error::from(e)
        ))));
    }
    let fs = fsinfo::fs_info(existing)
        .map(|f| f.fs_type)
        .unwrap_or_else(|_| "unknown filesystem".into());
    Some(Ok(format!(
        "{}: does not exist yet, created when the plugin opens (under {}, {fs}); O_DIRECT is probed then",
        dir.display(),
        existing.display()
    )))
}

/// What the POSIX probe hands to the plugin's build (and to tools such as `hicache
/// doctor`): the validated config and, per dir in routing order, what the probe found there
/// (`None` for a dir that did not exist yet: nothing was created, so nothing was tested).
#[derive(Clone, Debug)]
pub struct PosixFindings {
    /// The configuration the probe validated.
    pub config: PosixConfig,
    /// One entry per storage dir.
    pub dirs: Vec<Option<DirProbe>>,
}

pub(crate) fn probe(ctx: &PluginContext<'_>) -> Probe {
    let cfg = match PosixConfig::from_context(ctx) {
        Ok(c) => c,
        Err(e) => return Probe::unusable(e.to_string(), "fix the [plugin.posix] parameters"),
    };
    let uring = crate::uring::check_support(cfg.queue_depth);
    let (engine, uring_error) = match (cfg.engine, &uring) {
        (EngineChoice::Uring, Err(e)) => {
            return Probe::unusable(
                format!("engine = \"uring\" but io_uring is unavailable: {e}"),
                "use engine = \"threads\" or \"auto\", or allow io_uring (sysctl kernel.io_uring_disabled=0, seccomp)",
            );
        }
        (EngineChoice::Uring, Ok(_)) => (
            format!("engine io_uring (queue depth {})", cfg.queue_depth),
            None,
        ),
        (_, Ok(_)) => ("engine threads (io_uring available)".to_string(), None),
        (_, Err(e)) => (
            format!("engine threads (io_uring unavailable: {e})"),
            Some(e.to_string()),
        ),
    };
    drop(uring);
    let mut details = Vec::new();
    let mut facts: Vec<(String, &str, FactValue)> = Vec::new();
    let mut dirs = Vec::with_capacity(cfg.dirs.len());
    for dir in &cfg.dirs {
        let shown = dir.display().to_string();
        // A probe creates nothing: a dir that does not exist yet is judged by the nearest
        // existing ancestor it would be created under (the backend creates it on open).
        if let Some(missing) = missing_dir(dir) {
            match missing {
                Ok(detail) => {
                    details.push(detail);
                    facts.push((
                        shown,
                        "state",
                        "missing: created when the plugin opens".into(),
                    ));
                    dirs.push(None);
                    continue;
                }
                Err(problem) => return Probe::unusable(problem.reason, problem.hint),
            }
        }
        match probe_dir(dir, cfg.direct_io) {
            Ok(p) => {
                let dio = match (p.direct_io, &p.direct_io_error) {
                    (Some(true), _) => format!("O_DIRECT ok, align {}", p.fs.io_alignment()),
                    (Some(false), Some(e)) => e.clone(),
                    _ => "buffered I/O".into(),
                };
                details.push(format!("{}: {}, {dio}", p.path.display(), p.fs.fs_type));
                facts.push((shown.clone(), "filesystem", p.fs.fs_type.clone().into()));
                facts.push((shown.clone(), "free", ByteSize(p.free_bytes).into()));
                facts.push((
                    shown.clone(),
                    "direct I/O",
                    (p.direct_io == Some(true)).into(),
                ));
                if p.direct_io == Some(true) {
                    facts.push((shown, "alignment", ByteSize(p.fs.io_alignment()).into()));
                } else if let Some(e) = &p.direct_io_error {
                    facts.push((shown, "direct I/O error", e.clone().into()));
                }
                dirs.push(Some(p));
            }
            Err(problem) => return Probe::unusable(problem.reason, problem.hint),
        }
    }
    details.push(engine);
    let mut probe = Probe::usable(details.join("; "));
    for (subject, name, value) in facts {
        probe = probe.fact(subject, name, value);
    }
    let engine_name = match cfg.engine {
        EngineChoice::Uring => "io_uring",
        EngineChoice::Threads | EngineChoice::Auto => "threads",
    };
    probe =
        probe
            .fact("POSIX", "engine", engine_name)
            .fact("POSIX", "io_uring", uring_error.is_none());
    if let Some(e) = uring_error {
        probe = probe.fact("POSIX", "io_uring error", e);
    }
    probe.with_findings(PosixFindings { config: cfg, dirs })
}
