//! "Device" memory through the CUDA runtime and cuFile FFI paths together, against the
//! testkit's stand-ins (host memory underneath): a buffer from cudaMalloc, filled with
//! cudaMemcpy, registered with cuFile, written to a file and read back into another.
//! Real GPU memory is exercised by the `cufile_round_trip` example on a CUDA machine.

use std::ffi::c_int;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use hicache_gds::GdsError;
use hicache_gds::cuda::CudaRuntime;
use hicache_gds::cufile::CuFile;

/// Both stand-ins, built once; the device count is process-wide, so tests take turns.
fn stand_ins() -> (
    MutexGuard<'static, (tempfile::TempDir, PathBuf, PathBuf)>,
    PathBuf,
    PathBuf,
) {
    static ONCE: std::sync::OnceLock<Mutex<(tempfile::TempDir, PathBuf, PathBuf)>> =
        std::sync::OnceLock::new();
    let cell = ONCE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let cufile = hicache_testkit::standins::cufile(dir.path()).unwrap();
        let cudart = hicache_testkit::standins::cudart(dir.path()).unwrap();
        Mutex::new((dir, cufile, cudart))
    });
    let guard = cell.lock().unwrap_or_else(|e| e.into_inner());
    let (cufile, cudart) = (guard.1.clone(), guard.2.clone());
    (guard, cufile, cudart)
}

fn set_devices(cudart: &std::path::Path, n: c_int) {
    // SAFETY: the stand-in's own function; the library stays loaded (leaked handle).
    unsafe {
        let lib = libloading::Library::new(cudart).unwrap();
        let f = *lib
            .get::<unsafe extern "C" fn(c_int)>(b"hicache_cudart_stand_in_devices")
            .unwrap();
        std::mem::forget(lib);
        f(n);
    }
}

#[test]
fn device_buffers_go_to_a_file_and_back() {
    let (_turn, cufile_path, cudart_path) = stand_ins();
    let cuda = CudaRuntime::load(Some(&cudart_path)).unwrap();
    assert_eq!(cuda.device_count().unwrap(), 1);
    cuda.set_device(0).unwrap();
    let cufile = CuFile::load(Some(&cufile_path)).unwrap();
    cufile.open_driver().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("page"))
        .unwrap();
    let handle = cufile.register_file(file.as_fd()).unwrap();
    let page: Vec<u8> = (0..256 << 10).map(|i| (i * 7 % 251) as u8).collect();
    let mut src = cuda.alloc(page.len()).unwrap();
    let dst = cuda.alloc(page.len()).unwrap();
    src.copy_from_host(0, &page).unwrap();
    // SAFETY: device buffers, alive and unshared until deregistered below.
    unsafe {
        cufile.register_buffer(src.as_ptr(), src.len()).unwrap();
        cufile.register_buffer(dst.as_ptr(), dst.len()).unwrap();
        assert_eq!(
            cufile
                .write(&handle, src.as_ptr(), page.len(), 0, 0)
                .unwrap(),
            page.len()
        );
        assert_eq!(
            cufile
                .read(&handle, dst.as_ptr(), page.len(), 0, 0)
                .unwrap(),
            page.len()
        );
        cufile.deregister_buffer(src.as_ptr()).unwrap();
        cufile.deregister_buffer(dst.as_ptr()).unwrap();
    }
    let mut back = vec![0u8; page.len()];
    dst.copy_to_host(0, &mut back).unwrap();
    assert!(back == page, "read back other bytes");
    // Copies outside the buffer are refused before the runtime sees them.
    let e = dst.copy_to_host(page.len() - 1, &mut [0u8; 2]).unwrap_err();
    assert!(e.to_string().contains("cudaErrorInvalidValue"), "{e}");
    let e = src.copy_from_host(usize::MAX, &[1]).unwrap_err();
    assert!(matches!(e, GdsError::Cuda { code: 1, .. }), "{e:?}");
    drop(handle);
    cufile.close_driver().unwrap();
}

#[test]
fn no_gpu_and_no_runtime_are_named() {
    let (_turn, _, cudart_path) = stand_ins();
    let cuda = CudaRuntime::load(Some(&cudart_path)).unwrap();
    set_devices(&cudart_path, 0);
    let count = cuda.device_count();
    let alloc = cuda.alloc(16).map(|_| ());
    let set = cuda.set_device(0);
    set_devices(&cudart_path, 1);
    for e in [count.map(|_| ()), alloc, set] {
        let e = e.unwrap_err();
        assert!(
            e.to_string().contains("cudaErrorNoDevice")
                || e.to_string().contains("cudaErrorInvalidDevice"),
            "{e}"
        );
    }
    let e = cuda.set_device(u32::MAX).unwrap_err();
    assert!(e.to_string().contains("cudaErrorInvalidDevice"), "{e}");
    let missing = tempfile::tempdir().unwrap().path().join("libcudart.so");
    let e = CudaRuntime::load(Some(&missing)).unwrap_err();
    assert!(
        matches!(
            e,
            GdsError::NotFound {
                library: "the CUDA runtime",
                ..
            }
        ) && e.to_string().contains("cudart_path"),
        "{e}"
    );
}
