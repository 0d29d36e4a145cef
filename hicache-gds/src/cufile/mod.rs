//! cuFile loaded at run time, never linked: the workspace builds and runs without CUDA, and
//! a machine without GPUDirect Storage gets a reason instead of a failed start.
//!
//! [`CuFile::load`] opens `libcufile.so.0` (an explicit path, else the dynamic loader's
//! search path, else the CUDA toolkit's default place) and resolves every function hicache
//! uses up front, so a wrong library is refused at load with the missing symbol's name. The
//! wrappers turn each `CUfileError_t` and each negative return into a [`GdsError`] with
//! the error's name and a hint.

mod batch;
pub mod sys;

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crate::dynlib::{function, open_first};
use crate::error::GdsError;
pub use batch::{Batch, Op, Request, status_name};

/// Where cuFile is looked for when no path is given: the dynamic loader's search path, then
/// the CUDA toolkit's default install.
pub const SEARCH: [&str; 2] = ["libcufile.so.0", "/usr/local/cuda/lib64/libcufile.so.0"];

/// A loaded cuFile library and the functions hicache calls.
pub struct CuFile {
    path: PathBuf,
    stand_in: bool,
    driver_open: sys::DriverFn,
    driver_close: sys::DriverFn,
    handle_register: sys::HandleRegisterFn,
    handle_deregister: sys::HandleDeregisterFn,
    buf_register: sys::BufRegisterFn,
    buf_deregister: sys::BufDeregisterFn,
    read: sys::ReadFn,
    write: sys::WriteFn,
    batch: Option<batch::BatchFns>,
    // Last: the functions above point into it. It is never unloaded while a `CuFile` lives.
    _library: libloading::Library,
}

impl std::fmt::Debug for CuFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuFile")
            .field("path", &self.path)
            .field("stand_in", &self.stand_in)
            .finish_non_exhaustive()
    }
}

