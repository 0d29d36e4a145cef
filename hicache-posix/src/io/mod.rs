//! Blocking per-object operations: atomic publish, verified reads, stat, unlink.
//!
//! Every path operation goes through [`crate::beneath`]: objects are reached from their
//! bucket dir's handle by one name, and no link is ever followed. Names are built in stack
//! buffers and transfers are single vectored syscalls, so the hot path allocates nothing per
//! page. A short write is continued or reported, a short read is a miss (the file ended):
//! neither counts as success; `EINTR` is retried. What a read saw is judged by
//! [`crate::protocol`], as for the io_uring engine.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::{MissReason, ReadOutcome};

use crate::beneath::{self, RootDir};
use crate::config::SyncMode;
use crate::name::Name;
use crate::protocol::{self, AfterRename, Guard, Stored};

/// A storage dir as the I/O code sees it.
#[derive(Debug)]
pub(crate) struct Root {
    /// The open dir and its bucket dirs.
    pub(crate) dir: RootDir,
    /// Open with O_DIRECT.
    pub(crate) direct: bool,
    /// Recycled object files (None: every write creates a file, every removal unlinks).
    pub(crate) spares: Option<crate::spare::SparePool>,
    /// Permission bits of created page files.
    pub(crate) file_mode: u32,
    /// Flushes that completed under this root (`PosixBackend::flushes`).
    pub(crate) flushed: FlushCounter,
}

/// Counts flushes as they complete, so tests can prove `sync` reaches the disk calls.
#[derive(Debug, Default)]
pub(crate) struct FlushCounter {
    files: AtomicU64,
    dirs: AtomicU64,
}

impl FlushCounter {
    /// An `fdatasync` of a page file returned success.
    pub(crate) fn file(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }

    /// An `fsync` of a bucket dir returned success.
    pub(crate) fn dir(&self) {
        self.dirs.fetch_add(1, Ordering::Relaxed);
    }

    /// (file flushes, dir flushes) so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.files.load(Ordering::Relaxed),
            self.dirs.load(Ordering::Relaxed),
        )
    }
}

/// What failed, for the error message.
#[derive(Debug)]
pub(crate) struct IoFailure {
    pub(crate) op: &'static str,
    pub(crate) path: PathBuf,
    pub(crate) error: io::Error,
}

