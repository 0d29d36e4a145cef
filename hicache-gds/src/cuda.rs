//! The CUDA runtime loaded at run time, never linked, for what the GDS plugins need of it:
//! how many GPUs there are, device memory (tests, benchmarks and the probe's round trip
//! allocate it; engines bring their own), and copies between device and host memory.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hicache_core::raw::{SourceSlice, TargetSlice};
use hicache_core::{MemKind, MemoryRegion};

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
type HostRegisterFn = unsafe extern "C" fn(*mut c_void, usize, u32) -> c_int;
type HostUnregisterFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// A loaded CUDA runtime.
pub struct CudaRuntime {
    path: PathBuf,
    device_count: CountFn,
    set_device: SetDeviceFn,
    malloc: MallocFn,
    free: FreeFn,
    memcpy: MemcpyFn,
    error_name: ErrorNameFn,
    /// `cudaHostRegister` / `cudaHostUnregister`, when the library has them.
    host_register: Option<(HostRegisterFn, HostUnregisterFn)>,
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
            "install the CUDA runtime (libcudart.so), or give the path of the library to load",
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
                host_register: function(&library, &path, "cudaHostRegister")
                    .and_then(|r| Ok((r, function(&library, &path, "cudaHostUnregister")?)))
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

    /// Page-locks `len` bytes of host memory at `ptr` (`cudaHostRegister`), so copies to
    /// and from the GPU run at full speed; a runtime without the function is
    /// [`GdsError::MissingSymbol`].
    ///
    /// # Safety
    /// `ptr..ptr + len` must be host memory that stays allocated until
    /// [`host_unregister`](Self::host_unregister).
    pub unsafe fn host_register(&self, ptr: *mut u8, len: usize) -> Result<(), GdsError> {
        let (register, _) = self.host_register.ok_or_else(|| GdsError::MissingSymbol {
            path: self.path.clone(),
            symbol: "cudaHostRegister",
        })?;
        // SAFETY: the caller's contract; flags 0 is cudaHostRegisterDefault.
        self.check("cudaHostRegister", unsafe { register(ptr.cast(), len, 0) })
    }

    /// `cudaHostUnregister` of memory [`host_register`](Self::host_register) page-locked.
    ///
    /// # Safety
    /// `ptr` was registered, and no copy on it is in flight.
    pub unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<(), GdsError> {
        let (_, unregister) = self.host_register.ok_or_else(|| GdsError::MissingSymbol {
            path: self.path.clone(),
            symbol: "cudaHostUnregister",
        })?;
        // SAFETY: the caller's contract.
        self.check("cudaHostUnregister", unsafe { unregister(ptr.cast()) })
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

/// Alignment of [`device_region`]s: O_DIRECT's block, which `cudaMalloc` does not promise
/// for every size.
pub const DEVICE_REGION_ALIGN: usize = 4096;

/// `len` zeroed bytes of memory on GPU `device`, starting at a multiple of
/// [`DEVICE_REGION_ALIGN`], as a region to register with a backend (its kind is
/// [`MemKind::Device`]); freed with `cudaFree` when the region's last clone is dropped. Move
/// bytes in and out with [`copy_to_device`] and [`copy_from_device`].
pub fn device_region(
    cuda: &Arc<CudaRuntime>,
    device: u32,
    len: usize,
) -> Result<MemoryRegion, GdsError> {
    cuda.set_device(device)?;
    let room = len
        .checked_add(DEVICE_REGION_ALIGN - 1)
        .ok_or_else(|| GdsError::Cuda {
            call: "cudaMalloc",
            code: 2,
            name: format!("cudaErrorMemoryAllocation: {len} bytes"),
        })?;
    let mut base: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    cuda.check("cudaMalloc", unsafe { (cuda.malloc)(&mut base, room) })?;
    let owner = DeviceAlloc {
        cuda: cuda.clone(),
        ptr: base,
    };
    let skip = (base as usize).next_multiple_of(DEVICE_REGION_ALIGN) - base as usize;
    // A device address is never dereferenced here: `wrapping_add` computes it.
    let start = base.cast::<u8>().wrapping_add(skip);
    let zeros = vec![0u8; len];
    // SAFETY: `start..start + len` lies in the `room` bytes cudaMalloc just returned
    // (`skip` < DEVICE_REGION_ALIGN), reached by nothing else.
    cuda.check("cudaMemcpy", unsafe {
        (cuda.memcpy)(start.cast(), zeros.as_ptr().cast(), len, HOST_TO_DEVICE)
    })?;
    // SAFETY: the allocation lives as long as `owner`, which the region keeps; nothing else
    // knows the pointer, so the region is the only way to its bytes.
    Ok(unsafe {
        MemoryRegion::with_owner(
            start,
            len as u64,
            MemKind::Device { device },
            Arc::new(owner),
        )
    })
}

/// An allocation of [`device_region`], freed when the region lets go of it.
struct DeviceAlloc {
    cuda: Arc<CudaRuntime>,
    ptr: *mut c_void,
}

// SAFETY: the pointer is a device address that is never dereferenced on the host; the CUDA
// runtime's functions may be called from any thread.
unsafe impl Send for DeviceAlloc {}
// SAFETY: as above; the struct holds no interior state.
unsafe impl Sync for DeviceAlloc {}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: memory cudaMalloc returned, freed once, after the last region clone.
        let _ = unsafe { (self.cuda.free)(self.ptr) };
    }
}

/// Why a copy between `host` bytes and a pinned range of `kind` and `range` bytes cannot
/// run, if it cannot: the range must be device memory exactly as long as the host side.
fn copy_refused(kind: MemKind, range: usize, host: usize) -> Result<(), GdsError> {
    let why = if !matches!(kind, MemKind::Device { .. }) {
        format!("the range is {kind} memory, not device memory")
    } else if range != host {
        format!("{host} bytes for a {range}-byte range")
    } else {
        return Ok(());
    };
    Err(GdsError::Cuda {
        call: "cudaMemcpy",
        code: 1,
        name: format!("cudaErrorInvalidValue: {why}"),
    })
}

/// Copies `src` into a pinned range of device memory (`cudaMemcpy`, host to device); `src`
/// must be as long as the range.
pub fn copy_to_device(
    cuda: &CudaRuntime,
    target: &mut TargetSlice,
    src: &[u8],
) -> Result<(), GdsError> {
    copy_refused(target.kind(), target.len(), src.len())?;
    // SAFETY: the pin gives this call the only access to the range, which is device memory
    // of `target.len()` bytes (its region's contract); `src` is readable host memory.
    cuda.check("cudaMemcpy", unsafe {
        (cuda.memcpy)(
            target.as_ptr().cast_mut().cast(),
            src.as_ptr().cast(),
            src.len(),
            HOST_TO_DEVICE,
        )
    })
}

/// Copies a pinned range of device memory into `dst` (`cudaMemcpy`, device to host); `dst`
/// must be as long as the range.
pub fn copy_from_device(
    cuda: &CudaRuntime,
    source: &SourceSlice,
    dst: &mut [u8],
) -> Result<(), GdsError> {
    copy_refused(source.kind(), source.len(), dst.len())?;
    // SAFETY: the pin excludes writers of the range, which is device memory of
    // `source.len()` bytes (its region's contract); `dst` is writable host memory.
    cuda.check("cudaMemcpy", unsafe {
        (cuda.memcpy)(
            dst.as_mut_ptr().cast(),
            source.as_ptr().cast(),
            dst.len(),
            DEVICE_TO_HOST,
        )
    })
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
