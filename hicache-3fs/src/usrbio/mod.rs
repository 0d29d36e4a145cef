//! 3FS's USRBIO library loaded at run time, never linked: the workspace builds and runs
//! without 3FS, and a machine without it gets a reason instead of a failed start.
//!
//! [`Usrbio::load`] opens `libhf3fs_api_shared.so` (an explicit path, else the dynamic
//! loader's search path) and resolves every function hicache uses up front. The wrappers
//! own what the C API leaves to the caller: an [`Iov`] and a [`Ring`] are destroyed on drop,
//! a [`RegisteredFd`] deregistered on drop (before its descriptor can close and its number be
//! reused); `hf3fs_reg_fd`'s inverted convention (≤ 0 success, positive errno failure) is
//! read once, here. [`Ring::run`] preps, submits and reaps a list of I/Os and returns one
//! result per I/O, refusing before the library sees them any I/O outside the iov or of the
//! ring's other direction.

pub mod sys;

use std::ffi::{CString, c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::UsrbioError;

/// Where the library is looked for when no path is given: the dynamic loader's search path.
pub const SEARCH: [&str; 1] = ["libhf3fs_api_shared.so"];

/// A loaded USRBIO library and the functions hicache calls.
pub struct Usrbio {
    path: PathBuf,
    stand_in: bool,
    extract_mount_point: sys::ExtractMountPointFn,
    is_hf3fs: sys::IsHf3fsFn,
    iov_create: sys::IovCreateFn,
    iov_wrap: sys::IovWrapFn,
    iov_destroy: sys::IovDestroyFn,
    ior_create4: sys::IorCreate4Fn,
    ior_destroy: sys::IorDestroyFn,
    reg_fd: sys::RegFdFn,
    dereg_fd: sys::DeregFdFn,
    prep_io: sys::PrepIoFn,
    submit_ios: sys::SubmitIosFn,
    wait_for_ios: sys::WaitForIosFn,
    // Last: the functions above point into it.
    _library: libloading::Library,
}

impl std::fmt::Debug for Usrbio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Usrbio")
            .field("path", &self.path)
            .field("stand_in", &self.stand_in)
            .finish_non_exhaustive()
    }
}

/// The function `symbol` of `library`, copied out.
///
/// # Safety
/// `T` must be the C type of `symbol`; the pointer must not outlive `library`.
unsafe fn function<T: Copy>(
    library: &libloading::Library,
    path: &Path,
    symbol: &'static str,
) -> Result<T, UsrbioError> {
    // SAFETY: the caller's contract.
    unsafe { library.get::<T>(symbol.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| UsrbioError::MissingSymbol {
            path: path.to_path_buf(),
            symbol,
        })
}

fn c_path(path: &Path) -> Result<CString, UsrbioError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| UsrbioError::BadPath {
        path: path.to_path_buf(),
        why: "holds a NUL byte",
    })
}

/// The library's 0-or-minus-errno return as a result.
fn zero_or_errno(call: &'static str, r: c_int) -> Result<(), UsrbioError> {
    match r {
        0 => Ok(()),
        r => Err(UsrbioError::Call {
            call,
            errno: r.checked_neg().filter(|e| *e > 0).unwrap_or(libc::EIO),
        }),
    }
}

