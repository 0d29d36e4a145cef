//! cuFile's C types and constants, as `cufile.h` lays them out on x86-64 Linux, written from
//! NVIDIA's cuFile API reference. The tests here check the layouts against the stand-in's C
//! declarations; the layouts and every code below were also compiled against the real
//! `cufile.h` of cuFile 1.15.1 and matched.

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

/// The name of a `CUfileOpError` code, as `cufile.h` spells it.
pub fn op_error_name(code: c_int) -> &'static str {
    match code {
        0 => "CU_FILE_SUCCESS",
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5002 => "CU_FILE_DRIVER_INVALID_PROPS",
        5003 => "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        5004 => "CU_FILE_DRIVER_VERSION_MISMATCH",
        5005 => "CU_FILE_DRIVER_VERSION_READ_ERROR",
        5006 => "CU_FILE_DRIVER_CLOSING",
        5007 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5008 => "CU_FILE_IO_NOT_SUPPORTED",
        5009 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5010 => "CU_FILE_NVFS_DRIVER_ERROR",
        5011 => "CU_FILE_CUDA_DRIVER_ERROR",
        5012 => "CU_FILE_CUDA_POINTER_INVALID",
        5013 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5014 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5015 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5016 => "CU_FILE_INVALID_MAPPING_SIZE",
        5017 => "CU_FILE_INVALID_MAPPING_RANGE",
        5018 => "CU_FILE_INVALID_FILE_TYPE",
        5019 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5020 => "CU_FILE_DIO_NOT_SET",
        5022 => "CU_FILE_INVALID_VALUE",
        5023 => "CU_FILE_MEMORY_ALREADY_REGISTERED",
        5024 => "CU_FILE_MEMORY_NOT_REGISTERED",
        5025 => "CU_FILE_PERMISSION_DENIED",
        5026 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5028 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5029 => "CU_FILE_DEVICE_NOT_FOUND",
        5030 => "CU_FILE_INTERNAL_ERROR",
        5031 => "CU_FILE_GETNEWFD_FAILED",
        5033 => "CU_FILE_NVFS_SETUP_ERROR",
        5034 => "CU_FILE_IO_DISABLED",
        _ => "an unknown cuFile error",
    }
}

/// What to do about a `CUfileOpError`, where something specific helps.
pub fn op_error_hint(code: c_int) -> Option<&'static str> {
    Some(match code {
        5001 => "the cuFile driver is not open: cuFileDriverOpen must succeed first",
        5004 | 5005 => "the nvidia-fs module and libcufile do not match: install matching versions",
        5007 | 5009 => {
            "this platform or GPU has no GPUDirect Storage; set allow_compat_mode in /etc/cufile.json, or use the POSIX plugin"
        }
        5010 | 5033 => {
            "the nvidia-fs kernel module failed: check `lsmod | grep nvidia_fs` and dmesg, or allow compat mode"
        }
        5011 => "a CUDA call inside cuFile failed (cu_err): check the GPU with nvidia-smi",
        5012..=5014 => {
            "the buffer is not CUDA memory cuFile accepts: register device memory from cudaMalloc"
        }
        5015 => "the buffer belongs to another CUDA context than the calling thread's",
        5018 => "the file descriptor type is wrong (CUfileDescr_t layout or handle type)",
        5019 | 5020 => "open the file with O_DIRECT",
        5023 => "the buffer is already registered",
        5024 => "register the buffer with cuFileBufRegister first",
        5025 => "permission denied: check the storage dir's permissions and /etc/cufile.json",
        5027 => {
            "cuFile could not register the file: on a VM or container without udev data it cannot read the block device's properties (log: \"udev property not found\"); write /run/udev/data/b<major>:<minor> with E:ID_FS_USAGE=filesystem and E:ID_FS_TYPE=<fs> for the storage dir's disk, or use the POSIX plugin"
        }
        5034 => "GPUDirect Storage is disabled for this file by /etc/cufile.json",
        _ => return None,
    })
}

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

    #[test]
    fn every_named_code_has_its_name_and_the_udev_trap_its_hint() {
        assert_eq!(
            op_error_name(HANDLE_NOT_REGISTERED),
            "CU_FILE_HANDLE_NOT_REGISTERED"
        );
        assert_eq!(op_error_name(4242), "an unknown cuFile error");
        assert!(op_error_hint(5027).unwrap().contains("/run/udev/data"));
        assert!(op_error_hint(4242).is_none());
    }
}
