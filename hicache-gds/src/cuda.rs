//! The CUDA runtime loaded at run time, never linked, for what the GDS plugins need of it:
//! how many GPUs there are, device memory (tests, benchmarks and the probe's round trip
//! allocate it; engines bring their own), and copies between device and host memory.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use crate::dynlib::{function, open_first};
use crate::error::GdsError;

/// Where the CUDA runtime is looked for when no path is given.
pub const SEARCH: [&str; 4] = [
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "/usr/local/cuda/lib64/libcudart.so",
];

/// `cudaMemcpyHostToDevice`.
const HOST_TO_DEVICE: c_int = 1;
/// `cudaMemcpyDeviceToHost`.
const DEVICE_TO_HOST: c_int = 2;

type CountFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type SetDeviceFn = unsafe extern "C" fn(c_int) -> c_int;
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type ErrorNameFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded CUDA runtime.
pub struct CudaRuntime {
    path: PathBuf,
    device_count: CountFn,
    set_device: SetDeviceFn,
    malloc: MallocFn,
    free: FreeFn,
    memcpy: MemcpyFn,
    error_name: ErrorNameFn,
    // Last: the functions above point into it.
    _library: libloading::Library,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl CudaRuntime {
    /// Loads the runtime from `path`, or from [`SEARCH`] when `None`.
    pub fn load(path: Option<&Path>) -> Result<Self, GdsError> {
        let (path, library) = open_first(
            path,
            &SEARCH,
            "the CUDA runtime",
            "install the CUDA runtime (libcudart.so), or name the library with `cudart_path`",
        )?;
        // SAFETY: each type is the function's C signature (cuda_runtime_api.h); the
        // pointers live in `CudaRuntime` beside the library that owns them.
        unsafe {
            Ok(CudaRuntime {
                device_count: function(&library, &path, "cudaGetDeviceCount")?,
                set_device: function(&library, &path, "cudaSetDevice")?,
                malloc: function(&library, &path, "cudaMalloc")?,
                free: function(&library, &path, "cudaFree")?,
                memcpy: function(&library, &path, "cudaMemcpy")?,
                error_name: function(&library, &path, "cudaGetErrorName")?,
                path,
                _library: library,
            })
        }
    }

    /// The library's path as it was loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), GdsError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorName takes any code and returns a static string, or NULL.
        let name = unsafe { (self.error_name)(code) };
        let name = if name.is_null() {
            "an unknown CUDA error".to_string()
        } else {
            // SAFETY: a NUL-terminated static string of the runtime.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        Err(GdsError::Cuda { call, code, name })
    }

    /// GPUs visible to this process (`cudaGetDeviceCount`); no GPU or no driver is the
    /// runtime's error (`cudaErrorNoDevice`, `cudaErrorInsufficientDriver`).
    pub fn device_count(&self) -> Result<usize, GdsError> {
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        self.check("cudaGetDeviceCount", unsafe { (self.device_count)(&mut n) })?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Makes `device` current for the calling thread (`cudaSetDevice`).
    pub fn set_device(&self, device: u32) -> Result<(), GdsError> {
        let device = c_int::try_from(device).map_err(|_| GdsError::Cuda {
            call: "cudaSetDevice",
            code: 101,
            name: "cudaErrorInvalidDevice".into(),
        })?;
        // SAFETY: any device number is accepted or refused by the runtime.
        self.check("cudaSetDevice", unsafe { (self.set_device)(device) })
    }

    /// `len` bytes of device memory on the current device, freed on drop.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer<'_>, GdsError> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        self.check("cudaMalloc", unsafe { (self.malloc)(&mut ptr, len) })?;
        Ok(DeviceBuffer {
            cuda: self,
            ptr,
            len,
        })
    }
}

/// Device memory from `cudaMalloc`; freed on drop.
pub struct DeviceBuffer<'a> {
    cuda: &'a CudaRuntime,
    ptr: *mut c_void,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceBuffer<'_> {
    /// The device address.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, call: &'static str, offset: usize, len: usize) -> Result<usize, GdsError> {
        offset
            .checked_add(len)
            .filter(|&end| end <= self.len)
            .map(|_| offset)
            .ok_or(GdsError::Cuda {
                call,
                code: 1,
                name: format!(
                    "cudaErrorInvalidValue: {len} bytes at {offset} of a {}-byte buffer",
                    self.len
                ),
            })
    }

    /// Copies `src` to `offset` of the buffer (`cudaMemcpy`, host to device).
    pub fn copy_from_host(&mut self, offset: usize, src: &[u8]) -> Result<(), GdsError> {
        let at = self.range("cudaMemcpy", offset, src.len())?;
        // SAFETY: the range is inside the allocation; `src` is readable host memory.
        let code = unsafe {
            (self.cuda.memcpy)(
                self.ptr.cast::<u8>().add(at).cast(),
                src.as_ptr().cast(),
                src.len(),
                HOST_TO_DEVICE,
            )
        };
        self.cuda.check("cudaMemcpy", code)
    }

    /// Copies from `offset` of the buffer into `dst` (`cudaMemcpy`, device to host).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), GdsError> {
        let at = self.range("cudaMemcpy", offset, dst.len())?;
        // SAFETY: the range is inside the allocation; `dst` is writable host memory.
        let code = unsafe {
            (self.cuda.memcpy)(
                dst.as_mut_ptr().cast(),
                self.ptr.cast::<u8>().add(at).cast(),
                dst.len(),
                DEVICE_TO_HOST,
            )
        };
        self.cuda.check("cudaMemcpy", code)
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: memory cudaMalloc returned, freed once.
        let _ = unsafe { (self.cuda.free)(self.ptr) };
    }
}