impl Usrbio {
    /// Loads the library from `path`, or from [`SEARCH`] when `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, UsrbioError> {
        let candidates: Vec<PathBuf> = match path {
            Some(p) => vec![p.to_path_buf()],
            None => SEARCH.iter().map(PathBuf::from).collect(),
        };
        let mut tried = Vec::new();
        for candidate in candidates {
            // SAFETY: loading runs the initialisers of the library the user named, or of
            // 3FS's client library found on the search path.
            match unsafe { libloading::Library::new(&candidate) } {
                Ok(library) => return Self::resolve(candidate, library),
                Err(e) => tried.push((candidate, e.to_string())),
            }
        }
        Err(UsrbioError::NotFound { tried })
    }

    fn resolve(path: PathBuf, library: libloading::Library) -> Result<Self, UsrbioError> {
        // SAFETY: each type is the function's C signature (sys.rs, from hf3fs_usrbio.h); the
        // pointers live in `Usrbio` beside the library that owns them.
        unsafe {
            Ok(Usrbio {
                stand_in: library
                    .get::<unsafe extern "C" fn()>(b"hicache_usrbio_stand_in")
                    .is_ok(),
                extract_mount_point: function(&library, &path, "hf3fs_extract_mount_point")?,
                is_hf3fs: function(&library, &path, "hf3fs_is_hf3fs")?,
                iov_create: function(&library, &path, "hf3fs_iovcreate")?,
                iov_wrap: function(&library, &path, "hf3fs_iovwrap")?,
                iov_destroy: function(&library, &path, "hf3fs_iovdestroy")?,
                ior_create4: function(&library, &path, "hf3fs_iorcreate4")?,
                ior_destroy: function(&library, &path, "hf3fs_iordestroy")?,
                reg_fd: function(&library, &path, "hf3fs_reg_fd")?,
                dereg_fd: function(&library, &path, "hf3fs_dereg_fd")?,
                prep_io: function(&library, &path, "hf3fs_prep_io")?,
                submit_ios: function(&library, &path, "hf3fs_submit_ios")?,
                wait_for_ios: function(&library, &path, "hf3fs_wait_for_ios")?,
                path,
                _library: library,
            })
        }
    }

    /// The library's path as it was loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is hicache's test stand-in (POSIX I/O in this process) rather than
    /// 3FS's client: what it proves stops at the C interface.
    pub fn is_stand_in(&self) -> bool {
        self.stand_in
    }

    /// The 3FS mount `path` lies under (`hf3fs_extract_mount_point`), or
    /// [`UsrbioError::NotOn3fs`].
    pub fn mount_point(&self, path: &Path) -> Result<PathBuf, UsrbioError> {
        let c = c_path(path)?;
        let mut buf = vec![0u8; 256];
        for _ in 0..2 {
            let size = c_int::try_from(buf.len()).unwrap_or(c_int::MAX);
            // SAFETY: `buf` holds `size` writable bytes; `c` is NUL-terminated.
            let n =
                unsafe { (self.extract_mount_point)(buf.as_mut_ptr().cast(), size, c.as_ptr()) };
            let Ok(needed) = usize::try_from(n) else {
                return Err(UsrbioError::NotOn3fs {
                    path: path.to_path_buf(),
                });
            };
            if needed == 0 || needed > 1 << 16 {
                break;
            }
            if needed <= buf.len() {
                buf.truncate(needed - 1);
                return Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&buf)));
            }
            // Too small: the answer is the length it needs.
            buf = vec![0u8; needed];
        }
        Err(UsrbioError::BadPath {
            path: path.to_path_buf(),
            why: "hf3fs_extract_mount_point gave no usable length for it",
        })
    }

    /// Whether an open file is on 3FS (`hf3fs_is_hf3fs`).
    pub fn is_hf3fs(&self, fd: BorrowedFd<'_>) -> bool {
        // SAFETY: an open descriptor.
        unsafe { (self.is_hf3fs)(fd.as_raw_fd()) }
    }

    /// A new iov of `size` bytes published under `mount` (`hf3fs_iovcreate`, block size 0,
    /// any NUMA node); destroyed on drop.
    pub fn create_iov(self: &Arc<Self>, mount: &Path, size: usize) -> Result<Iov, UsrbioError> {
        let c = c_path(mount)?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut raw: Box<sys::Hf3fsIov> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: a valid out-struct and NUL-terminated mount.
        let r = unsafe { (self.iov_create)(&mut *raw, c.as_ptr(), size, 0, -1) };
        zero_or_errno("hf3fs_iovcreate", r)?;
        Ok(Iov {
            usrbio: self.clone(),
            raw,
            wrapped: false,
            abandoned: AtomicBool::new(false),
        })
    }

    /// Publishes `len` bytes at `base`, the start of the shared-memory file `shm`'s
    /// mapping, to `mount`'s FUSE process, and wraps them as an iov (`hf3fs_iovwrap`): I/O
    /// then moves bytes in place. Publishing is 3FS's protocol: a symlink
    /// `<mount>/3fs-virt/iovs/<id in hex>` to the file, which the FUSE process maps; it is
    /// removed on drop.
    ///
    /// # Safety
    /// `base..base+len` must be a `MAP_SHARED` mapping of `shm` from its start, and stay
    /// mapped while the returned iov lives.
    pub unsafe fn wrap_iov(
        self: &Arc<Self>,
        mount: &Path,
        shm: &Path,
        base: *mut u8,
        len: usize,
    ) -> Result<WrappedIov, UsrbioError> {
        let c = c_path(mount)?;
        let mut id = [0u8; 16];
        // SAFETY: `id` is 16 writable bytes.
        let got = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
        if got != id.len() as isize {
            return Err(UsrbioError::Call {
                call: "getrandom",
                errno: std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            });
        }
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let link = mount.join("3fs-virt/iovs").join(hex);
        std::os::unix::fs::symlink(shm, &link).map_err(|e| UsrbioError::Publish {
            link: link.clone(),
            target: shm.to_path_buf(),
            source: e,
        })?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut raw: Box<sys::Hf3fsIov> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: a valid out-struct, the caller's memory (its contract), a 16-byte id and a
        // NUL-terminated mount.
        let r =
            unsafe { (self.iov_wrap)(&mut *raw, base.cast(), id.as_ptr(), c.as_ptr(), len, 0, -1) };
        if let Err(e) = zero_or_errno("hf3fs_iovwrap", r) {
            let _ = std::fs::remove_file(&link);
            return Err(e);
        }
        Ok(WrappedIov {
            iov: Iov {
                usrbio: self.clone(),
                raw,
                wrapped: true,
                abandoned: AtomicBool::new(false),
            },
            link,
        })
    }

    /// A ring of `entries` slots for reads or writes on `mount` (`hf3fs_iorcreate4`, I/Os
    /// issued as soon as submitted); destroyed on drop.
    pub fn create_ring(
        self: &Arc<Self>,
        mount: &Path,
        entries: u32,
        for_read: bool,
    ) -> Result<Ring, UsrbioError> {
        self.create_batching_ring(mount, entries, for_read, 0, 0)
    }

    /// [`create_ring`](Self::create_ring) whose I/Os the FUSE process may gather into
    /// batches of up to `batch` (3FS's `io_depth = -batch`), waiting at most `timeout_ms`
    /// for a batch to fill; `batch` 0 issues each I/O at once. (3FS's positive `io_depth`,
    /// batches of *exactly* that many, is not offered: a submission with fewer I/Os would
    /// wait forever.)
    pub fn create_batching_ring(
        self: &Arc<Self>,
        mount: &Path,
        entries: u32,
        for_read: bool,
        batch: u32,
        timeout_ms: u32,
    ) -> Result<Ring, UsrbioError> {
        let c = c_path(mount)?;
        let einval = || UsrbioError::Call {
            call: "hf3fs_iorcreate4",
            errno: libc::EINVAL,
        };
        let entries_c = c_int::try_from(entries).map_err(|_| einval())?;
        let io_depth = c_int::try_from(batch).map_err(|_| einval())?.wrapping_neg();
        let timeout = c_int::try_from(timeout_ms).map_err(|_| einval())?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut raw: Box<sys::Hf3fsIor> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: a valid out-struct and NUL-terminated mount.
        let r = unsafe {
            (self.ior_create4)(
                &mut *raw,
                c.as_ptr(),
                entries_c,
                for_read,
                io_depth,
                timeout,
                -1,
                0,
            )
        };
        zero_or_errno("hf3fs_iorcreate4", r)?;
        Ok(Ring {
            usrbio: self.clone(),
            raw,
            entries,
            for_read,
            abandoned: false,
            cqes: Vec::new(),
        })
    }

    /// Registers an open file for USRBIO (`hf3fs_reg_fd`, whose convention is inverted: ≤ 0
    /// is success, a positive errno failure); deregistered on drop, which the borrow puts
    /// before the descriptor can close.
    pub fn register_fd<'a>(&'a self, fd: BorrowedFd<'a>) -> Result<RegisteredFd<'a>, UsrbioError> {
        // SAFETY: an open descriptor.
        let r = unsafe { (self.reg_fd)(fd.as_raw_fd(), 0) };
        if r > 0 {
            return Err(UsrbioError::Call {
                call: "hf3fs_reg_fd",
                errno: r,
            });
        }
        Ok(RegisteredFd { usrbio: self, fd })
    }
}

