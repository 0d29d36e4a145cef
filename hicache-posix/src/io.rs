//! Blocking per-object operations: atomic publish, verified reads, stat, unlink.
//!
//! Paths are built in stack buffers and transfers are single vectored syscalls, so the hot
//! path allocates nothing per page. Short transfers are continued or reported, never counted
//! as success; `EINTR` is retried.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::{MissReason, ReadOutcome};

/// Room for `root/bucket/name` (Linux PATH_MAX).
pub(crate) const PATH_CAP: usize = 4096;

/// A storage dir as the I/O code sees it.
#[derive(Debug)]
pub(crate) struct Root {
    /// The dir path, without trailing slash.
    pub(crate) path: Vec<u8>,
    /// Open with O_DIRECT.
    pub(crate) direct: bool,
    /// Recycled object files (None: every write creates a file, every removal unlinks).
    pub(crate) spares: Option<crate::spare::SparePool>,
    /// Permission bits of created page files.
    pub(crate) file_mode: u32,
    /// Permission bits of created dirs.
    pub(crate) dir_mode: u32,
}

/// What failed, for the error message.
#[derive(Debug)]
pub(crate) struct IoFailure {
    pub(crate) op: &'static str,
    pub(crate) path: std::path::PathBuf,
    pub(crate) error: io::Error,
}

/// A NUL-terminated path in a stack buffer.
pub(crate) struct PathBuf4k {
    buf: [u8; PATH_CAP],
    len: usize,
}

impl PathBuf4k {
    pub(crate) fn new() -> Self {
        PathBuf4k {
            buf: [0; PATH_CAP],
            len: 0,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.len + bytes.len() + 1 > PATH_CAP {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "path longer than PATH_MAX",
            ));
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(())
    }

    pub(crate) fn as_cstr(&mut self) -> &CStr {
        self.buf[self.len] = 0;
        CStr::from_bytes_with_nul(&self.buf[..=self.len]).expect("no interior NUL in names")
    }

    pub(crate) fn to_path(&self) -> std::path::PathBuf {
        use std::os::unix::ffi::OsStrExt;
        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&self.buf[..self.len]))
    }

    /// `root/bucket/name`.
    pub(crate) fn object(root: &[u8], bucket: [u8; 2], name: &[u8]) -> io::Result<Self> {
        let mut p = Self::new();
        p.push(root)?;
        p.push(b"/")?;
        p.push(&bucket)?;
        p.push(b"/")?;
        p.push(name)?;
        Ok(p)
    }

    /// `spare_dir/<id in hex>`.
    pub(crate) fn spare(dir: &[u8], id: u64) -> io::Result<Self> {
        let mut p = Self::new();
        p.push(dir)?;
        p.push(b"/")?;
        p.push(hex(id, &mut [0; 16]))?;
        Ok(p)
    }

    /// `root/bucket/.t<pid>-<n>`: a temporary name no key can take (keys never start with
    /// `.`), unique in this process and across processes.
    pub(crate) fn temp(root: &[u8], bucket: [u8; 2]) -> io::Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut p = Self::new();
        p.push(root)?;
        p.push(b"/")?;
        p.push(&bucket)?;
        p.push(b"/.t")?;
        p.push(hex(std::process::id() as u64, &mut [0; 16]))?;
        p.push(b"-")?;
        p.push(hex(n, &mut [0; 16]))?;
        Ok(p)
    }
}

