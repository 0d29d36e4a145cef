//! "Device" memory through the CUDA runtime and cuFile FFI paths together, against the
//! testkit's stand-ins (host memory underneath): a buffer from cudaMalloc, filled with
//! cudaMemcpy, registered with cuFile, written to a file and read back into another.
//! Real GPU memory is exercised by the `cufile_round_trip` example on a CUDA machine.

mod support;

use std::ffi::c_int;
use std::os::fd::AsFd;

use hicache_gds::GdsError;
use hicache_gds::cuda::CudaRuntime;
use hicache_gds::cufile::CuFile;

fn set_devices(n: c_int) {
    let f: unsafe extern "C" fn(c_int) =
        support::stand_in_fn(support::cudart(), "hicache_cudart_stand_in_devices");
    // SAFETY: a device count.
    unsafe { f(n) };
}

#[test]
fn device_buffers_go_to_a_file_and_back() {
    let _turn = support::serial();
    let cuda = CudaRuntime::load(Some(support::cudart())).unwrap();
    assert_eq!(cuda.device_count().unwrap(), 1);
    cuda.set_device(0).unwrap();
    let cufile = CuFile::load(Some(support::cufile())).unwrap();
    cufile.open_driver().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = support::scratch_file(dir.path(), "page");
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
    let _turn = support::serial();
    let cuda = CudaRuntime::load(Some(support::cudart())).unwrap();
    set_devices(0);
    let count = cuda.device_count();
    let alloc = cuda.alloc(16).map(|_| ());
    let set = cuda.set_device(0);
    set_devices(1);
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
        ) && e.to_string().contains("give the path of the library"),
        "{e}"
    );
}