impl CuFile {
    /// Loads cuFile from `path`, or from [`SEARCH`] when `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, GdsError> {
        let (path, library) = open_first(
            path,
            &SEARCH,
            "cuFile",
            "install the CUDA toolkit's GPUDirect Storage package (libcufile.so.0), or name the library with `cufile_path`",
        )?;
        // SAFETY: each type is the function's C signature (sys.rs, from cufile.h); the
        // pointers live in `CuFile` beside the library that owns them.
        unsafe {
            Ok(CuFile {
                stand_in: library
                    .get::<unsafe extern "C" fn()>(b"hicache_cufile_stand_in")
                    .is_ok(),
                driver_open: function(&library, &path, "cuFileDriverOpen")?,
                driver_close: function(&library, &path, "cuFileDriverClose")?,
                handle_register: function(&library, &path, "cuFileHandleRegister")?,
                handle_deregister: function(&library, &path, "cuFileHandleDeregister")?,
                buf_register: function(&library, &path, "cuFileBufRegister")?,
                buf_deregister: function(&library, &path, "cuFileBufDeregister")?,
                read: function(&library, &path, "cuFileRead")?,
                write: function(&library, &path, "cuFileWrite")?,
                // Optional: a library without the batch API still serves GDS_MT.
                batch: (|| -> Result<batch::BatchFns, GdsError> {
                    Ok(batch::BatchFns {
                        setup: function(&library, &path, "cuFileBatchIOSetUp")?,
                        submit: function(&library, &path, "cuFileBatchIOSubmit")?,
                        get_status: function(&library, &path, "cuFileBatchIOGetStatus")?,
                        destroy: function(&library, &path, "cuFileBatchIODestroy")?,
                    })
                })()
                .ok(),
                path,
                _library: library,
            })
        }
    }

    /// The library's path as it was loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is hicache's test stand-in (POSIX I/O with host memory) rather than
    /// NVIDIA's cuFile: what it proves stops at the C interface.
    pub fn is_stand_in(&self) -> bool {
        self.stand_in
    }

    pub(super) fn check(call: &'static str, status: sys::CUfileError) -> Result<(), GdsError> {
        match status.err {
            sys::SUCCESS => Ok(()),
            code => Err(GdsError::Call {
                call,
                code,
                cu_err: status.cu_err,
            }),
        }
    }

    /// `cuFileDriverOpen`: the driver is reference-counted by cuFile; pair each successful
    /// open with [`close_driver`](Self::close_driver).
    pub fn open_driver(&self) -> Result<(), GdsError> {
        // SAFETY: no arguments; callable from any thread (cuFile API).
        Self::check("cuFileDriverOpen", unsafe { (self.driver_open)() })
    }

    /// `cuFileDriverClose`.
    pub fn close_driver(&self) -> Result<(), GdsError> {
        // SAFETY: as above.
        Self::check("cuFileDriverClose", unsafe { (self.driver_close)() })
    }

    /// `cuFileHandleRegister` of an open file; deregistered when the handle is dropped,
    /// which must happen before the file is closed (the borrow says so).
    pub fn register_file<'a>(&'a self, fd: BorrowedFd<'a>) -> Result<FileHandle<'a>, GdsError> {
        let mut descr = sys::CUfileDescr {
            handle_type: sys::HANDLE_TYPE_OPAQUE_FD,
            handle: sys::CUfileDescrHandle {
                handle: std::ptr::null_mut(),
            },
            fs_ops: std::ptr::null(),
        };
        descr.handle.fd = fd.as_raw_fd();
        let mut raw: sys::CUfileHandle = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor for the call; the fd stays open while
        // the handle lives (its borrow).
        let status = unsafe { (self.handle_register)(&mut raw, &mut descr) };
        Self::check("cuFileHandleRegister", status)?;
        Ok(FileHandle { cufile: self, raw })
    }

    /// `cuFileBufRegister` of `len` bytes at `base`.
    ///
    /// # Safety
    /// `base..base + len` must be memory cuFile may use (device memory from `cudaMalloc`,
    /// or host memory) until [`deregister_buffer`](Self::deregister_buffer).
    pub unsafe fn register_buffer(&self, base: *const c_void, len: usize) -> Result<(), GdsError> {
        // SAFETY: the caller's contract.
        Self::check("cuFileBufRegister", unsafe {
            (self.buf_register)(base, len, 0)
        })
    }

    /// `cuFileBufDeregister`.
    ///
    /// # Safety
    /// `base` was registered, and no I/O on it is in flight.
    pub unsafe fn deregister_buffer(&self, base: *const c_void) -> Result<(), GdsError> {
        // SAFETY: the caller's contract.
        Self::check("cuFileBufDeregister", unsafe {
            (self.buf_deregister)(base)
        })
    }

    fn transferred(call: &'static str, n: isize) -> Result<usize, GdsError> {
        match n {
            n if n >= 0 => Ok(n as usize),
            -1 => Err(GdsError::Os {
                call,
                source: std::io::Error::last_os_error(),
            }),
            n => Err(GdsError::Call {
                call,
                code: i32::try_from(n.unsigned_abs()).unwrap_or(i32::MAX),
                cu_err: 0,
            }),
        }
    }

    /// `cuFileRead` of `size` bytes at `file_offset` into `base + buf_offset`; the bytes
    /// read (fewer at the end of the file).
    ///
    /// # Safety
    /// `base + buf_offset .. + size` must be writable memory cuFile may use, and nothing
    /// else may access it during the call.
    pub unsafe fn read(
        &self,
        file: &FileHandle<'_>,
        base: *mut c_void,
        size: usize,
        file_offset: u64,
        buf_offset: u64,
    ) -> Result<usize, GdsError> {
        let (file_offset, buf_offset) = offsets("cuFileRead", file_offset, buf_offset)?;
        // SAFETY: the caller's contract; a live handle.
        let n = unsafe { (self.read)(file.raw, base, size, file_offset, buf_offset) };
        Self::transferred("cuFileRead", n)
    }

    /// `cuFileWrite` of `size` bytes from `base + buf_offset` at `file_offset`; the bytes
    /// written.
    ///
    /// # Safety
    /// `base + buf_offset .. + size` must be readable memory cuFile may use, not written
    /// by anything else during the call.
    pub unsafe fn write(
        &self,
        file: &FileHandle<'_>,
        base: *const c_void,
        size: usize,
        file_offset: u64,
        buf_offset: u64,
    ) -> Result<usize, GdsError> {
        let (file_offset, buf_offset) = offsets("cuFileWrite", file_offset, buf_offset)?;
        // SAFETY: the caller's contract; a live handle.
        let n = unsafe { (self.write)(file.raw, base, size, file_offset, buf_offset) };
        Self::transferred("cuFileWrite", n)
    }
}

/// Offsets as `off_t`; one past its range is an invalid value, never a wrap.
pub(super) fn offsets(
    call: &'static str,
    file: u64,
    buf: u64,
) -> Result<(libc::off_t, libc::off_t), GdsError> {
    let convert = |v: u64| {
        libc::off_t::try_from(v).map_err(|_| GdsError::Os {
            call,
            source: std::io::Error::from_raw_os_error(libc::EOVERFLOW),
        })
    };
    Ok((convert(file)?, convert(buf)?))
}

/// A file registered with cuFile; deregistered on drop.
pub struct FileHandle<'a> {
    cufile: &'a CuFile,
    raw: sys::CUfileHandle,
}

impl std::fmt::Debug for FileHandle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHandle")
            .field("raw", &self.raw)
            .finish()
    }
}

impl Drop for FileHandle<'_> {
    fn drop(&mut self) {
        // SAFETY: a handle cuFileHandleRegister returned, deregistered once; its file is
        // still open (the borrow of the fd outlives the handle).
        unsafe { (self.cufile.handle_deregister)(self.raw) };
    }
}