fn retry_eintr<T: PartialOrd + Default>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        let r = f();
        if r >= T::default() {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Vectored transfer of exactly the iovecs' total, continuing after short transfers.
///
/// Raw `pwritev`/`preadv`, not `nix`'s: those take `IoSlice`s, which are Rust slices, and
/// these iovecs point into registered memory that the kernel reads or writes while only the
/// plan's pins (not Rust references) guard it.
fn transfer_all(fd: &OwnedFd, iov: &[libc::iovec], write: bool) -> io::Result<u64> {
    let total: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    let call = |v: &[libc::iovec], off: u64| -> isize {
        // SAFETY: every iovec points into memory the caller resolved against a live
        // registration; the fd is open.
        unsafe {
            if write {
                libc::pwritev(
                    fd.as_raw_fd(),
                    v.as_ptr(),
                    v.len() as libc::c_int,
                    off as libc::off_t,
                )
            } else {
                libc::preadv(
                    fd.as_raw_fd(),
                    v.as_ptr(),
                    v.len() as libc::c_int,
                    off as libc::off_t,
                )
            }
        }
    };
    let first = retry_eintr(|| call(iov, 0))? as u64;
    if first == total || first == 0 {
        return Ok(first);
    }
    // Short transfer: continue from where it stopped (rare; allocating here is fine).
    let mut rest: Vec<libc::iovec> = iov.to_vec();
    advance(&mut rest, first);
    let mut done = first;
    while done < total {
        let n = retry_eintr(|| call(&rest, done))? as u64;
        if n == 0 {
            break; // EOF (read) or no progress (write): the caller reports the short count
        }
        done += n;
        advance(&mut rest, n);
    }
    Ok(done)
}

/// Drops the first `n` bytes from a list of iovecs.
fn advance(iov: &mut Vec<libc::iovec>, mut n: u64) {
    let mut consumed = 0;
    while consumed < iov.len() && n >= iov[consumed].iov_len as u64 {
        n -= iov[consumed].iov_len as u64;
        consumed += 1;
    }
    iov.drain(..consumed);
    if let Some(head) = iov.first_mut() {
        // SAFETY: n < head.iov_len, so the advanced pointer stays inside the buffer.
        head.iov_base = unsafe { head.iov_base.cast::<u8>().add(n as usize) }.cast();
        head.iov_len -= n as usize;
    }
}

/// Where a write's bytes go before they are published.
enum Staged {
    /// A file in this process's spare dir (recycled, or fresh there).
    Spare(u64, Name),
    /// A temporary file in the bucket dir.
    Temp(Name),
}

impl Root {
    fn bucket_path(&self, bucket: [u8; 2]) -> PathBuf {
        self.dir.bucket_path(bucket)
    }

    /// The bucket dir's handle.
    fn bucket(&self, bucket: [u8; 2]) -> Result<Arc<OwnedFd>, IoFailure> {
        self.dir.bucket(bucket).map_err(|error| IoFailure {
            op: "open bucket dir",
            path: self.bucket_path(bucket),
            error,
        })
    }

    /// The bucket dir's handle again when `fd` was removed from the tree (the dir is
    /// recreated), else None: a miss there is a real miss.
    fn renewed(
        &self,
        bucket: [u8; 2],
        fd: &Arc<OwnedFd>,
    ) -> Result<Option<Arc<OwnedFd>>, IoFailure> {
        if !beneath::is_removed(fd.as_fd()) {
            return Ok(None);
        }
        tracing::debug!(bucket = %self.bucket_path(bucket).display(), "bucket dir was removed; recreating it");
        self.dir
            .reopen(bucket, Some(fd))
            .map(Some)
            .map_err(|error| IoFailure {
                op: "recreate bucket dir",
                path: self.bucket_path(bucket),
                error,
            })
    }
}

/// Writes an object atomically.
///
/// The bytes go to a file no reader can find — a recycled spare of the right size when the
/// root has one (overwritten in place), else a new temporary file with an unpredictable
/// name — which is then published under the final name by `renameat2(RENAME_NOREPLACE)` for a
/// new key, `renameat2(RENAME_EXCHANGE)` for a stored one (the replaced object becomes a
/// spare), or `renameat`. Readers see the old object, the new one,
/// or none — never a partial one. `sync` says what is flushed before the call returns.
pub(crate) fn write_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    sync: SyncMode,
) -> Result<(), IoFailure> {
    let total: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    let direct = if root.direct { libc::O_DIRECT } else { 0 };
    let at = |op, bucket_name: &[u8], error| IoFailure {
        op,
        path: root.dir.object_path(bucket, bucket_name),
        error,
    };
    let mut dst = Name::object(name).map_err(|e| at("build name", name, e))?;
    let mut bdir = root.bucket(bucket)?;
    let spares = root.spares.as_ref().filter(|p| !p.is_lost());
    let staged = spares.and_then(|pool| pool.stage(total, direct, root.file_mode));
    let (mut staged, fd) = match staged {
        Some((id, n, fd)) => (Staged::Spare(id, n), fd),
        None => {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | direct;
            let mut tmp = Name::temp();
            let fd = match beneath::open(bdir.as_fd(), tmp.as_cstr(), flags, root.file_mode) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // The bucket dir vanished (someone cleaned the root): recreate it once.
                    match root.renewed(bucket, &bdir)? {
                        Some(fresh) => bdir = fresh,
                        None => return Err(at("create", tmp.as_bytes(), e)),
                    }
                    beneath::open(bdir.as_fd(), tmp.as_cstr(), flags, root.file_mode)
                        .map_err(|e| at("create", tmp.as_bytes(), e))?
                }
                Err(e) => return Err(at("create", tmp.as_bytes(), e)),
            };
            (Staged::Temp(tmp), fd)
        }
    };
    let outcome = (|| {
        let n = transfer_all(&fd, iov, true).map_err(|e| ("pwritev", e))?;
        if n != total {
            return Err((
                "pwritev",
                io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write: {n} of {total} bytes"),
                ),
            ));
        }
        if sync != SyncMode::None {
            beneath::retry(|| nix::unistd::fdatasync(&fd)).map_err(|e| ("fdatasync", e))?;
            root.flushed.file();
        }
        Ok(())
    })();
    drop(fd);
    if let Err((op, e)) = outcome {
        let path = match &staged {
            Staged::Spare(_, n) => spares
                .expect("staged by the pool")
                .path()
                .join(String::from_utf8_lossy(n.as_bytes()).as_ref()),
            Staged::Temp(n) => root.dir.object_path(bucket, n.as_bytes()),
        };
        discard(&mut staged, spares, &bdir);
        return Err(IoFailure { op, path, error: e });
    }
    if let Err(e) = publish(root, bucket, &mut bdir, &mut staged, &mut dst, spares) {
        discard(&mut staged, spares, &bdir);
        return Err(at("rename", name, e));
    }
    if sync == SyncMode::Full {
        beneath::fsync(bdir.as_fd()).map_err(|error| IoFailure {
            op: "fsync bucket dir",
            path: root.dir.bucket_path(bucket),
            error,
        })?;
        root.flushed.dir();
    }
    Ok(())
}