/// A shared-memory region I/O moves through; destroyed on drop.
pub struct Iov {
    // The library stays loaded while the iov lives.
    usrbio: Arc<Usrbio>,
    // Boxed: the library may keep its address.
    raw: Box<sys::Hf3fsIov>,
    /// Made by `hf3fs_iovwrap`: the memory is the caller's, and `hf3fs_iovdestroy` refuses it.
    wrapped: bool,
    /// I/Os on it may still be in flight: never destroyed.
    abandoned: AtomicBool,
}

// SAFETY: the iov's memory and handle are the library's (or, wrapped, the caller's), usable
// from any thread; `&mut` (Ring::run, bytes_mut) keeps one user of an owned iov's bytes at a
// time, and `Ring::run_in_place`'s contract keeps users of a wrapped iov to disjoint ranges.
unsafe impl Send for Iov {}
// SAFETY: through `&Iov`, safe code reads only the descriptor and an owned iov's bytes
// (`bytes`, empty for a wrapped iov, whose memory is reached only through its region's
// pins); an owned iov's I/O needs `&mut` (`Ring::run`), and I/O through `&Iov` is
// `run_in_place`'s, under its contract.
unsafe impl Sync for Iov {}

impl std::fmt::Debug for Iov {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iov").field("size", &self.raw.size).finish()
    }
}

