//! Path operations that cannot leave a storage root.
//!
//! A storage dir is opened once, by the path the user configured. From then on every bucket
//! dir, object, temporary and spare file is reached from an open directory handle by a single
//! name component: dirs (`O_DIRECTORY`) and files with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6+), or `openat` with `O_NOFOLLOW`
//! where the kernel lacks `openat2`. A symbolic link where hicache expects a file or a dir
//! fails with `ELOOP` (reported as [`hicache_core::Error::UnsafePath`]) and is never followed;
//! `stat` never follows one either. Renames and unlinks act on names, never on what a link
//! points to, so a planted link can at worst be renamed or removed, never written through.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag};
use nix::sys::stat::{FileStat, Mode};

/// Whether the kernel has `openat2`: unknown, yes, no.
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// Refuses anything but one plain name component (`a`, not `a/b`, `.` or `..`).
fn check_name(name: &CStr) -> io::Result<()> {
    let b = name.to_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a single path component",
        ));
    }
    Ok(())
}

/// Runs a `nix` call again while it is interrupted (`EINTR`).
pub(crate) fn retry<T>(mut f: impl FnMut() -> nix::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(Errno::EINTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// Opens `name` in `dir` without following any link; `mode` applies when `flags` create it.
pub(crate) fn open(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    check_name(name)?;
    let flags = OFlag::from_bits_retain(flags | libc::O_CLOEXEC);
    let creates = flags.intersects(OFlag::O_CREAT | OFlag::O_TMPFILE);
    // openat2 refuses a mode without O_CREAT.
    let mode = Mode::from_bits_truncate(if creates { mode } else { 0 });
    if OPENAT2.load(Ordering::Relaxed) != 2 {
        // RESOLVE_NO_SYMLINKS refuses a final link too (ELOOP), so the descriptor needs no
        // O_NOFOLLOW, which would stay in its flags: cuFile refuses to register a
        // descriptor that carries it.
        let how = OpenHow::new()
            .flags(flags)
            .mode(mode)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        match retry(|| nix::fcntl::openat2(dir, name, how)) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => OPENAT2.store(2, Ordering::Relaxed),
            // A rename in the same dir while the kernel resolves the name makes a scoped
            // lookup fail its "still beneath?" check (EXDEV) or ask for a retry (EAGAIN).
            // `name` is one checked component and O_NOFOLLOW refuses a final link, so the
            // plain `openat` below is exactly as confined for it; a real escape cannot happen.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EXDEV | libc::EAGAIN)) => {}
            r => {
                OPENAT2.store(1, Ordering::Relaxed);
                return r;
            }
        }
    }
    retry(|| nix::fcntl::openat(dir, name, flags | OFlag::O_NOFOLLOW, mode))
}

/// Opens the dir `name` in `dir` (read-only, so it can be listed and fsynced), refusing links.
pub(crate) fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    match open(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
        // O_DIRECTORY meets a link before O_NOFOLLOW does: say which it was.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => match stat(dir, name) {
            Ok(st) if is_link(&st) => Err(io::Error::from_raw_os_error(libc::ELOOP)),
            _ => Err(e),
        },
        r => r,
    }
}

/// `lstat` of `name` in `dir`.
pub(crate) fn stat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<FileStat> {
    check_name(name)?;
    retry(|| nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW))
}

/// Whether a stat result is a regular file.
pub(crate) fn is_file(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// Whether a stat result is a symbolic link.
pub(crate) fn is_link(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Renames `from` in `from_dir` to `to` in `to_dir`, replacing `to`.
pub(crate) fn rename(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    check_name(from)?;
    check_name(to)?;
    retry(|| nix::fcntl::renameat(from_dir, from, to_dir, to))
}

/// Renames `from` in `from_dir` to `to` in `to_dir` only if `to` does not exist (`EEXIST`
/// when it does).
pub(crate) fn rename_noreplace(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    rename2(from_dir, from, to_dir, to, RenameFlags::RENAME_NOREPLACE)
}

/// Swaps `a` in `a_dir` and `b` in `b_dir` atomically (both must exist).
pub(crate) fn exchange(
    a_dir: BorrowedFd<'_>,
    a: &CStr,
    b_dir: BorrowedFd<'_>,
    b: &CStr,
) -> io::Result<()> {
    rename2(a_dir, a, b_dir, b, RenameFlags::RENAME_EXCHANGE)
}

/// `renameat2` of one name to another with `flags`.
fn rename2(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
    flags: RenameFlags,
) -> io::Result<()> {
    check_name(from)?;
    check_name(to)?;
    retry(|| nix::fcntl::renameat2(from_dir, from, to_dir, to, flags))
}

/// Unlinks the file (or link) `name` in `dir`.
pub(crate) fn unlink(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    check_name(name)?;
    retry(|| nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir))
}

/// Removes the empty dir `name` in `dir`.
pub(crate) fn rmdir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    check_name(name)?;
    retry(|| nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::RemoveDir))
}