/// Removes a staged file that will not be published.
fn discard(staged: &mut Staged, spares: Option<&crate::spare::SparePool>, bdir: &OwnedFd) {
    let _ = match staged {
        Staged::Spare(_, n) => match spares {
            Some(pool) => beneath::unlink(pool.fd(), n.as_cstr()),
            None => Ok(()),
        },
        Staged::Temp(n) => beneath::unlink(bdir.as_fd(), n.as_cstr()),
    };
}

/// Moves a staged file under its final name, recreating a bucket dir removed meanwhile.
fn publish(
    root: &Root,
    bucket: [u8; 2],
    bdir: &mut Arc<OwnedFd>,
    staged: &mut Staged,
    dst: &mut Name,
    spares: Option<&crate::spare::SparePool>,
) -> io::Result<()> {
    let renew = |bdir: &mut Arc<OwnedFd>| -> io::Result<bool> {
        match root.renewed(bucket, bdir) {
            Ok(Some(fresh)) => {
                *bdir = fresh;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(f) => Err(f.error),
        }
    };
    match staged {
        Staged::Spare(id, tmp) => {
            let pool = spares.expect("a spare came from the pool");
            if pool.exchange.load(Ordering::Relaxed) {
                let mut exchanged = false;
                let mut result = beneath::rename_noreplace(
                    pool.fd(),
                    tmp.as_cstr(),
                    bdir.as_fd(),
                    dst.as_cstr(),
                );
                loop {
                    match protocol::after_rename(result, exchanged) {
                        AfterRename::Published => {
                            // An exchange left the replaced object under the spare's name.
                            if exchanged
                                && !protocol::recycle(
                                    pool,
                                    *id,
                                    beneath::stat(pool.fd(), tmp.as_cstr()),
                                )
                            {
                                let _ = beneath::unlink(pool.fd(), tmp.as_cstr());
                            }
                            return Ok(());
                        }
                        AfterRename::Exchange => {
                            exchanged = true;
                            result = beneath::exchange(
                                pool.fd(),
                                tmp.as_cstr(),
                                bdir.as_fd(),
                                dst.as_cstr(),
                            );
                        }
                        AfterRename::Rename { unsupported } => {
                            if unsupported {
                                pool.exchange.store(false, Ordering::Relaxed);
                            }
                            break;
                        }
                        // The plain rename below recreates the bucket dir.
                        AfterRename::BucketGone => break,
                        AfterRename::Failed(e) => return Err(e),
                    }
                }
            }
            match beneath::rename(pool.fd(), tmp.as_cstr(), bdir.as_fd(), dst.as_cstr()) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && renew(bdir)? => {
                    beneath::rename(pool.fd(), tmp.as_cstr(), bdir.as_fd(), dst.as_cstr())
                }
                r => r,
            }
        }
        Staged::Temp(tmp) => {
            // A temp file lives in the bucket dir itself: if that dir was removed, the file
            // went with it, and the write fails (the caller may retry).
            beneath::rename(bdir.as_fd(), tmp.as_cstr(), bdir.as_fd(), dst.as_cstr())
        }
    }
}

/// Room a blocking read reuses, one per I/O thread: the guard block and the iovec list it is
/// appended to, so a read allocates nothing once the list has grown to the longest object.
pub(crate) struct ReadScratch {
    guard: Guard,
    /// Filled, used and cleared within one read.
    iov: Vec<libc::iovec>,
}

// SAFETY: the iovec list holds pointers only during one read on the thread that owns the
// scratch (it is cleared before the read returns); the guard is owned memory, like a Box.
unsafe impl Send for ReadScratch {}

impl ReadScratch {
    /// Scratch for roots whose direct-I/O alignment is at most `align`.
    pub(crate) fn new(align: u64) -> io::Result<Self> {
        Ok(ReadScratch {
            guard: Guard::new(align)?,
            iov: Vec::new(),
        })
    }
}