impl Iov {
    /// Its length.
    pub fn len(&self) -> usize {
        self.raw.size
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.raw.size == 0
    }

    /// Its bytes (no I/O runs on it while it is borrowed: [`Ring::run`] takes it mutably).
    /// Empty for a wrapped iov, whose memory belongs to the caller's region and is reached
    /// through that region's pins, never through the iov.
    pub fn bytes(&self) -> &[u8] {
        if self.raw.base.is_null() || self.wrapped {
            return &[];
        }
        // SAFETY: `size` bytes at `base` belong to the iov while it lives, and no I/O runs
        // on them outside `Ring::run`, which borrows the iov mutably.
        unsafe { std::slice::from_raw_parts(self.raw.base, self.raw.size) }
    }

    /// Its bytes, to fill before a write (empty for a wrapped iov, as [`bytes`](Self::bytes)).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.raw.base.is_null() || self.wrapped {
            return &mut [];
        }
        // SAFETY: as `bytes`, and `&mut self` excludes every other access.
        unsafe { std::slice::from_raw_parts_mut(self.raw.base, self.raw.size) }
    }
}

impl Drop for Iov {
    fn drop(&mut self) {
        if !self.wrapped && !*self.abandoned.get_mut() {
            // SAFETY: created by `create_iov`, destroyed once, no I/O in flight.
            unsafe { (self.usrbio.iov_destroy)(&mut *self.raw) };
        }
    }
}

/// An iov over the caller's shared memory ([`Usrbio::wrap_iov`]); unpublished on drop.
pub struct WrappedIov {
    iov: Iov,
    link: PathBuf,
}

impl std::fmt::Debug for WrappedIov {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrappedIov")
            .field("size", &self.iov.raw.size)
            .field("link", &self.link)
            .finish()
    }
}

impl WrappedIov {
    /// The iov, for [`Ring::run_in_place`].
    pub fn iov(&self) -> &Iov {
        &self.iov
    }

    /// Start of the wrapped memory.
    pub fn base(&self) -> usize {
        self.iov.raw.base as usize
    }

    /// The symlink that publishes it to the FUSE process.
    pub fn link(&self) -> &Path {
        &self.link
    }

    /// Whether I/O on it was abandoned in flight: its memory must then never be freed.
    pub fn abandoned(&self) -> bool {
        self.iov.abandoned.load(Ordering::Acquire)
    }
}

impl Drop for WrappedIov {
    fn drop(&mut self) {
        if !self.abandoned() {
            // The FUSE process lets go of the memory when its link goes.
            let _ = std::fs::remove_file(&self.link);
        }
    }
}

/// A file registered with USRBIO; deregistered on drop.
pub struct RegisteredFd<'a> {
    usrbio: &'a Usrbio,
    fd: BorrowedFd<'a>,
}

