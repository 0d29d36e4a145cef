//! What a storage dir's filesystem is and what direct I/O needs there.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Alignment assumed when the filesystem does not report `STATX_DIOALIGN` (tmpfs, old
/// kernels): safe on every device in practice.
pub const FALLBACK_ALIGN: u64 = 4096;

/// Filesystem facts of one dir.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FsInfo {
    /// Filesystem type name (`ext4`, `tmpfs`, …) or its magic in hex.
    pub fs_type: String,
    /// Memory alignment for O_DIRECT reported by statx, if reported.
    pub dio_mem_align: Option<u32>,
    /// File offset alignment for O_DIRECT reported by statx, if reported.
    pub dio_offset_align: Option<u32>,
}

impl FsInfo {
    /// The alignment to apply: the larger of the reported memory and offset alignments (and
    /// at least 512), or [`FALLBACK_ALIGN`] when the filesystem reports none.
    pub fn io_alignment(&self) -> u64 {
        match (self.dio_mem_align, self.dio_offset_align) {
            (Some(m), Some(o)) if m > 0 && o > 0 => u64::from(m.max(o)).max(512),
            _ => FALLBACK_ALIGN,
        }
    }
}

pub(crate) fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Queries filesystem type and direct-I/O alignment of `dir`.
pub fn fs_info(dir: &Path) -> io::Result<FsInfo> {
    let c = cstring(dir)?;
    let magic = nix::sys::statfs::statfs(dir)?.filesystem_type().0 as u64;
    // Filesystems report DIOALIGN for regular files, not for dirs: ask about a probe file
    // (an unpredictable name, created exclusively, never through a link).
    let probe =
        crate::beneath::RootDir::open(dir, crate::config::DEFAULT_DIR_MODE).and_then(|root| {
            let name = crate::name::Name::temp();
            let fd = crate::beneath::open(
                root.fd(),
                name.as_cstr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                0o600,
            );
            let _ = crate::beneath::unlink(root.fd(), name.as_cstr());
            fd
        });
    let (mem, off) = match probe {
        Ok(fd) => dio_align(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH),
        Err(_) => dio_align(libc::AT_FDCWD, &c, 0),
    };
    Ok(FsInfo {
        fs_type: fs_name(magic),
        dio_mem_align: mem.filter(|v| *v > 0),
        dio_offset_align: off.filter(|v| *v > 0),
    })
}

/// `statx(STATX_DIOALIGN)`, which `nix` does not wrap.
fn dio_align(
    dirfd: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
) -> (Option<u32>, Option<u32>) {
    // SAFETY: statx writes into a zeroed struct we own; path is NUL-terminated; dirfd is
    // AT_FDCWD or a descriptor the caller holds open.
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::statx(dirfd, path.as_ptr(), flags, libc::STATX_DIOALIGN, &mut stx);
        if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
            (Some(stx.stx_dio_mem_align), Some(stx.stx_dio_offset_align))
        } else {
            (None, None)
        }
    }
}

fn fs_name(magic: u64) -> String {
    match magic {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x6969 => "nfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6573_5546 => "fuse".into(),
        0x8584_58F6 => "ramfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0x0BD0_0BD0 => "lustre".into(),
        0x4741_5346 => "gpfs".into(),
        other => format!("fs-magic-{other:#x}"),
    }
}

/// Free and total bytes of the filesystem holding `dir`.
pub fn space(dir: &Path) -> io::Result<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(dir)?;
    let frsize = st.fragment_size();
    Ok((st.blocks_available() * frsize, st.blocks() * frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_a_type_and_a_sane_alignment() {
        let dir = tempfile::tempdir().unwrap();
        let info = fs_info(dir.path()).unwrap();
        assert!(!info.fs_type.is_empty());
        let a = info.io_alignment();
        assert!(a >= 512 && a.is_power_of_two(), "{info:?}");
        if Path::new("/dev/shm").is_dir() {
            let shm = fs_info(Path::new("/dev/shm")).unwrap();
            assert_eq!(shm.fs_type, "tmpfs");
            assert_eq!(
                shm.io_alignment(),
                FALLBACK_ALIGN,
                "tmpfs reports no DIOALIGN"
            );
        }
        let (free, total) = space(dir.path()).unwrap();
        assert!(total > 0 && free <= total);
        assert!(fs_info(Path::new("/definitely/not/here")).is_err());
    }
}