/// Reads an object whose length must be exactly the iovecs' total (see
/// [`crate::protocol`]: one `preadv` of the object and a guard block proves the length).
pub(crate) fn read_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    scratch: &mut ReadScratch,
) -> Result<ReadOutcome, IoFailure> {
    let fail = |op, error| IoFailure {
        op,
        path: root.dir.object_path(bucket, name),
        error,
    };
    let mut n = Name::object(name).map_err(|e| fail("build name", e))?;
    // O_NONBLOCK: opening a FIFO planted under the root must not hang (it changes nothing
    // for regular files).
    let mut flags = libc::O_RDONLY | libc::O_NONBLOCK;
    if root.direct {
        flags |= libc::O_DIRECT;
    }
    // Spares are not reused while a read that may hold one of their inodes is in flight.
    let _reading = root.spares.as_ref().map(|p| ReadGuard::new(&p.reads));
    let mut bdir = root.bucket(bucket)?;
    let fd = loop {
        match beneath::open(bdir.as_fd(), n.as_cstr(), flags, 0) {
            Ok(fd) => break fd,
            Err(e) if e.raw_os_error().is_some_and(protocol::is_missing) => {
                match root.renewed(bucket, &bdir)? {
                    Some(fresh) => bdir = fresh,
                    None => return Ok(ReadOutcome::Miss(MissReason::NotFound)),
                }
            }
            Err(e) => return Err(fail("open", e)),
        }
    };
    let expected: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    scratch.iov.clear();
    scratch.iov.extend_from_slice(iov);
    scratch.iov.push(scratch.guard.iovec());
    // A regular file's read stops short only at its end, so one call tells the length: no
    // continuing (which, under O_DIRECT at an unaligned end, would only fail with EINVAL).
    let list = &scratch.iov;
    // SAFETY: the object's iovecs point into memory the caller resolved against a live
    // registration, the guard's into this thread's scratch; the fd is open.
    let read = retry_eintr(|| unsafe {
        libc::preadv(fd.as_raw_fd(), list.as_ptr(), list.len() as libc::c_int, 0)
    })
    .map_err(|e| fail("preadv", e));
    scratch.iov.clear();
    let read = read? as u64;
    let look = || {
        nix::sys::stat::fstat(&fd).ok().map(|st| Stored {
            regular: beneath::is_file(&st),
            size: st.st_size as u64,
        })
    };
    protocol::read_outcome(
        expected,
        read.min(expected),
        read.saturating_sub(expected),
        look,
    )
    .map_err(|e| fail("preadv", e))
}

/// Marks a read in flight for the spare pool's reuse rule.
struct ReadGuard<'a>(&'a crate::spare::ReadTracker);

impl<'a> ReadGuard<'a> {
    fn new(t: &'a crate::spare::ReadTracker) -> Self {
        t.enter();
        ReadGuard(t)
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.0.exit();
    }
}

/// Whether a complete object exists (a regular file under its final name). A link under
/// the name is an error, never followed.
pub(crate) fn object_exists(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<bool, IoFailure> {
    let fail = |op, error| IoFailure {
        op,
        path: root.dir.object_path(bucket, name),
        error,
    };
    let mut n = Name::object(name).map_err(|e| fail("build name", e))?;
    let mut bdir = root.bucket(bucket)?;
    loop {
        match beneath::stat(bdir.as_fd(), n.as_cstr()) {
            Ok(st) => {
                return protocol::exists_by_type(st.st_mode & libc::S_IFMT)
                    .map_err(|e| fail("stat", e));
            }
            Err(e) if e.raw_os_error().is_some_and(protocol::is_missing) => {
                match root.renewed(bucket, &bdir)? {
                    Some(fresh) => bdir = fresh,
                    None => return Ok(false),
                }
            }
            Err(e) => return Err(fail("stat", e)),
        }
    }
}

/// Removes an object (into the spare pool when it has room); a missing one is fine. A link
/// under the name is unlinked itself, never followed.
pub(crate) fn remove_object(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<(), IoFailure> {
    let fail = |op, error| IoFailure {
        op,
        path: root.dir.object_path(bucket, name),
        error,
    };
    let mut n = Name::object(name).map_err(|e| fail("build name", e))?;
    let bdir = root.bucket(bucket)?;
    if let Some(pool) = root.spares.as_ref().filter(|p| !p.is_lost())
        && let Ok(st) = beneath::stat(bdir.as_fd(), n.as_cstr())
        && beneath::is_file(&st)
    {
        let id = pool.fresh();
        let mut spare = Name::spare(id);
        if beneath::rename(bdir.as_fd(), n.as_cstr(), pool.fd(), spare.as_cstr()).is_ok() {
            // Between the stat and the rename the name may have changed hands: only a
            // regular file is kept.
            if !protocol::recycle(pool, id, beneath::stat(pool.fd(), spare.as_cstr())) {
                let _ = beneath::unlink(pool.fd(), spare.as_cstr());
            }
            return Ok(());
        }
    }
    match beneath::unlink(bdir.as_fd(), n.as_cstr()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(fail("unlink", e)),
    }
}

#[cfg(test)]
mod tests;