/// Creates the dir `name` in `dir` (an existing one is fine) and opens it, refusing links.
pub(crate) fn make_dir(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<OwnedFd> {
    check_name(name)?;
    match retry(|| nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode))) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    open_dir(dir, name)
}

/// `fsync` of an open file or dir.
pub(crate) fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    retry(|| nix::unistd::fsync(fd))
}

/// Whether an open dir was removed from the tree (its link count dropped to zero).
pub(crate) fn is_removed(fd: BorrowedFd<'_>) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_nlink == 0)
}

/// Names in an open dir, without `.` and `..` (read from a duplicate of the handle).
pub(crate) fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::CString>> {
    let dup = dir.try_clone_to_owned()?;
    let mut d = nix::dir::Dir::from_fd(dup).map_err(io::Error::from)?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(io::Error::from)?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Whether an error means a link was found where hicache expects a file or a dir.
pub(crate) fn is_link_error(e: &io::Error) -> bool {
    // ELOOP: O_NOFOLLOW or RESOLVE_NO_SYMLINKS met a link ([`open_dir`] turns the ENOTDIR
    // of a link met by O_DIRECTORY into ELOOP too).
    e.raw_os_error() == Some(libc::ELOOP)
}

/// Bucket dir names: `00`..`ff`.
const BUCKETS: usize = 256;

/// Why the system's root dir is refused as a storage dir.
const SYSTEM_ROOT: &str = "the system's root dir / is not a storage dir: hicache \
    fills its storage dir with 256 bucket dirs and a spare dir; name a dir of its own, e.g. \
    /mnt/nvme/hicache";

/// Refuses `dir` when it is the system's root dir `/` (by identity, so `/.` or a link to `/`
/// too): a storage dir left empty by mistake (`--dir $UNSET/`) would otherwise fill `/`.
pub(crate) fn refuse_system_root(dir: BorrowedFd<'_>) -> io::Result<()> {
    let here = nix::sys::stat::fstat(dir)?;
    let root = nix::sys::stat::stat("/")?;
    if (here.st_dev, here.st_ino) == (root.st_dev, root.st_ino) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, SYSTEM_ROOT));
    }
    Ok(())
}

/// An open storage dir and its bucket dirs, opened on first use and reopened when the tree
/// was removed underneath (someone cleaned the root while hicache runs).
#[derive(Debug)]
pub(crate) struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
    dir_mode: u32,
    buckets: Box<[RwLock<Option<Arc<OwnedFd>>>]>,
}

impl RootDir {
    /// Opens the storage dir `path` (the path itself may be a link the user chose; nothing
    /// beneath it may be).
    pub(crate) fn open(path: &Path, dir_mode: u32) -> io::Result<Self> {
        let fd = retry(|| {
            nix::fcntl::open(
                path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
        })?;
        refuse_system_root(fd.as_fd())?;
        Ok(RootDir {
            fd,
            path: path.to_path_buf(),
            dir_mode,
            buckets: (0..BUCKETS).map(|_| RwLock::new(None)).collect(),
        })
    }

    /// The storage dir's handle.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The storage dir as configured, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The handle of bucket dir `name` (two hex digits), created if missing.
    pub(crate) fn bucket(&self, name: [u8; 2]) -> io::Result<Arc<OwnedFd>> {
        let slot = &self.buckets[bucket_index(name)?];
        if let Some(fd) = slot.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(fd.clone());
        }
        self.reopen(name, None)
    }

