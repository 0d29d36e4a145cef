//! What can go wrong with USRBIO, each failure naming the function, the errno and, where one
//! helps, what to do.

use std::path::PathBuf;

/// A failure of the USRBIO library or of what hicache asked of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsrbioError {
    /// No candidate library could be loaded.
    #[error("cannot load 3FS's USRBIO library: {}; install the 3FS client (libhf3fs_api_shared.so), or name the library with `usrbio_path`", tried.iter().map(|(p, why)| format!("{} ({why})", p.display())).collect::<Vec<_>>().join(", "))]
    NotFound {
        /// Each path or name tried, with why it failed.
        tried: Vec<(PathBuf, String)>,
    },
    /// The library lacks a function hicache needs.
    #[error("{path}: no symbol {symbol}; it is not 3FS's USRBIO library, or one too old", path = path.display())]
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The function.
        symbol: &'static str,
    },
    /// A path is not under a 3FS mount.
    #[error("{path} is not on a 3FS mount (hf3fs_extract_mount_point found none); mount 3FS there, or choose a storage dir under a 3FS mount", path = path.display())]
    NotOn3fs {
        /// The path.
        path: PathBuf,
    },
    /// A path the C API cannot carry.
    #[error("{path}: {why}", path = path.display())]
    BadPath {
        /// The path.
        path: PathBuf,
        /// Why (a NUL byte, too long).
        why: &'static str,
    },
    /// A call returned an errno.
    #[error("{call} failed: {}{}", std::io::Error::from_raw_os_error(*errno), hint(call, *errno).map(|h| format!("; {h}")).unwrap_or_default())]
    Call {
        /// The function.
        call: &'static str,
        /// The errno (positive).
        errno: i32,
    },
    /// Publishing shared memory to the FUSE process (a symlink in the mount's virtual
    /// dir) failed.
    #[error("cannot publish {target} to 3FS as {link}: {source}; the mount's 3fs-virt/iovs dir must exist (a 3FS mount has it) and be writable by this user", target = target.display(), link = link.display())]
    Publish {
        /// The symlink.
        link: PathBuf,
        /// The shared-memory file.
        target: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An I/O asked for memory outside its iov, or the wrong ring direction: refused before
    /// the library sees it.
    #[error("{0}")]
    Refused(String),
    /// Waiting for completions failed with I/Os still pending: the library may still move
    /// bytes into or out of the iov, which is therefore never freed.
    #[error("{pending} I/Os may still be in flight: {source}")]
    Abandoned {
        /// I/Os not known to have completed.
        pending: usize,
        /// Why waiting failed.
        #[source]
        source: Box<UsrbioError>,
    },
}

impl UsrbioError {
    /// The errno of a failed call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            UsrbioError::Call { errno, .. } => Some(*errno),
            UsrbioError::Publish { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// What to do about `errno` from `call`, where something specific helps.
fn hint(call: &str, errno: i32) -> Option<&'static str> {
    match (call, errno) {
        ("hf3fs_reg_fd", libc::EINVAL) => Some(
            "the descriptor number is registered already (a closed fd whose number was reused must be deregistered first)",
        ),
        ("hf3fs_prep_io", libc::EAGAIN) => Some("the ring is full: reap completions first"),
        ("hf3fs_iovcreate" | "hf3fs_iorcreate4", libc::ENOENT) => {
            Some("the mount point is not a 3FS mount, or its virtual dir is missing")
        }
        ("hf3fs_iovcreate" | "hf3fs_iorcreate4", libc::ENOMEM) => {
            Some("not enough shared memory: lower the iov size or ring entries, or raise /dev/shm")
        }
        _ => None,
    }
}