impl std::fmt::Debug for RegisteredFd<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredFd")
            .field("fd", &self.fd)
            .finish()
    }
}

impl Drop for RegisteredFd<'_> {
    fn drop(&mut self) {
        // SAFETY: registered by `register_fd`; the descriptor is still open (the borrow).
        unsafe { (self.usrbio.dereg_fd)(self.fd.as_raw_fd()) };
    }
}

/// One I/O for [`Ring::run`]: `len` bytes at `iov_offset` of the iov, to or from `file` at
/// `file_offset`.
#[derive(Clone, Copy, Debug)]
pub struct Io<'f> {
    /// The registered file.
    pub file: &'f RegisteredFd<'f>,
    /// Where in the iov.
    pub iov_offset: usize,
    /// Bytes.
    pub len: usize,
    /// Where in the file.
    pub file_offset: u64,
}

/// A ring for one direction; destroyed on drop. `&mut self` keeps it to one thread at a
/// time, as `prep_io` requires.
pub struct Ring {
    usrbio: Arc<Usrbio>,
    raw: Box<sys::Hf3fsIor>,
    entries: u32,
    for_read: bool,
    /// I/Os on it may still be in flight: never destroyed.
    abandoned: bool,
    /// Completions reaped, reused from run to run.
    cqes: Vec<sys::Hf3fsCqe>,
}

// SAFETY: a ring may be used from any thread, by one at a time (`&mut self` in `run`), as
// the library requires of `prep_io`.
unsafe impl Send for Ring {}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("entries", &self.entries)
            .field("for_read", &self.for_read)
            .finish()
    }
}

impl Ring {
    /// Slots.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Whether it reads (else it writes).
    pub fn for_read(&self) -> bool {
        self.for_read
    }

