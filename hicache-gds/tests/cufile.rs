//! The cuFile layer through the real FFI path, against the testkit's stand-in library
//! (POSIX I/O with host memory): loading, layouts, handle and buffer registration, reads
//! and writes, and every error mapped with its name and hint. What only NVIDIA's cuFile
//! with GPU memory shows is run on a CUDA machine, not here.

mod support;

use std::ffi::{c_int, c_void};
use std::os::fd::AsFd;

use hicache_gds::GdsError;
use hicache_gds::cufile::{CuFile, Op, Request, sys};
use support::{fail, scratch_file, serial, stand_in_fn};

fn stand_in() -> &'static std::path::Path {
    support::cufile()
}

#[test]
fn the_stand_in_declares_the_layout_hicache_uses() {
    let layout: unsafe extern "C" fn(c_int) -> usize =
        stand_in_fn(stand_in(), "hicache_cufile_stand_in_layout");
    // SAFETY: a pure function of its argument.
    let c = |what| unsafe { layout(what) };
    assert_eq!(c(0), size_of::<sys::CUfileDescr>());
    assert_eq!(c(1), std::mem::offset_of!(sys::CUfileDescr, handle));
    assert_eq!(c(2), std::mem::offset_of!(sys::CUfileDescr, fs_ops));
    assert_eq!(c(3), size_of::<sys::CUfileError>());
    assert_eq!(c(4), size_of::<sys::CUfileIOParams>());
    assert_eq!(c(5), std::mem::offset_of!(sys::CUfileIOParams, fh));
    assert_eq!(c(6), std::mem::offset_of!(sys::CUfileIOParams, cookie));
    assert_eq!(c(7), size_of::<sys::CUfileIOEvents>());
    assert_eq!(c(8), std::mem::offset_of!(sys::CUfileIOEvents, ret));
}

#[test]
fn a_batch_writes_and_reads_pages_and_reports_each_request() {
    let _turn = serial();
    let cufile = CuFile::load(Some(stand_in())).unwrap();
    cufile.open_driver().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = scratch_file(dir.path(), "pages");
    let handle = cufile.register_file(file.as_fd()).unwrap();
    const PAGE: usize = 16 << 10;
    let mut out: Vec<u8> = (0..4 * PAGE).map(|i| (i % 253) as u8).collect();
    let mut back = vec![0u8; 4 * PAGE];
    let batch = cufile.batch(4).unwrap();
    let requests = |op, base: *mut u8| -> Vec<Request<'_>> {
        // Page i of the buffer at page 3 - i of the file.
        (0..4u64)
            .map(|i| Request {
                file: &handle,
                op,
                base: base.cast(),
                size: PAGE,
                file_offset: (3 - i) * PAGE as u64,
                buf_offset: i * PAGE as u64,
            })
            .collect()
    };
    // SAFETY: both buffers live and are used by nothing else during the runs.
    unsafe {
        let written = batch.run(&requests(Op::Write, out.as_mut_ptr())).unwrap();
        assert!(written.iter().all(|r| matches!(r, Ok(PAGE))), "{written:?}");
        let read = batch.run(&requests(Op::Read, back.as_mut_ptr())).unwrap();
        assert!(read.iter().all(|r| matches!(r, Ok(PAGE))), "{read:?}");
    }
    assert!(back == out, "read back other bytes");
    let file_bytes = std::fs::read(dir.path().join("pages")).unwrap();
    assert_eq!(file_bytes[..PAGE], out[3 * PAGE..]);
    // More requests than the context holds: the whole batch is refused.
    let five: Vec<Request<'_>> = (0..5)
        .map(|_| requests(Op::Read, back.as_mut_ptr())[0])
        .collect();
    // SAFETY: as above.
    let e = unsafe { batch.run(&five) }.unwrap_err();
    assert_eq!(e.code(), Some(5022), "{e}");
    // One failing request fails alone, with its own error.
    fail("cuFileRead", 5030);
    // SAFETY: as above.
    let read = unsafe { batch.run(&requests(Op::Read, back.as_mut_ptr())[..1]) };
    fail("cuFileRead", 0);
    let read = read.unwrap();
    assert!(
        matches!(&read[0], Err(e) if e.code() == Some(5030) && e.to_string().contains("CU_FILE_INTERNAL_ERROR")),
        "{read:?}"
    );
    // Waiting that fails with requests in flight is reported as such.
    fail("cuFileBatchIOGetStatus", 5030);
    // SAFETY: as above; after Abandoned the buffer is kept until the end of the test.
    let e = unsafe { batch.run(&requests(Op::Read, back.as_mut_ptr())) };
    fail("cuFileBatchIOGetStatus", 0);
    let e = e.unwrap_err();
    assert!(
        matches!(e, GdsError::Abandoned { pending: 4, .. }) && e.to_string().contains("in flight"),
        "{e}"
    );
    drop(batch);
    drop(handle);
    cufile.close_driver().unwrap();
}

