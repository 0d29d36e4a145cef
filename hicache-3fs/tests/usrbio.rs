//! USRBIO through the real FFI path against the testkit's stand-in library (built with the
//! system's C compiler; a "mount" is a dir made by `make_usrbio_mount`): loading, mounts,
//! the inverted `reg_fd` convention, rings that complete fewer I/Os than asked, a full ring,
//! I/O outside the iov, wrapped iovs over published shared memory, injected failures and
//! latency, and the probe.

mod support;

use std::ffi::{CString, c_char, c_int};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use hicache_3fs::UsrbioError;
use hicache_3fs::probe::probe;
use hicache_3fs::usrbio::{Io, Usrbio};
use hicache_testkit::standins::{USRBIO_MOUNT_MARKER, make_usrbio_mount};

/// Injected failures are process-wide: tests that inject them, and tests that do I/O,
/// take turns.
fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the stand-in's `call` fail with `errno` until cleared with 0.
fn fail(call: &str, errno: c_int) {
    // SAFETY: the stand-in's own function and C type; the library stays loaded (leaked).
    unsafe {
        let lib = libloading::Library::new(support::library()).unwrap();
        let f: unsafe extern "C" fn(*const c_char, c_int) =
            *lib.get(b"hicache_usrbio_stand_in_fail").unwrap();
        std::mem::forget(lib);
        let call = CString::new(call).unwrap();
        f(call.as_ptr(), errno);
    }
}

/// A "mount" with a storage dir under it.
fn mount() -> (tempfile::TempDir, PathBuf) {
    let m = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    make_usrbio_mount(m.path()).unwrap();
    let dir = m.path().join("kv");
    std::fs::create_dir(&dir).unwrap();
    (m, dir)
}

fn file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join(name))
        .unwrap()
}

