//! USRBIO's C types, as `hf3fs_usrbio.h` lays them out on x86-64 Linux, and the functions'
//! C signatures. The layouts are checked by the tests below.

use std::ffi::{c_char, c_int, c_void};

/// `struct hf3fs_iov`: a shared-memory region the FUSE process also maps (312 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Hf3fsIov {
    /// Start of the memory.
    pub base: *mut u8,
    /// The library's handle.
    pub iovh: *mut c_void,
    /// The shm's id (16 bytes).
    pub id: [u8; 16],
    /// The mount it is published under.
    pub mount_point: [c_char; 256],
    /// Bytes.
    pub size: usize,
    /// Block size (0: one block).
    pub block_size: usize,
    /// NUMA node (-1: any).
    pub numa: c_int,
}

/// `struct hf3fs_ior`: a submission and completion ring, one direction only (600 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Hf3fsIor {
    /// The ring's own shared memory.
    pub iov: Hf3fsIov,
    /// The library's handle.
    pub iorh: *mut c_void,
    /// The mount.
    pub mount_point: [c_char; 256],
    /// A read ring (else a write ring).
    pub for_read: bool,
    /// Batching: 0 issues at once, > 0 in batches of exactly that many, < 0 of at most.
    pub io_depth: c_int,
    /// Priority.
    pub priority: c_int,
    /// Milliseconds a partial batch waits (with `io_depth` < 0).
    pub timeout: c_int,
    /// Flags.
    pub flags: u64,
}

/// `struct hf3fs_cqe`: one completion (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Hf3fsCqe {
    /// The ring slot.
    pub index: i32,
    /// Unused.
    pub reserved: i32,
    /// Bytes moved, or `-errno`.
    pub result: i64,
    /// What `prep_io` was given.
    pub userdata: *const c_void,
}

/// `hf3fs_extract_mount_point(out, size, path)`: length + 1, or -1 when not on 3FS.
pub type ExtractMountPointFn = unsafe extern "C" fn(*mut c_char, c_int, *const c_char) -> c_int;
/// `hf3fs_is_hf3fs(fd)`.
pub type IsHf3fsFn = unsafe extern "C" fn(c_int) -> bool;
/// `hf3fs_iovcreate(iov, mount, size, block_size, numa)`: 0 or -errno.
pub type IovCreateFn =
    unsafe extern "C" fn(*mut Hf3fsIov, *const c_char, usize, usize, c_int) -> c_int;
/// `hf3fs_iovwrap(iov, base, id, mount, size, block_size, numa)`: 0 or -errno.
pub type IovWrapFn = unsafe extern "C" fn(
    *mut Hf3fsIov,
    *mut c_void,
    *const u8,
    *const c_char,
    usize,
    usize,
    c_int,
) -> c_int;
/// `hf3fs_iovdestroy(iov)`.
pub type IovDestroyFn = unsafe extern "C" fn(*mut Hf3fsIov);
/// `hf3fs_iorcreate4(ior, mount, entries, for_read, io_depth, timeout, numa, flags)`.
pub type IorCreate4Fn = unsafe extern "C" fn(
    *mut Hf3fsIor,
    *const c_char,
    c_int,
    bool,
    c_int,
    c_int,
    c_int,
    u64,
) -> c_int;
/// `hf3fs_iordestroy(ior)`.
pub type IorDestroyFn = unsafe extern "C" fn(*mut Hf3fsIor);
/// `hf3fs_reg_fd(fd, flags)`: **≤ 0 on success, a positive errno on failure**.
pub type RegFdFn = unsafe extern "C" fn(c_int, u64) -> c_int;
/// `hf3fs_dereg_fd(fd)`.
pub type DeregFdFn = unsafe extern "C" fn(c_int);
/// `hf3fs_prep_io(ior, iov, read, ptr, fd, off, len, userdata)`: slot index, or -errno.
pub type PrepIoFn = unsafe extern "C" fn(
    *const Hf3fsIor,
    *const Hf3fsIov,
    bool,
    *mut c_void,
    c_int,
    usize,
    u64,
    *const c_void,
) -> c_int;
/// `hf3fs_submit_ios(ior)`: 0 or -errno.
pub type SubmitIosFn = unsafe extern "C" fn(*const Hf3fsIor) -> c_int;
/// `hf3fs_wait_for_ios(ior, cqes, cqec, min_results, abs_timeout)`: completions, or -errno.
pub type WaitForIosFn =
    unsafe extern "C" fn(*const Hf3fsIor, *mut Hf3fsCqe, c_int, c_int, *const c_void) -> c_int;

/// `HF3FS_SUPER_MAGIC`: statfs `f_type` of a 3FS mount.
pub const HF3FS_SUPER_MAGIC: i64 = 0x8f3f_5fff;

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_match_hf3fs_usrbio_h_on_x86_64() {
        assert_eq!(size_of::<Hf3fsIov>(), 312);
        assert_eq!(offset_of!(Hf3fsIov, id), 16);
        assert_eq!(offset_of!(Hf3fsIov, mount_point), 32);
        assert_eq!(offset_of!(Hf3fsIov, size), 288);
        assert_eq!(offset_of!(Hf3fsIov, block_size), 296);
        assert_eq!(offset_of!(Hf3fsIov, numa), 304);
        assert_eq!(offset_of!(Hf3fsIor, iorh), 312);
        assert_eq!(offset_of!(Hf3fsIor, mount_point), 320);
        assert_eq!(offset_of!(Hf3fsIor, for_read), 576);
        assert_eq!(offset_of!(Hf3fsIor, io_depth), 580);
        assert_eq!(offset_of!(Hf3fsIor, flags), 592);
        assert_eq!(size_of::<Hf3fsIor>(), 600);
        assert_eq!(size_of::<Hf3fsCqe>(), 24);
        assert_eq!(offset_of!(Hf3fsCqe, result), 8);
        assert_eq!(offset_of!(Hf3fsCqe, userdata), 16);
    }
}
