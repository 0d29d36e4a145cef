//! cuFile's C types and constants, as `cufile.h` lays them out on x86-64 Linux, written from
//! NVIDIA's cuFile API reference. The tests here check the layouts against the stand-in's C
//! declarations; the layouts, the constants below and the 32 error codes `GdsError` names
//! were also compiled against the real `cufile.h` of cuFile 1.15.1 and matched.

use std::ffi::{c_int, c_void};

/// `CUfileError_t`: returned by value. `err` is a `CUfileOpError`; `cu_err` a `CUresult`,
/// meaningful when `err` is [`CUDA_DRIVER_ERROR`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUfileError {
    /// `CUfileOpError`.
    pub err: c_int,
    /// `CUresult`.
    pub cu_err: c_int,
}

/// The union of `CUfileDescr_t`: a POSIX file descriptor or an OS handle.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CUfileDescrHandle {
    /// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
    pub fd: c_int,
    /// Other handle types.
    pub handle: *mut c_void,
}

/// `CUfileDescr_t`: 24 bytes, the union at offset 8 (a wrong layout is error 5018).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileDescr {
    /// `CUfileFileHandleType`.
    pub handle_type: c_int,
    /// The descriptor.
    pub handle: CUfileDescrHandle,
    /// `const CUfileFSOps_t *`: NULL for a POSIX descriptor.
    pub fs_ops: *const c_void,
}

/// `CUfileHandle_t`.
pub type CUfileHandle = *mut c_void;

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
pub const HANDLE_TYPE_OPAQUE_FD: c_int = 1;

/// `CU_FILE_SUCCESS`.
pub const SUCCESS: c_int = 0;
/// `CU_FILE_CUDA_DRIVER_ERROR`: `cu_err` holds the CUDA error.
pub const CUDA_DRIVER_ERROR: c_int = 5011;
/// `CU_FILE_HANDLE_NOT_REGISTERED`: also what `cuFileHandleRegister` returns when cuFile
/// cannot read the block device's udev properties.
pub const HANDLE_NOT_REGISTERED: c_int = 5027;

/// `cuFileDriverOpen`, `cuFileDriverClose`.
pub type DriverFn = unsafe extern "C" fn() -> CUfileError;
/// `cuFileHandleRegister`.
pub type HandleRegisterFn =
    unsafe extern "C" fn(fh: *mut CUfileHandle, descr: *mut CUfileDescr) -> CUfileError;
/// `cuFileHandleDeregister`.
pub type HandleDeregisterFn = unsafe extern "C" fn(fh: CUfileHandle);
/// `cuFileBufRegister`.
pub type BufRegisterFn =
    unsafe extern "C" fn(base: *const c_void, len: usize, flags: c_int) -> CUfileError;
/// `cuFileBufDeregister`.
pub type BufDeregisterFn = unsafe extern "C" fn(base: *const c_void) -> CUfileError;
/// `cuFileRead`: bytes read, or -1 with errno, or a negative `CUfileOpError`.
pub type ReadFn = unsafe extern "C" fn(
    fh: CUfileHandle,
    base: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> isize;
/// `cuFileWrite`: bytes written, or -1 with errno, or a negative `CUfileOpError`.
pub type WriteFn = unsafe extern "C" fn(
    fh: CUfileHandle,
    base: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_offset: libc::off_t,
) -> isize;

/// The I/O of one batch request (the `batch` member of `CUfileIOParams_t`'s union, its
/// only one).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileBatchIo {
    /// Device or host memory.
    pub base: *mut c_void,
    /// Where in the file.
    pub file_offset: libc::off_t,
    /// Where in the buffer, from `base`.
    pub buf_offset: libc::off_t,
    /// Bytes.
    pub size: usize,
}

/// `CUfileIOParams_t`: 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOParams {
    /// `CUfileBatchMode_t`: [`BATCH_MODE`].
    pub mode: c_int,
    /// The request.
    pub io: CUfileBatchIo,
    /// The registered file.
    pub fh: CUfileHandle,
    /// [`OPCODE_READ`] or [`OPCODE_WRITE`].
    pub opcode: c_int,
    /// Handed back in the request's event.
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`: 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOEvents {
    /// The request's cookie.
    pub cookie: *mut c_void,
    /// `CUfileStatus_t`.
    pub status: c_int,
    /// Bytes moved, or a negative error, as a `size_t`.
    pub ret: usize,
}

/// `CUFILE_BATCH`.
pub const BATCH_MODE: c_int = 1;
/// `CUFILE_READ`.
pub const OPCODE_READ: c_int = 0;
/// `CUFILE_WRITE`.
pub const OPCODE_WRITE: c_int = 1;
/// `CUFILE_WAITING`.
pub const STATUS_WAITING: c_int = 0x01;
/// `CUFILE_PENDING`.
pub const STATUS_PENDING: c_int = 0x02;
/// `CUFILE_INVALID`.
pub const STATUS_INVALID: c_int = 0x04;
/// `CUFILE_CANCELED`.
pub const STATUS_CANCELED: c_int = 0x08;
/// `CUFILE_COMPLETE`.
pub const STATUS_COMPLETE: c_int = 0x10;
/// `CUFILE_TIMEOUT`.
pub const STATUS_TIMEOUT: c_int = 0x20;
/// `CUFILE_FAILED`.
pub const STATUS_FAILED: c_int = 0x40;

/// `CUfileBatchHandle_t`.
pub type CUfileBatchHandle = *mut c_void;
/// `cuFileBatchIOSetUp`.
pub type BatchSetUpFn = unsafe extern "C" fn(batch: *mut CUfileBatchHandle, nr: u32) -> CUfileError;
/// `cuFileBatchIOSubmit`.
pub type BatchSubmitFn = unsafe extern "C" fn(
    batch: CUfileBatchHandle,
    nr: u32,
    params: *mut CUfileIOParams,
    flags: u32,
) -> CUfileError;
/// `cuFileBatchIOGetStatus`.
pub type BatchGetStatusFn = unsafe extern "C" fn(
    batch: CUfileBatchHandle,
    min_nr: u32,
    nr: *mut u32,
    events: *mut CUfileIOEvents,
    timeout: *mut libc::timespec,
) -> CUfileError;
/// `cuFileBatchIODestroy`.
pub type BatchDestroyFn = unsafe extern "C" fn(batch: CUfileBatchHandle);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_cufile_h_on_x86_64() {
        assert_eq!(size_of::<CUfileError>(), 8);
        assert_eq!(size_of::<CUfileDescr>(), 24);
        assert_eq!(offset_of!(CUfileDescr, handle), 8);
        assert_eq!(offset_of!(CUfileDescr, fs_ops), 16);
        assert_eq!(size_of::<CUfileIOParams>(), 64);
        assert_eq!(offset_of!(CUfileIOParams, io), 8);
        assert_eq!(offset_of!(CUfileIOParams, fh), 40);
        assert_eq!(offset_of!(CUfileIOParams, opcode), 48);
        assert_eq!(offset_of!(CUfileIOParams, cookie), 56);
        assert_eq!(size_of::<CUfileIOEvents>(), 24);
        assert_eq!(offset_of!(CUfileIOEvents, status), 8);
        assert_eq!(offset_of!(CUfileIOEvents, ret), 16);
    }
}