fn hex(mut v: u64, buf: &mut [u8; 16]) -> &[u8] {
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

/// Opens `path`; `mode` applies when `flags` create the file.
fn open(path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: path is NUL-terminated; the returned fd is owned by OwnedFd.
    let fd = retry_eintr(|| unsafe {
        libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint)
    })?;
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Vectored transfer of exactly the iovecs' total, continuing after short transfers.
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

/// Writes an object atomically.
///
/// The bytes go to a file no reader can find — a recycled spare of the right size when the
/// root has one (overwritten in place), else a new temporary file — which is then published
/// under the final name by `renameat2(RENAME_EXCHANGE)` (the replaced object becomes a spare)
/// or `rename`. Readers see the old object, the new one, or none — never a partial one.
pub(crate) fn write_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    sync: bool,
) -> Result<(), IoFailure> {
    let total: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    let direct = if root.direct { libc::O_DIRECT } else { 0 };
    let fail = |op, p: &PathBuf4k, error| IoFailure {
        op,
        path: p.to_path(),
        error,
    };
    let path_failure = |e: io::Error| IoFailure {
        op: "build path",
        path: std::path::PathBuf::from(String::from_utf8_lossy(name).into_owned()),
        error: e,
    };
    // Where the bytes go first, and the spare id it has (None: a bucket temp file).
    let (mut tmp, spare_id, fd) = match &root.spares {
        Some(pool) => {
            let recycled = pool.take(total).and_then(|id| {
                let mut p = pool.path(id).ok()?;
                match open(p.as_cstr(), libc::O_WRONLY | direct, root.file_mode) {
                    Ok(fd) => Some((p, id, fd)),
                    Err(_) => None, // the spare vanished: create a new file instead
                }
            });
            match recycled {
                Some(r) => r,
                None => {
                    let id = pool.fresh();
                    let mut p = pool.path(id).map_err(path_failure)?;
                    let fd = open(
                        p.as_cstr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | direct,
                        root.file_mode,
                    )
                    .map_err(|e| fail("create", &p, e))?;
                    (p, id, fd)
                }
            }
        }
        None => {
            let mut p = PathBuf4k::temp(&root.path, bucket).map_err(path_failure)?;
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | direct;
            let fd = match open(p.as_cstr(), flags, root.file_mode) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // The bucket dir vanished (someone cleaned the root): recreate it once.
                    let mut dir = PathBuf4k::new();
                    let _ = dir
                        .push(&root.path)
                        .and_then(|_| dir.push(b"/"))
                        .and_then(|_| dir.push(&bucket));
                    // SAFETY: NUL-terminated path.
                    unsafe { libc::mkdir(dir.as_cstr().as_ptr(), root.dir_mode) };
                    open(p.as_cstr(), flags, root.file_mode).map_err(|e| fail("create", &p, e))?
                }
                Err(e) => return Err(fail("create", &p, e)),
            };
            (p, u64::MAX, fd)
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
        if sync {
            // SAFETY: fd is open.
            retry_eintr(|| unsafe { libc::fdatasync(fd.as_raw_fd()) })
                .map_err(|e| ("fdatasync", e))?;
        }
        Ok(())
    })();
    drop(fd);
    let discard = |tmp: &mut PathBuf4k| {
        // SAFETY: NUL-terminated path.
        unsafe { libc::unlink(tmp.as_cstr().as_ptr()) };
    };
    if let Err((op, e)) = outcome {
        discard(&mut tmp);
        return Err(fail(op, &tmp, e));
    }
    let mut dst = match PathBuf4k::object(&root.path, bucket, name) {
        Ok(p) => p,
        Err(e) => {
            discard(&mut tmp);
            return Err(fail("build path", &tmp, e));
        }
    };
    if let Some(pool) = root
        .spares
        .as_ref()
        .filter(|p| p.exchange.load(std::sync::atomic::Ordering::Relaxed))
    {
        // SAFETY: both paths are NUL-terminated and live across the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                tmp.as_cstr().as_ptr(),
                libc::AT_FDCWD,
                dst.as_cstr().as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc == 0 {
            // The replaced object now has the spare's name: keep it for the next write.
            match file_len(&mut tmp) {
                Some(len) if pool.give(spare_id, len) => {}
                _ => discard(&mut tmp),
            }
            return Ok(());
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT) => {} // nothing to replace: a plain rename publishes it
            Some(libc::EINVAL) | Some(libc::ENOSYS) => pool
                .exchange
                .store(false, std::sync::atomic::Ordering::Relaxed),
            _ => {
                let e = io::Error::last_os_error();
                discard(&mut tmp);
                return Err(fail("rename", &dst, e));
            }
        }
    }
    let from = tmp.as_cstr().as_ptr();
    // SAFETY: both paths are NUL-terminated and live across the call.
    let rc = unsafe { libc::rename(from, dst.as_cstr().as_ptr()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        discard(&mut tmp);
        return Err(fail("rename", &dst, e));
    }
    Ok(())
}

fn file_len(path: &mut PathBuf4k) -> Option<u64> {
    // SAFETY: NUL-terminated path; stat writes into a zeroed struct we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::stat(path.as_cstr().as_ptr(), &mut st) == 0).then_some(st.st_size as u64)
    }
}

/// Reads an object whose length must be exactly the iovecs' total.
pub(crate) fn read_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
) -> Result<ReadOutcome, IoFailure> {
    let mut path = PathBuf4k::object(&root.path, bucket, name).map_err(|e| IoFailure {
        op: "build path",
        path: std::path::PathBuf::from(String::from_utf8_lossy(name).into_owned()),
        error: e,
    })?;
    let fail = |op, p: &PathBuf4k, error| IoFailure {
        op,
        path: p.to_path(),
        error,
    };
    let mut flags = libc::O_RDONLY;
    if root.direct {
        flags |= libc::O_DIRECT;
    }
    // Spares are not reused while a read that may hold one of their inodes is in flight.
    let _reading = root.spares.as_ref().map(|p| ReadGuard::new(&p.reads));
    let fd = match open(path.as_cstr(), flags, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(ReadOutcome::Miss(MissReason::NotFound));
        }
        Err(e) => return Err(fail("open", &path, e)),
    };
    let expected: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    // SAFETY: fstat writes into a zeroed struct we own; fd is open.
    let size = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(fail("fstat", &path, io::Error::last_os_error()));
        }
        st.st_size as u64
    };
    if size != expected {
        return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
            expected,
            found: size,
        }));
    }
    let n = transfer_all(&fd, iov, false).map_err(|e| fail("preadv", &path, e))?;
    if n != expected {
        return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
            expected,
            found: n,
        }));
    }
    Ok(ReadOutcome::Hit)
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