    /// Opens bucket `name` again if the cached handle is still `stale` (a dir that was
    /// removed), creating the dir when it is gone; returns the current handle.
    pub(crate) fn reopen(
        &self,
        name: [u8; 2],
        stale: Option<&Arc<OwnedFd>>,
    ) -> io::Result<Arc<OwnedFd>> {
        let slot = &self.buckets[bucket_index(name)?];
        let mut cached = slot.write().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = cached.as_ref()
            && stale.is_none_or(|s| !Arc::ptr_eq(s, fd))
        {
            return Ok(fd.clone()); // another thread reopened it already
        }
        let mut c = [0u8; 3];
        c[..2].copy_from_slice(&name);
        let cname = CStr::from_bytes_with_nul(&c).map_err(io::Error::other)?;
        let fd = Arc::new(make_dir(self.fd(), cname, self.dir_mode)?);
        *cached = Some(fd.clone());
        Ok(fd)
    }

    /// The path of bucket dir `bucket`, for messages.
    pub(crate) fn bucket_path(&self, bucket: [u8; 2]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        self.path.join(std::ffi::OsStr::from_bytes(&bucket))
    }

    /// The path of `name` in bucket `bucket`, for messages.
    pub(crate) fn object_path(&self, bucket: [u8; 2], name: &[u8]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        self.path
            .join(std::ffi::OsStr::from_bytes(&bucket))
            .join(std::ffi::OsStr::from_bytes(name))
    }
}

fn bucket_index(name: [u8; 2]) -> io::Result<usize> {
    let digit = |c: u8| (c as char).to_digit(16);
    match (digit(name[0]), digit(name[1])) {
        (Some(h), Some(l)) => Ok((h * 16 + l) as usize),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bucket names are two hex digits",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn c(s: &str) -> std::ffi::CString {
        std::ffi::CString::new(s).unwrap()
    }

    #[test]
    fn links_are_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"keep").unwrap();
        symlink(outside.path().join("secret"), root.path().join("page")).unwrap();
        symlink(outside.path(), root.path().join("ab")).unwrap();
        let dir = RootDir::open(root.path(), 0o700).unwrap();
        let e = open(dir.fd(), &c("page"), libc::O_WRONLY | libc::O_TRUNC, 0).unwrap_err();
        assert!(is_link_error(&e), "{e}");
        let e = open(dir.fd(), &c("page"), libc::O_RDONLY, 0).unwrap_err();
        assert!(is_link_error(&e), "{e}");
        let e = dir.bucket(*b"ab").unwrap_err();
        assert!(is_link_error(&e), "{e}");
        assert!(is_link(&stat(dir.fd(), &c("page")).unwrap()));
        // Renaming and unlinking act on the link itself.
        unlink(dir.fd(), &c("page")).unwrap();
        assert_eq!(
            std::fs::read(outside.path().join("secret")).unwrap(),
            b"keep"
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    #[test]
    fn names_are_single_components() {
        let root = tempfile::tempdir().unwrap();
        let dir = RootDir::open(root.path(), 0o700).unwrap();
        for bad in ["..", ".", "a/b", "/etc/passwd", ""] {
            let e = open(dir.fd(), &c(bad), libc::O_RDONLY, 0).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
            assert!(stat(dir.fd(), &c(bad)).is_err());
            assert!(unlink(dir.fd(), &c(bad)).is_err());
        }
        assert!(dir.bucket(*b"zz").is_err());
    }

    #[test]
    fn removed_buckets_are_reopened() {
        let root = tempfile::tempdir().unwrap();
        let dir = RootDir::open(root.path(), 0o700).unwrap();
        let b = dir.bucket(*b"0f").unwrap();
        assert!(!is_removed(b.as_fd()));
        std::fs::remove_dir(root.path().join("0f")).unwrap();
        assert!(is_removed(b.as_fd()));
        let again = dir.reopen(*b"0f", Some(&b)).unwrap();
        assert!(!Arc::ptr_eq(&b, &again));
        assert!(root.path().join("0f").is_dir());
        // A second caller holding the same stale handle gets the new one.
        assert!(Arc::ptr_eq(&dir.reopen(*b"0f", Some(&b)).unwrap(), &again));
    }
}