#[test]
fn a_page_goes_to_a_file_and_back_through_registered_buffers() {
    let _turn = serial();
    let cufile = CuFile::load(Some(stand_in())).unwrap();
    assert!(cufile.is_stand_in());
    cufile.open_driver().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = scratch_file(dir.path(), "page");
    let handle = cufile.register_file(file.as_fd()).unwrap();
    let out: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; 64 << 10];
    // SAFETY: both buffers live, unshared, until deregistered below.
    unsafe {
        cufile
            .register_buffer(out.as_ptr().cast(), out.len())
            .unwrap();
        cufile
            .register_buffer(back.as_ptr().cast(), back.len())
            .unwrap();
        let again = cufile
            .register_buffer(out.as_ptr().cast(), out.len())
            .unwrap_err();
        assert_eq!(again.code(), Some(5023), "{again}");
        let n = cufile.write(&handle, out.as_ptr().cast(), out.len(), 0, 0);
        assert_eq!(n.unwrap(), out.len());
        let n = cufile.read(&handle, back.as_mut_ptr().cast(), back.len(), 0, 0);
        assert_eq!(n.unwrap(), back.len());
    }
    assert!(back == out, "read back other bytes");
    // SAFETY: as above.
    unsafe {
        // Buffer offsets: 100 bytes from offset 4096 of the buffer at file offset 0, read
        // back into offset 8192; and past the end of the file, fewer bytes, no error.
        let n = cufile.write(&handle, out.as_ptr().cast(), 100, 0, 4096);
        assert_eq!(n.unwrap(), 100);
        let n = cufile.read(&handle, back.as_mut_ptr().cast(), 100, 0, 8192);
        assert_eq!(n.unwrap(), 100);
        let n = cufile.read(&handle, back.as_mut_ptr().cast(), 4096, (64 << 10) - 10, 0);
        assert_eq!(n.unwrap(), 10);
        cufile.deregister_buffer(out.as_ptr().cast()).unwrap();
        cufile.deregister_buffer(back.as_ptr().cast()).unwrap();
        let twice = cufile.deregister_buffer(back.as_ptr().cast()).unwrap_err();
        assert_eq!(twice.code(), Some(5024), "{twice}");
    }
    assert_eq!(back[8192..8292], out[4096..4196]);
    assert_eq!(back[..10], out[(64 << 10) - 10..]);
    drop(handle);
    cufile.close_driver().unwrap();
}

#[test]
fn each_failure_is_named_with_its_hint() {
    let _turn = serial();
    let cufile = CuFile::load(Some(stand_in())).unwrap();
    cufile.open_driver().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("f")).unwrap();
    // The udev trap of VMs without udev data.
    fail("cuFileHandleRegister", sys::HANDLE_NOT_REGISTERED);
    let e = cufile.register_file(file.as_fd()).unwrap_err();
    fail("cuFileHandleRegister", 0);
    let text = e.to_string();
    assert!(
        text.contains("CU_FILE_HANDLE_NOT_REGISTERED (5027)") && text.contains("/run/udev/data"),
        "{text}"
    );
    let as_hicache = e.into_error("GDS").to_string();
    assert!(
        as_hicache.contains("GDS") && as_hicache.contains("5027"),
        "{as_hicache}"
    );
    // A CUDA error says so.
    fail("cuFileBufRegister", sys::CUDA_DRIVER_ERROR);
    let mut buf = [0u8; 512];
    // SAFETY: a live buffer; the call fails before using it.
    let e = unsafe { cufile.register_buffer(buf.as_mut_ptr().cast::<c_void>(), 512) };
    fail("cuFileBufRegister", 0);
    let e = e.unwrap_err();
    assert!(e.to_string().contains("CU_FILE_CUDA_DRIVER_ERROR"), "{e}");
    // A negative return of a transfer is a cuFile error; -1 is the OS error in errno.
    let handle = cufile.register_file(file.as_fd()).unwrap();
    fail("cuFileRead", 4242);
    // SAFETY: a live buffer of 512 bytes.
    let e = unsafe { cufile.read(&handle, buf.as_mut_ptr().cast(), 512, 0, 0) };
    fail("cuFileRead", 0);
    let e = e.unwrap_err();
    assert!(
        matches!(e, GdsError::Call { code: 4242, .. }) && e.to_string().contains("unknown"),
        "{e}"
    );
    // SAFETY: as above; the file was opened write-only, so the read is EBADF.
    let e = unsafe { cufile.read(&handle, buf.as_mut_ptr().cast(), 512, 0, 0) }.unwrap_err();
    assert!(
        matches!(&e, GdsError::Os { source, .. } if source.raw_os_error() == Some(libc::EBADF)),
        "{e:?}"
    );
    // An offset past off_t's range is refused before the call.
    // SAFETY: as above.
    let e = unsafe { cufile.write(&handle, buf.as_ptr().cast(), 512, u64::MAX, 0) }.unwrap_err();
    assert!(e.to_string().contains("cuFileWrite"), "{e}");
    drop(handle);
    cufile.close_driver().unwrap();
}

#[test]
fn a_missing_or_wrong_library_is_a_typed_error_naming_what_was_tried() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libcufile.so.0");
    let e = CuFile::load(Some(&missing)).unwrap_err();
    assert!(matches!(e, GdsError::NotFound { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&missing.display().to_string()) && text.contains("cufile_path"),
        "{text}"
    );
    // A shared library that is not cuFile.
    let other = dir.path().join("libother.so");
    let source = [("other.c", "int other(void) { return 1; }\n")];
    hicache_testkit::cc::shared_library(&source, &[], &other).unwrap();
    let e = CuFile::load(Some(&other)).unwrap_err();
    assert!(
        matches!(
            e,
            GdsError::MissingSymbol {
                symbol: "cuFileDriverOpen",
                ..
            }
        ),
        "{e:?}"
    );
    // A file that is no library at all.
    let junk = dir.path().join("junk.so");
    std::fs::write(&junk, b"not an ELF file").unwrap();
    assert!(matches!(
        CuFile::load(Some(&junk)),
        Err(GdsError::NotFound { .. })
    ));
}