/// Whether a complete object exists (a regular file under its final name).
pub(crate) fn object_exists(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<bool, IoFailure> {
    let mut path = PathBuf4k::object(&root.path, bucket, name).map_err(|e| IoFailure {
        op: "build path",
        path: std::path::PathBuf::from(String::from_utf8_lossy(name).into_owned()),
        error: e,
    })?;
    // SAFETY: NUL-terminated path; stat writes into a zeroed struct we own.
    let rc = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let rc = libc::stat(path.as_cstr().as_ptr(), &mut st);
        if rc == 0 {
            return Ok(st.st_mode & libc::S_IFMT == libc::S_IFREG);
        }
        rc
    };
    debug_assert!(rc != 0);
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::NotFound => Ok(false),
        _ if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
        _ => Err(IoFailure {
            op: "stat",
            path: path.to_path(),
            error: e,
        }),
    }
}

/// Removes an object (into the spare pool when it has room); a missing one is fine.
pub(crate) fn remove_object(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<(), IoFailure> {
    let mut path = PathBuf4k::object(&root.path, bucket, name).map_err(|e| IoFailure {
        op: "build path",
        path: std::path::PathBuf::from(String::from_utf8_lossy(name).into_owned()),
        error: e,
    })?;
    if let Some(pool) = &root.spares
        && let Some(len) = file_len(&mut path)
    {
        let id = pool.fresh();
        if let Ok(mut spare) = pool.path(id) {
            // SAFETY: both paths are NUL-terminated and live across the call.
            let moved =
                unsafe { libc::rename(path.as_cstr().as_ptr(), spare.as_cstr().as_ptr()) } == 0;
            if moved {
                if !pool.give(id, len) {
                    // SAFETY: NUL-terminated path.
                    unsafe { libc::unlink(spare.as_cstr().as_ptr()) };
                }
                return Ok(());
            }
        }
    }
    // SAFETY: NUL-terminated path.
    if unsafe { libc::unlink(path.as_cstr().as_ptr()) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::NotFound {
        return Ok(());
    }
    Err(IoFailure {
        op: "unlink",
        path: path.to_path(),
        error: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(dir: &std::path::Path, direct: bool) -> Root {
        use std::os::unix::ffi::OsStrExt;
        std::fs::create_dir_all(dir.join("ab")).unwrap();
        Root {
            path: dir.as_os_str().as_bytes().to_vec(),
            direct,
            spares: None,
            file_mode: 0o600,
            dir_mode: 0o700,
        }
    }

    fn iov(buf: &mut [u8]) -> libc::iovec {
        libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }
    }

    #[test]
    fn write_read_stat_remove() {
        let dir = tempfile::tempdir().unwrap();
        let r = root(dir.path(), false);
        let mut a = vec![1u8; 100];
        let mut b = vec![2u8; 50];
        write_object(&r, *b"ab", b"obj", &[iov(&mut a), iov(&mut b)], true).unwrap();
        assert!(object_exists(&r, *b"ab", b"obj").unwrap());
        let on_disk = std::fs::read(dir.path().join("ab/obj")).unwrap();
        assert_eq!(on_disk.len(), 150);
        let mut x = vec![0u8; 120];
        let mut y = vec![0u8; 30];
        let out = read_object(&r, *b"ab", b"obj", &[iov(&mut x), iov(&mut y)]).unwrap();
        assert_eq!(out, ReadOutcome::Hit);
        assert!(x[..100].iter().all(|v| *v == 1) && x[100..].iter().all(|v| *v == 2));
        assert!(y.iter().all(|v| *v == 2));
        let mut short = vec![0u8; 149];
        assert!(matches!(
            read_object(&r, *b"ab", b"obj", &[iov(&mut short)]).unwrap(),
            ReadOutcome::Miss(MissReason::SizeMismatch {
                expected: 149,
                found: 150
            })
        ));
        assert_eq!(
            read_object(&r, *b"ab", b"none", &[iov(&mut short)]).unwrap(),
            ReadOutcome::Miss(MissReason::NotFound)
        );
        remove_object(&r, *b"ab", b"obj").unwrap();
        remove_object(&r, *b"ab", b"obj").unwrap();
        assert!(!object_exists(&r, *b"ab", b"obj").unwrap());
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path().join("ab")).unwrap().count(), 0);
    }

    #[test]
    fn missing_bucket_dir_is_recreated_on_write() {
        let dir = tempfile::tempdir().unwrap();
        let r = root(dir.path(), false);
        std::fs::remove_dir(dir.path().join("ab")).unwrap();
        let mut a = vec![3u8; 10];
        write_object(&r, *b"ab", b"obj", &[iov(&mut a)], false).unwrap();
        assert!(object_exists(&r, *b"ab", b"obj").unwrap());
    }

    #[test]
    fn errors_name_the_path() {
        let r = Root {
            path: b"/definitely/not/here".to_vec(),
            direct: false,
            spares: None,
            file_mode: 0o600,
            dir_mode: 0o700,
        };
        let mut a = vec![3u8; 10];
        let e = write_object(&r, *b"ab", b"obj", &[iov(&mut a)], false).unwrap_err();
        assert_eq!(e.op, "create");
        assert!(
            e.path.starts_with("/definitely/not/here/ab"),
            "{:?}",
            e.path
        );
        let long = vec![b'x'; PATH_CAP];
        assert!(read_object(&r, *b"ab", &long, &[iov(&mut a)]).is_err());
    }

    #[test]
    fn replaced_and_removed_objects_are_recycled() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ab")).unwrap();
        let r = Root {
            path: dir.path().as_os_str().as_bytes().to_vec(),
            direct: false,
            spares: Some(crate::spare::SparePool::new(dir.path(), 200, 0o700).unwrap()),
            file_mode: 0o600,
            dir_mode: 0o700,
        };
        let pool = r.spares.as_ref().unwrap();
        let mut a = vec![1u8; 100];
        let mut b = vec![2u8; 100];
        write_object(&r, *b"ab", b"k", &[iov(&mut a)], false).unwrap();
        assert_eq!(pool.len(), 0);
        // Replacing k keeps the old file as a spare; the new content is published.
        write_object(&r, *b"ab", b"k", &[iov(&mut b)], false).unwrap();
        assert_eq!(pool.len(), 1);
        assert_eq!(
            std::fs::read(dir.path().join("ab/k")).unwrap(),
            vec![2u8; 100]
        );
        // Once no read is in flight, the next 100-byte object reuses that spare in place.
        let mut probe = vec![0u8; 100];
        assert_eq!(
            read_object(&r, *b"ab", b"k", &[iov(&mut probe)]).unwrap(),
            ReadOutcome::Hit
        );
        let mut c = vec![3u8; 100];
        write_object(&r, *b"ab", b"other", &[iov(&mut c)], false).unwrap();
        assert_eq!(pool.len(), 0);
        assert_eq!(
            std::fs::read(dir.path().join("ab/other")).unwrap(),
            vec![3u8; 100]
        );
        assert_eq!(
            std::fs::read(dir.path().join("ab/k")).unwrap(),
            vec![2u8; 100]
        );
        // A spare of another size is not used.
        remove_object(&r, *b"ab", b"other").unwrap();
        assert_eq!(pool.len(), 1);
        let mut d = vec![4u8; 50];
        write_object(&r, *b"ab", b"small", &[iov(&mut d)], false).unwrap();
        assert_eq!(pool.len(), 1);
        assert_eq!(
            std::fs::read(dir.path().join("ab/small")).unwrap(),
            vec![4u8; 50]
        );
        // The cap (200 bytes) holds: a spare that would exceed it is unlinked, not pooled.
        remove_object(&r, *b"ab", b"k").unwrap();
        remove_object(&r, *b"ab", b"small").unwrap();
        assert_eq!(pool.len(), 2);
        assert!(!dir.path().join("ab/k").exists());
        assert_eq!(std::fs::read_dir(dir.path().join("ab")).unwrap().count(), 0);
    }

    #[test]
    fn advance_drops_consumed_bytes() {
        let mut a = [0u8; 10];
        let mut b = [0u8; 5];
        let mut v = vec![iov(&mut a), iov(&mut b)];
        advance(&mut v, 12);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].iov_len, 3);
        assert_eq!(v[0].iov_base as usize, b.as_ptr() as usize + 2);
        advance(&mut v, 3);
        assert!(v.is_empty());
    }

    #[test]
    fn hex_names() {
        assert_eq!(hex(0, &mut [0; 16]), b"0");
        assert_eq!(hex(0xabc, &mut [0; 16]), b"abc");
        assert_eq!(hex(u64::MAX, &mut [0; 16]), b"ffffffffffffffff");
    }
}
