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

fn open(path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: path is NUL-terminated; the returned fd is owned by OwnedFd.
    let fd = retry_eintr(|| unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o644) })?;
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

/// Writes an object atomically: a temporary file in the bucket dir, then `rename` over the
/// final name. Readers see the old object, the new one, or none — never a partial one.
pub(crate) fn write_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    sync: bool,
) -> Result<(), IoFailure> {
    let fail = |op, p: &PathBuf4k, error| IoFailure {
        op,
        path: p.to_path(),
        error,
    };
    let mut tmp = PathBuf4k::temp(&root.path, bucket).map_err(|e| IoFailure {
        op: "build path",
        path: std::path::PathBuf::from(String::from_utf8_lossy(name).into_owned()),
        error: e,
    })?;
    let mut flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    if root.direct {
        flags |= libc::O_DIRECT;
    }
    let fd = match open(tmp.as_cstr(), flags) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // The bucket dir vanished (someone cleaned the root): recreate it once.
            let mut dir = PathBuf4k::new();
            let _ = dir
                .push(&root.path)
                .and_then(|_| dir.push(b"/"))
                .and_then(|_| dir.push(&bucket));
            // SAFETY: NUL-terminated path.
            unsafe { libc::mkdir(dir.as_cstr().as_ptr(), 0o755) };
            open(tmp.as_cstr(), flags).map_err(|e| fail("create", &tmp, e))?
        }
        Err(e) => return Err(fail("create", &tmp, e)),
    };
    let total: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
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
    let unlink_tmp = |tmp: &mut PathBuf4k| {
        // SAFETY: NUL-terminated path.
        unsafe { libc::unlink(tmp.as_cstr().as_ptr()) };
    };
    if let Err((op, e)) = outcome {
        unlink_tmp(&mut tmp);
        return Err(fail(op, &tmp, e));
    }
    let mut dst = match PathBuf4k::object(&root.path, bucket, name) {
        Ok(p) => p,
        Err(e) => {
            unlink_tmp(&mut tmp);
            return Err(fail("build path", &tmp, e));
        }
    };
    let from = tmp.as_cstr().as_ptr();
    // SAFETY: both paths are NUL-terminated and live across the call.
    let rc = unsafe { libc::rename(from, dst.as_cstr().as_ptr()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        unlink_tmp(&mut tmp);
        return Err(fail("rename", &dst, e));
    }
    Ok(())
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
    let fd = match open(path.as_cstr(), flags) {
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

/// Removes an object; a missing one is fine.
pub(crate) fn remove_object(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<(), IoFailure> {
    let mut path = PathBuf4k::object(&root.path, bucket, name).map_err(|e| IoFailure {
        op: "build path",
        path: std::path::PathBuf::from(String::from_utf8_lossy(name).into_owned()),
        error: e,
    })?;
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