#[test]
fn a_missing_library_lists_what_was_tried() {
    let gone = Path::new("/nonexistent/libhf3fs_api_shared.so");
    let e = Usrbio::load(Some(gone)).unwrap_err();
    assert!(matches!(e, UsrbioError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent") && e.to_string().contains("usrbio_path"));
}

#[test]
fn mounts_are_found_under_the_marker_and_nowhere_else() {
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    assert!(u.is_stand_in());
    let (m, dir) = mount();
    let real = std::fs::canonicalize(m.path()).unwrap();
    assert_eq!(u.mount_point(&dir).unwrap(), real);
    assert_eq!(u.mount_point(&dir.join("not-yet")).unwrap(), real);
    let plain = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let e = u.mount_point(plain.path()).unwrap_err();
    assert!(matches!(e, UsrbioError::NotOn3fs { .. }), "{e:?}");
    assert!(e.to_string().contains("not on a 3FS mount"), "{e}");
    // A mount path longer than the first buffer: asked again with the length it needs.
    let mut deep = m.path().to_path_buf();
    for i in 0..30 {
        deep.push(format!("deep-dir-{i:02}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join(USRBIO_MOUNT_MARKER), b"").unwrap();
    let found = u.mount_point(&deep).unwrap();
    assert!(found.as_os_str().len() > 256, "{}", found.display());
    assert_eq!(found, std::fs::canonicalize(&deep).unwrap());
    // A path C cannot carry.
    let nul = PathBuf::from("/tmp/a\0b");
    assert!(matches!(
        u.mount_point(&nul),
        Err(UsrbioError::BadPath { .. })
    ));
    let f = file(&dir, "on");
    assert!(u.is_hf3fs(f.as_fd()));
    let off = file(plain.path(), "off");
    assert!(!u.is_hf3fs(off.as_fd()));
}

#[test]
fn reg_fd_success_is_zero_and_failure_a_positive_errno() {
    let _turn = serial();
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    let (_m, dir) = mount();
    let f = file(&dir, "reg");
    let reg = u.register_fd(f.as_fd()).unwrap();
    // The same number again, still registered: EINVAL, with the reuse hint.
    let e = u.register_fd(f.as_fd()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    assert!(e.to_string().contains("deregistered first"), "{e}");
    drop(reg);
    // Deregistered on drop: the number registers again.
    drop(u.register_fd(f.as_fd()).unwrap());
    fail("hf3fs_reg_fd", libc::EPERM);
    let e = u.register_fd(f.as_fd()).unwrap_err();
    fail("hf3fs_reg_fd", 0);
    assert_eq!(e.errno(), Some(libc::EPERM));
}

#[test]
fn rings_move_every_io_even_when_completions_come_a_few_at_a_time() {
    let _turn = serial();
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    let (m, dir) = mount();
    let mount = u.mount_point(m.path()).unwrap();
    // 10 I/Os through rings of 4 slots: three rounds, each reaped in several waits.
    let mut iov = u.create_iov(&mount, 10 * 4096).unwrap();
    assert_eq!(iov.len(), 10 * 4096);
    let mut w = u.create_ring(&mount, 4, false).unwrap();
    let mut r = u.create_ring(&mount, 4, true).unwrap();
    assert_eq!((w.entries(), w.for_read(), r.for_read()), (4, false, true));
    let f = file(&dir, "pages");
    let fd = u.register_fd(f.as_fd()).unwrap();
    let data: Vec<u8> = (0..10 * 4096).map(|i| (i * 7 % 256) as u8).collect();
    iov.bytes_mut().copy_from_slice(&data);
    let ios: Vec<Io<'_>> = (0..10)
        .map(|i| Io {
            file: &fd,
            iov_offset: i * 4096,
            len: 4096,
            file_offset: (9 - i as u64) * 4096,
        })
        .collect();
    let wrote = w.run(&mut iov, &ios).unwrap();
    assert!(wrote.iter().all(|r| matches!(r, Ok(4096))), "{wrote:?}");
    iov.bytes_mut().fill(0);
    let read = r.run(&mut iov, &ios).unwrap();
    assert!(read.iter().all(|r| matches!(r, Ok(4096))), "{read:?}");
    assert_eq!(iov.bytes(), data.as_slice());
    // Past the end of the file: a short read, not an error and not a full one.
    let past = [Io {
        file: &fd,
        iov_offset: 0,
        len: 8192,
        file_offset: 9 * 4096,
    }];
    assert!(matches!(r.run(&mut iov, &past).unwrap()[..], [Ok(4096)]));
}

#[test]
fn io_outside_the_iov_is_refused_before_the_library_and_the_others_still_run() {
    let _turn = serial();
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    let (m, dir) = mount();
    let mount = u.mount_point(m.path()).unwrap();
    let mut iov = u.create_iov(&mount, 8192).unwrap();
    let mut w = u.create_ring(&mount, 8, false).unwrap();
    let f = file(&dir, "bounds");
    let fd = u.register_fd(f.as_fd()).unwrap();
    let io = |iov_offset, len| Io {
        file: &fd,
        iov_offset,
        len,
        file_offset: 0,
    };
    let results = w
        .run(&mut iov, &[io(4096, 8192), io(usize::MAX, 2), io(0, 4096)])
        .unwrap();
    assert!(
        matches!(&results[0], Err(UsrbioError::Refused(t)) if t.contains("outside the 8192-byte iov"))
    );
    assert!(matches!(results[1], Err(UsrbioError::Refused(_))));
    assert!(matches!(results[2], Ok(4096)));
}

#[test]
fn failures_are_per_io_and_a_failed_wait_abandons_the_iov() {
    let _turn = serial();
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    let (m, dir) = mount();
    let mount = u.mount_point(m.path()).unwrap();
    let f = file(&dir, "faults");
    let fd = u.register_fd(f.as_fd()).unwrap();
    let ios = [Io {
        file: &fd,
        iov_offset: 0,
        len: 4096,
        file_offset: 0,
    }; 3];
    let mut iov = u.create_iov(&mount, 4096).unwrap();
    let mut w = u.create_ring(&mount, 2, false).unwrap();
    fail("io", libc::EIO);
    let results = w.run(&mut iov, &ios);
    fail("io", 0);
    for r in results.unwrap() {
        assert_eq!(r.unwrap_err().errno(), Some(libc::EIO));
    }
    fail("hf3fs_prep_io", libc::EAGAIN);
    let results = w.run(&mut iov, &ios);
    fail("hf3fs_prep_io", 0);
    for r in results.unwrap() {
        let e = r.unwrap_err();
        assert_eq!(e.errno(), Some(libc::EAGAIN));
        assert!(e.to_string().contains("ring is full"), "{e}");
    }
    fail("hf3fs_wait_for_ios", libc::EINTR);
    let e = w.run(&mut iov, &ios).unwrap_err();
    fail("hf3fs_wait_for_ios", 0);
    assert!(
        matches!(e, UsrbioError::Abandoned { pending: 2, .. }),
        "{e:?}"
    );
    // The abandoned iov and ring are never destroyed: dropping them is safe.
    drop(w);
    drop(iov);
    // Creating on something that is not the mount is the library's ENOENT with its hint.
    let e = u.create_iov(&dir, 4096).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT));
    assert!(e.to_string().contains("not a 3FS mount"), "{e}");
    fail("hf3fs_iorcreate4", libc::ENOMEM);
    let e = u.create_ring(&mount, 4, true).unwrap_err();
    fail("hf3fs_iorcreate4", 0);
    assert!(e.to_string().contains("shared memory"), "{e}");
}

#[test]
fn the_probe_round_trips_on_a_mount_and_names_a_dir_that_is_not_one() {
    let _turn = serial();
    let (m, dir) = mount();
    let found = probe(std::slice::from_ref(&dir), Some(support::library())).unwrap();
    assert!(found.stand_in);
    assert_eq!(found.loaded_from, support::library());
    assert_eq!(found.dirs[0].1, std::fs::canonicalize(m.path()).unwrap());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the probe leaves nothing"
    );
    let plain = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let e = probe(
        &[dir.clone(), plain.path().to_path_buf()],
        Some(support::library()),
    )
    .unwrap_err();
    assert_eq!(e.dir.as_deref(), Some(plain.path()));
    assert!(e.to_string().contains("not on a 3FS mount"), "{e}");
    fail("io", libc::EIO);
    let e = probe(std::slice::from_ref(&dir), Some(support::library())).unwrap_err();
    fail("io", 0);
    assert_eq!(e.dir.as_deref(), Some(dir.as_path()));
    assert_eq!(e.source.errno(), Some(libc::EIO));
    let e = probe(&[dir], Some(Path::new("/nonexistent/lib.so"))).unwrap_err();
    assert!(e.dir.is_none() && matches!(e.source, UsrbioError::NotFound { .. }));
}

#[test]
fn a_wrapped_iov_moves_bytes_through_the_published_file_not_the_callers_pointer() {
    let _turn = serial();
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    let (m, dir) = mount();
    let mount = u.mount_point(m.path()).unwrap();
    let f = file(&dir, "pages");
    let data: Vec<u8> = (0..8192).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(dir.join("pages"), &data).unwrap();
    let fd = u.register_fd(f.as_fd()).unwrap();
    let mut ring = u.create_ring(&mount, 4, true).unwrap();
    let io = [Io {
        file: &fd,
        iov_offset: 0,
        len: 8192,
        file_offset: 0,
    }];

    // Published as 3FS asks, over the file's own mapping: the read lands in the region.
    let shared = hicache_core::MemoryRegion::shared_host(8192).unwrap();
    let shm = shared.shared_file().unwrap().path().to_path_buf();
    // SAFETY: the region is exactly its file's shared mapping and outlives the iov.
    let wrapped = unsafe { u.wrap_iov(&mount, &shm, shared.addr() as *mut u8, 8192) }.unwrap();
    assert_eq!(std::fs::read_link(wrapped.link()).unwrap(), shm);
    // The pool's bytes are the region's, reached through its pins, never through the iov.
    assert!(wrapped.iov().bytes().is_empty() && wrapped.iov().len() == 8192);
    // SAFETY: nothing else touches the region during the call.
    let got = unsafe { ring.run_in_place(&[(wrapped.iov(), io[0])]) }.unwrap();
    assert!(matches!(got[..], [Ok(8192)]), "{got:?}");
    let seen = shared.source(0, 8192, "test").unwrap();
    assert!(seen.host_bytes().unwrap() == data.as_slice());
    drop(seen);
    let link = wrapped.link().to_path_buf();
    drop(wrapped);
    assert!(!link.exists(), "dropping the iov unpublishes it");

    // Memory that is *not* the published file gets nothing: the FUSE side (the stand-in)
    // writes its own mapping of the file, as 3FS's does, so wrapping the wrong pointer
    // cannot pass the tests by accident.
    let other = hicache_core::MemoryRegion::shared_host(8192).unwrap();
    // SAFETY: deliberately the wrong pointer for `shm`, but a live mapping of 8192 bytes
    // that nothing else touches; the stand-in never writes through it.
    let wrong = unsafe { u.wrap_iov(&mount, &shm, other.addr() as *mut u8, 8192) }.unwrap();
    // SAFETY: as above.
    let got = unsafe { ring.run_in_place(&[(wrong.iov(), io[0])]) }.unwrap();
    assert!(matches!(got[..], [Ok(8192)]), "{got:?}");
    let untouched = other.source(0, 8192, "test").unwrap();
    assert!(untouched.host_bytes().unwrap().iter().all(|b| *b == 0));
    drop(untouched);

    // A target outside /dev/shm, or a file too small: refused at wrap, as 3FS refuses the
    // link, and no link is left behind.
    let elsewhere = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let outside = hicache_core::MemoryRegion::shared_host_in(elsewhere.path(), 8192).unwrap();
    let path = outside.shared_file().unwrap().path().to_path_buf();
    // SAFETY: the region is its file's mapping and outlives the attempt.
    let e = unsafe { u.wrap_iov(&mount, &path, outside.addr() as *mut u8, 8192) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    // SAFETY: as above; the length is what is wrong.
    let e = unsafe { u.wrap_iov(&mount, &shm, shared.addr() as *mut u8, 1 << 20) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    let virt = m.path().join("3fs-virt/iovs");
    assert_eq!(
        std::fs::read_dir(&virt).unwrap().count(),
        1,
        "only `wrong`'s link"
    );
    drop(wrong);
    assert_eq!(std::fs::read_dir(&virt).unwrap().count(), 0);

    // No virtual dir: publishing fails with the path and the fix.
    std::fs::remove_dir_all(m.path().join("3fs-virt")).unwrap();
    // SAFETY: as for the first wrap.
    let e = unsafe { u.wrap_iov(&mount, &shm, shared.addr() as *mut u8, 8192) }.unwrap_err();
    assert!(matches!(e, UsrbioError::Publish { .. }), "{e:?}");
    assert!(
        e.to_string().contains("3fs-virt/iovs dir must exist"),
        "{e}"
    );
}

/// Makes every stand-in I/O take at least `micros` (0 clears).
fn delay(micros: i64) {
    // SAFETY: the stand-in's own function and C type; the library stays loaded (leaked).
    unsafe {
        let lib = libloading::Library::new(support::library()).unwrap();
        let f: unsafe extern "C" fn(std::ffi::c_long) =
            *lib.get(b"hicache_usrbio_stand_in_delay").unwrap();
        std::mem::forget(lib);
        f(micros as std::ffi::c_long);
    }
}

#[test]
fn injected_latency_holds_every_io_back() {
    let _turn = serial();
    let u = std::sync::Arc::new(Usrbio::load(Some(support::library())).unwrap());
    let (m, dir) = mount();
    let mount = u.mount_point(m.path()).unwrap();
    let mut iov = u.create_iov(&mount, 4 * 4096).unwrap();
    let mut ring = u.create_ring(&mount, 4, false).unwrap();
    let f = file(&dir, "slow");
    let fd = u.register_fd(f.as_fd()).unwrap();
    let ios: Vec<Io<'_>> = (0..4)
        .map(|i| Io {
            file: &fd,
            iov_offset: i * 4096,
            len: 4096,
            file_offset: i as u64 * 4096,
        })
        .collect();
    delay(10_000);
    let started = std::time::Instant::now();
    let done = ring.run(&mut iov, &ios);
    let took = started.elapsed();
    delay(0);
    assert!(done.unwrap().iter().all(|r| matches!(r, Ok(4096))));
    // A lower bound only: 4 I/Os of at least 10 ms each.
    assert!(took >= std::time::Duration::from_millis(40), "{took:?}");
}
