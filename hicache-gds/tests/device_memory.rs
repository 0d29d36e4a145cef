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

/// Device regions: 4096-aligned, zeroed, and copied only as device memory of the exact
/// length; a host range or a length that differs is the runtime's invalid-value error.
#[test]
fn device_regions_are_aligned_zeroed_and_copied_only_as_they_are() {
    use hicache_gds::cuda::{DEVICE_REGION_ALIGN, copy_from_device, copy_to_device, device_region};
    let _turn = support::serial();
    let cuda = std::sync::Arc::new(CudaRuntime::load(Some(support::cudart())).unwrap());
    let r = device_region(&cuda, 0, 3 * 4096).unwrap();
    assert_eq!(r.addr() % DEVICE_REGION_ALIGN, 0);
    assert!(matches!(
        r.kind(),
        hicache_core::MemKind::Device { device: 0 }
    ));
    let mut out = vec![1u8; 3 * 4096];
    copy_from_device(&cuda, &r.source(0, 3 * 4096, "t").unwrap(), &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0));
    let mut t = r.target(4096, 4096, "t").unwrap();
    copy_to_device(&cuda, &mut t, &[7; 4096]).unwrap();
    let e = copy_to_device(&cuda, &mut t, &[7; 100]).unwrap_err();
    assert!(
        e.to_string().contains("100 bytes for a 4096-byte range"),
        "{e}"
    );
    drop(t);
    let mut short = vec![0u8; 10];
    let e = copy_from_device(&cuda, &r.source(0, 4096, "t").unwrap(), &mut short).unwrap_err();
    assert!(e.to_string().contains("cudaErrorInvalidValue"), "{e}");
    let host = hicache_core::MemoryRegion::from_aligned(
        hicache_core::raw::AlignedBuf::zeroed(4096, 4096).unwrap(),
    );
    let e = copy_to_device(&cuda, &mut host.target(0, 4096, "t").unwrap(), &[0; 4096]).unwrap_err();
    assert!(
        e.to_string().contains("host memory, not device memory"),
        "{e}"
    );
    let e = device_region(&cuda, 0, usize::MAX).unwrap_err();
    assert!(e.to_string().contains("cudaErrorMemoryAllocation"), "{e}");
    set_devices(0);
    let e = device_region(&cuda, 0, 4096).unwrap_err();
    set_devices(1);
    let text = e.to_string();
    assert!(
        text.contains("cudaErrorNoDevice") || text.contains("cudaErrorInvalidDevice"),
        "{text}"
    );
}
