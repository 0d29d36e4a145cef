//! What can go wrong with cuFile and the CUDA runtime, each with its name and, where one
//! helps, a hint.

use std::ffi::c_int;
use std::path::PathBuf;

/// `CU_FILE_CUDA_DRIVER_ERROR`: `cu_err` holds the CUDA error.
const CUDA_DRIVER_ERROR: c_int = 5011;

/// A failure of cuFile or of the CUDA runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GdsError {
    /// No candidate library could be loaded.
    #[error("cannot load {library}: {}; {fix}", tried.iter().map(|(p, why)| format!("{} ({why})", p.display())).collect::<Vec<_>>().join(", "))]
    NotFound {
        /// Which library.
        library: &'static str,
        /// Each path or name tried, with why it failed.
        tried: Vec<(PathBuf, String)>,
        /// What to do.
        fix: &'static str,
    },
    /// The library lacks a function hicache needs.
    #[error("{path}: no symbol {symbol}; it is not the library expected, or one too old", path = path.display())]
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The function.
        symbol: &'static str,
    },
    /// A CUDA runtime call returned an error.
    #[error("{call} failed: {name} ({code})")]
    Cuda {
        /// The function.
        call: &'static str,
        /// The `cudaError_t`.
        code: i32,
        /// Its name, as the runtime gives it.
        name: String,
    },
    /// A cuFile call returned an error.
    #[error("{call} failed: {name} ({code}){cuda}{hint}", name = op_error_name(*code), cuda = if *code == CUDA_DRIVER_ERROR { format!(", CUDA error {cu_err}") } else { String::new() }, hint = op_error_hint(*code).map(|h| format!("; {h}")).unwrap_or_default())]
    Call {
        /// The function.
        call: &'static str,
        /// The `CUfileOpError`.
        code: i32,
        /// The `CUresult`, for `CU_FILE_CUDA_DRIVER_ERROR` (5011).
        cu_err: i32,
    },
    /// A batch request ended without completing.
    #[error("a batch request ended {status} (ret {ret})")]
    BatchStatus {
        /// `CUfileStatus_t`'s name.
        status: &'static str,
        /// The request's `ret`.
        ret: isize,
    },
    /// Waiting for a batch failed with requests still pending: their memory may still be
    /// used by cuFile and must never be reused.
    #[error("{pending} batch requests may still be in flight: {source}")]
    Abandoned {
        /// Requests not known to have ended.
        pending: usize,
        /// Why waiting failed.
        #[source]
        source: Box<GdsError>,
    },
    /// A read or write failed with an OS error.
    #[error("{call} failed: {source}")]
    Os {
        /// The function.
        call: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl GdsError {
    /// The `CUfileOpError` of a failed call.
    pub fn code(&self) -> Option<i32> {
        match self {
            GdsError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// As hicache reports it, under `plugin`'s name.
    pub fn into_error(self, plugin: &'static str) -> hicache_core::Error {
        match self {
            GdsError::Os { call, source } => hicache_core::Error::io(plugin, call, None, source),
            other => hicache_core::Error::backend_with_source(plugin, other.to_string(), other),
        }
    }
}

/// The name of a `CUfileOpError` code, as `cufile.h` spells it.
fn op_error_name(code: c_int) -> &'static str {
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
fn op_error_hint(code: c_int) -> Option<&'static str> {
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

    #[test]
    fn every_named_code_has_its_name_and_the_udev_trap_its_hint() {
        assert_eq!(op_error_name(5027), "CU_FILE_HANDLE_NOT_REGISTERED");
        assert_eq!(op_error_name(4242), "an unknown cuFile error");
        assert!(op_error_hint(5027).unwrap().contains("/run/udev/data"));
        assert!(op_error_hint(4242).is_none());
    }
}