    /// Runs `ios` through the ring in the ring's direction, at most `entries` at a time:
    /// preps each, submits, and reaps until every prepared I/O has completed. One result per
    /// I/O in order: the bytes moved (short at the end of a file), or its error. An I/O
    /// outside the iov is [`UsrbioError::Refused`] and never reaches the library.
    ///
    /// The outer error is [`UsrbioError::Abandoned`] when submitting or reaping failed with
    /// I/Os pending: the iov and the ring are then never destroyed, since the library may
    /// still use them.
    pub fn run(
        &mut self,
        iov: &mut Iov,
        ios: &[Io<'_>],
    ) -> Result<Vec<Result<u64, UsrbioError>>, UsrbioError> {
        let iov = &*iov;
        let on: Vec<(&Iov, Io<'_>)> = ios.iter().map(|io| (iov, *io)).collect();
        // SAFETY: `&mut` keeps every other access away from the whole iov.
        unsafe { self.run_on(&on) }
    }

    /// [`run`](Self::run) with each I/O on its own iov, which may be shared with other
    /// threads (a [`WrappedIov`] over a pool): I/O moves bytes in place.
    ///
    /// # Safety
    /// The iov ranges the I/Os name must be reserved for this call: nothing else reads or
    /// writes them (for reads) or writes them (for writes) until it returns.
    pub unsafe fn run_in_place(
        &mut self,
        ios: &[(&Iov, Io<'_>)],
    ) -> Result<Vec<Result<u64, UsrbioError>>, UsrbioError> {
        // SAFETY: the caller's contract.
        unsafe { self.run_on(ios) }
    }

    /// # Safety
    /// As [`run_in_place`](Self::run_in_place).
    unsafe fn run_on(
        &mut self,
        ios: &[(&Iov, Io<'_>)],
    ) -> Result<Vec<Result<u64, UsrbioError>>, UsrbioError> {
        // Every iov an I/O was prepared on is kept from destruction if the run is abandoned.
        let abandon = |ring: &mut Ring| {
            ring.abandoned = true;
            for (iov, _) in ios {
                iov.abandoned.store(true, Ordering::Release);
            }
        };
        let mut out: Vec<Option<Result<u64, UsrbioError>>> = ios.iter().map(|_| None).collect();
        let chunk = usize::try_from(self.entries.max(1)).unwrap_or(1);
        for (c, group) in ios.chunks(chunk).enumerate() {
            let first = c * chunk;
            let mut pending = 0usize;
            for (k, (iov, io)) in group.iter().enumerate() {
                let fits = io
                    .iov_offset
                    .checked_add(io.len)
                    .is_some_and(|end| end <= iov.raw.size);
                if !fits {
                    out[first + k] = Some(Err(UsrbioError::Refused(format!(
                        "{} bytes at offset {} are outside the {}-byte iov",
                        io.len, io.iov_offset, iov.raw.size
                    ))));
                    continue;
                }
                // SAFETY: `iov_offset + len` is inside the iov (checked) and reserved for
                // this call (the caller's contract); the ring, iov and file live for it.
                let r = unsafe {
                    (self.usrbio.prep_io)(
                        &*self.raw,
                        &*iov.raw,
                        self.for_read,
                        iov.raw.base.add(io.iov_offset).cast(),
                        io.file.fd.as_raw_fd(),
                        usize::try_from(io.file_offset).unwrap_or(usize::MAX),
                        io.len as u64,
                        (first + k) as *const c_void,
                    )
                };
                match r {
                    r if r >= 0 => pending += 1,
                    r => {
                        out[first + k] = Some(Err(UsrbioError::Call {
                            call: "hf3fs_prep_io",
                            errno: -r,
                        }))
                    }
                }
            }
            if pending == 0 {
                continue;
            }
            // SAFETY: a live ring.
            let submitted = unsafe { (self.usrbio.submit_ios)(&*self.raw) };
            if let Err(e) = zero_or_errno("hf3fs_submit_ios", submitted) {
                // Prepared I/Os may still run: the memory stays.
                abandon(self);
                return Err(UsrbioError::Abandoned {
                    pending,
                    source: Box::new(e),
                });
            }
            // Kept in the ring: no allocation per run once it has grown.
            let mut cqes = std::mem::take(&mut self.cqes);
            cqes.clear();
            cqes.resize(
                pending,
                sys::Hf3fsCqe {
                    index: 0,
                    reserved: 0,
                    result: 0,
                    userdata: std::ptr::null(),
                },
            );
            let mut idle = 0u32;
            while pending > 0 {
                let room = c_int::try_from(pending).unwrap_or(c_int::MAX);
                // SAFETY: `cqes` holds `room` writable entries; a live ring.
                let n = unsafe {
                    (self.usrbio.wait_for_ios)(
                        &*self.raw,
                        cqes.as_mut_ptr(),
                        room,
                        1,
                        std::ptr::null(),
                    )
                };
                let reaped = match usize::try_from(n) {
                    Ok(n) => n.min(pending),
                    Err(_) => {
                        abandon(self);
                        return Err(UsrbioError::Abandoned {
                            pending,
                            source: Box::new(UsrbioError::Call {
                                call: "hf3fs_wait_for_ios",
                                errno: n.checked_neg().unwrap_or(libc::EIO),
                            }),
                        });
                    }
                };
                // A library that keeps answering nothing is not waiting as asked.
                idle = if reaped == 0 { idle + 1 } else { 0 };
                if idle > 10_000 {
                    abandon(self);
                    return Err(UsrbioError::Abandoned {
                        pending,
                        source: Box::new(UsrbioError::Call {
                            call: "hf3fs_wait_for_ios",
                            errno: libc::ETIMEDOUT,
                        }),
                    });
                }
                for cqe in &cqes[..reaped] {
                    let i = cqe.userdata as usize;
                    let Some(slot) = out.get_mut(i).filter(|s| s.is_none()) else {
                        continue;
                    };
                    *slot = Some(if cqe.result >= 0 {
                        Ok(cqe.result as u64)
                    } else {
                        Err(UsrbioError::Call {
                            call: "hf3fs I/O",
                            errno: i32::try_from(-cqe.result).unwrap_or(libc::EIO),
                        })
                    });
                    pending -= 1;
                }
            }
            self.cqes = cqes;
        }
        Ok(out
            .into_iter()
            .map(|r| {
                r.unwrap_or(Err(UsrbioError::Call {
                    call: "hf3fs_wait_for_ios",
                    errno: libc::EIO,
                }))
            })
            .collect())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if !self.abandoned {
            // SAFETY: created by `create_ring`, destroyed once; no I/O of it is in flight.
            unsafe { (self.usrbio.ior_destroy)(&mut *self.raw) };
        }
    }
}
