//! Host memory in a shared-memory file: memory another process can map by path.
//!
//! Some storage clients do their I/O in a helper process: 3FS's FUSE process reads and writes
//! only memory it has mapped itself, found through a file in `/dev/shm`. A region made here
//! is such a file's `MAP_SHARED` mapping, so that process can move pages in place instead of
//! through a bounce buffer. The file is created new (never opened if it exists), private to
//! the user (`0600`), and unlinked when the last clone of the region goes.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

use super::{MemKind, MemoryRegion};

/// Where shared-memory regions are made unless a dir is given: Linux's POSIX shm tmpfs, the
/// one dir 3FS's FUSE process maps iovs from.
pub const SHM_DIR: &str = "/dev/shm";

/// The file a region's bytes are shared through: the region is the file's first
/// [`len`](Self::len) bytes, mapped `MAP_SHARED`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedFile {
    path: PathBuf,
    len: u64,
}

impl SharedFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes mapped (the file's size).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The mapping and its file, unlinked when the last region clone or pin goes.
struct SharedMapping {
    _map: memmap2::MmapMut,
    path: PathBuf,
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot unlink a shared-memory file");
        }
    }
}

/// A name no other region of this process uses, and unlikely in any other process.
fn fresh_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "hicache-{}-{}-{nanos:08x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

impl MemoryRegion {
    /// `len` zeroed, reserved (`posix_fallocate`: a full tmpfs is an error here, never a
    /// `SIGBUS` later) and pre-faulted bytes of host memory in a new file under [`SHM_DIR`], mapped
    /// shared: see [`MemoryRegion::shared_file`].
    pub fn shared_host(len: u64) -> Result<Self> {
        Self::shared_host_in(Path::new(SHM_DIR), len)
    }

    /// As [`shared_host`](Self::shared_host), with the file in `dir` (a tmpfs, or the
    /// memory is written back to disk).
    pub fn shared_host_in(dir: &Path, len: u64) -> Result<Self> {
        let size = usize::try_from(len)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Error::InvalidPool {
                reason: format!("a shared-memory region of {len} bytes cannot be mapped"),
            })?;
        let refused = |path: &Path, what: &str, e: std::io::Error| Error::InvalidPool {
            reason: format!(
                "cannot {what} the shared-memory file {}: {e}; the dir must be a writable tmpfs with {len} bytes free (`df {}`)",
                path.display(),
                dir.display()
            ),
        };
        let mut made = None;
        for _ in 0..8 {
            let path = dir.join(fresh_name());
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(&path)
            {
                Ok(file) => {
                    made = Some((path, file));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(refused(&path, "create", e)),
            }
        }
        let (path, file) = made.ok_or_else(|| Error::InvalidPool {
            reason: format!(
                "cannot create a shared-memory file in {}: every fresh name was taken",
                dir.display()
            ),
        })?;
        let mapped = file
            .set_len(len)
            .map_err(|e| refused(&path, "size", e))
            .and_then(|()| {
                // Reserve every page now: on a full tmpfs, touching an unreserved page of
                // the mapping would be SIGBUS instead of this error.
                let end = libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX);
                // SAFETY: a plain call on an open descriptor.
                match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, end) } {
                    0 => Ok(()),
                    rc => Err(refused(
                        &path,
                        "reserve",
                        std::io::Error::from_raw_os_error(rc),
                    )),
                }
            })
            .and_then(|()| {
                // SAFETY: the file is new, private (0600, exclusive create) and sized to
                // `size`; nothing in this process truncates it while the map lives.
                unsafe { memmap2::MmapOptions::new().len(size).map_mut(&file) }
                    .map_err(|e| refused(&path, "map", e))
            });
        let mut map = match mapped {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        prefault(&mut map);
        let addr = map.as_mut_ptr();
        let shared = SharedFile {
            path: path.clone(),
            len,
        };
        let owner = Arc::new(SharedMapping { _map: map, path });
        // SAFETY: the mapping is `len` bytes and lives as long as the owner; no reference to
        // its bytes is kept here, so the region's pins are their only way in (another
        // process mapping the file is the point, and is the user's to arrange).
        let mut region = unsafe { MemoryRegion::with_owner(addr, len, MemKind::Host, owner) };
        if let Some(inner) = Arc::get_mut(&mut region.inner) {
            inner.shared = Some(shared);
        }
        Ok(region)
    }

    /// The shared-memory file the region's bytes are, when it was made by
    /// [`shared_host`](Self::shared_host): a plugin whose I/O runs in another process (3FS)
    /// can have that process map the file and move the bytes in place.
    pub fn shared_file(&self) -> Option<&SharedFile> {
        self.inner.shared.as_ref()
    }
}

/// Faults every page of a fresh mapping in now, so first-touch faults stay out of
/// transfers and benchmarks.
pub(crate) fn prefault(map: &mut memmap2::MmapMut) {
    // Miri has no madvise; touching every page is the portable path.
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        // MADV_POPULATE_WRITE (Linux 5.14) faults every page in one call.
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: the range is exactly our live mapping.
        let rc = unsafe { libc::madvise(map.as_mut_ptr().cast(), map.len(), MADV_POPULATE_WRITE) };
        if rc == 0 {
            return;
        }
    }
    for chunk in map.chunks_mut(4096) {
        chunk[0] = 0;
    }
}
