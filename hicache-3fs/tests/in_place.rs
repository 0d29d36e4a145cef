//! Shared-memory regions move in place: the plugin publishes the region's file in the
//! mount's `3fs-virt/iovs` dir and wraps it as an iov, and the stand-in moves bytes through its
//! own mapping of that file (as 3FS's FUSE process does), so a region that is not really the
//! published file would not get its data. Other memory is copied through bounce iovs, and the
//! copy is reported with a live count.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hicache_core::raw::{DynBackend, ObjectKey, ReadItem, RegionId, Slice, WriteItem};
use hicache_core::{
    ConfigLoader, HiCache, HiCacheOptions, Layout, MemoryRegion, MmapPool, ReadOutcome, RegionPath,
    StorageIdentity,
};
use hicache_testkit::fixtures::mha;
use hicache_testkit::standins::make_usrbio_mount;

/// Injected failures are process-wide: the tests take turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes the stand-in's `call` fail with `errno` until cleared with 0.
fn fail(call: &str, errno: std::ffi::c_int) {
    // SAFETY: the stand-in's own function and C type; the library stays loaded (leaked).
    unsafe {
        let lib = libloading::Library::new(support::library()).unwrap();
        let f: unsafe extern "C" fn(*const std::ffi::c_char, std::ffi::c_int) =
            *lib.get(b"hicache_usrbio_stand_in_fail").unwrap();
        std::mem::forget(lib);
        let call = std::ffi::CString::new(call).unwrap();
        f(call.as_ptr(), errno);
    }
}

struct Mount {
    dir: tempfile::TempDir,
    backend: DynBackend,
}

impl Mount {
    fn new() -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        make_usrbio_mount(dir.path()).unwrap();
        let config = config(&dir.path().join("kv"));
        let backend = hicache_testkit::open_probed(&hicache_3fs::DESCRIPTOR, &config).unwrap();
        Mount { dir, backend }
    }

    fn links(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.dir.path().join("3fs-virt/iovs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        out.sort();
        out
    }
}

fn config(store: &Path) -> hicache_core::Config {
    std::fs::create_dir_all(store).unwrap();
    ConfigLoader::new()
        .set("storage_dir", store.display().to_string())
        .set(
            "plugin.3fs.usrbio_path",
            support::library().display().to_string(),
        )
        .set("plugin.3fs.iov_bytes", 65536)
        .load()
        .unwrap()
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn fill(region: &MemoryRegion, seed: u8) -> Vec<u8> {
    let bytes: Vec<u8> = (0..region.len())
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect();
    region
        .target(0, region.len(), "test")
        .unwrap()
        .copy_from(0, &bytes)
        .unwrap();
    bytes
}

fn contents(region: &MemoryRegion) -> Vec<u8> {
    region
        .source(0, region.len(), "test")
        .unwrap()
        .host_bytes()
        .unwrap()
        .to_vec()
}

fn write(
    backend: &DynBackend,
    key: &ObjectKey,
    id: RegionId,
    len: u64,
) -> hicache_core::Result<()> {
    let segments = [Slice::new(id, 0, len)];
    run(backend.write(&[WriteItem {
        key,
        segments: &segments,
    }]))
    .pop()
    .unwrap()
}

fn read(
    backend: &DynBackend,
    key: &ObjectKey,
    id: RegionId,
    len: u64,
) -> hicache_core::Result<ReadOutcome> {
    let segments = [Slice::new(id, 0, len)];
    run(backend.read(&[ReadItem {
        key,
        segments: &segments,
    }]))
    .pop()
    .unwrap()
}

fn copied_bytes(path: &RegionPath) -> u64 {
    match path {
        RegionPath::Copied(c) => c.bytes.get(),
        other => panic!("expected a copy, got {other}"),
    }
}

const LEN: u64 = 3 << 20;

#[test]
fn a_shared_region_moves_in_place_and_other_memory_is_copied_and_counted() {
    let _turn = serial();
    let m = Mount::new();
    let shared = MemoryRegion::shared_host(LEN).unwrap();
    let shm = shared.shared_file().unwrap().path().to_path_buf();
    let plain = MemoryRegion::from_aligned(
        hicache_core::raw::AlignedBuf::zeroed(LEN as usize, 4096).unwrap(),
    );
    let sid = m.backend.register(shared.clone()).unwrap();
    let pid = m.backend.register(plain.clone()).unwrap();

    // Published: one link, to the region's file, and the region says it moves in place.
    let links = m.links();
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(std::fs::read_link(&links[0]).unwrap(), shm);
    let path = m.backend.region_path(sid);
    assert!(matches!(path, RegionPath::InPlace { .. }), "{path}");
    assert!(path.to_string().contains("3fs-virt/iovs"), "{path}");
    let bounce = m.backend.region_path(pid);
    assert!(bounce.to_string().contains("MmapPool::shared"), "{bounce}");
    assert_eq!(copied_bytes(&bounce), 0);

    // In place: data round-trips and nothing is copied.
    let key = ObjectKey::new("in-place").unwrap();
    let wrote = fill(&shared, 1);
    write(&m.backend, &key, sid, LEN).unwrap();
    fill(&shared, 99);
    assert!(matches!(
        read(&m.backend, &key, sid, LEN).unwrap(),
        ReadOutcome::Hit
    ));
    assert!(
        contents(&shared) == wrote,
        "in-place read returned other bytes"
    );
    assert_eq!(copied_bytes(&m.backend.region_path(pid)), 0);

    // Bounced: the same object read into plain memory counts its bytes.
    assert!(matches!(
        read(&m.backend, &key, pid, LEN).unwrap(),
        ReadOutcome::Hit
    ));
    assert!(
        contents(&plain) == wrote,
        "bounced read returned other bytes"
    );
    assert_eq!(copied_bytes(&m.backend.region_path(pid)), LEN);
    let key2 = ObjectKey::new("bounced").unwrap();
    write(&m.backend, &key2, pid, LEN).unwrap();
    assert_eq!(copied_bytes(&m.backend.region_path(pid)), 2 * LEN);

    // One object from both: the part in shared memory moves in place, only the other part
    // is copied (the connector's envelope header from its staging, beside a pool page).
    let before = copied_bytes(&m.backend.region_path(pid));
    let mixed = ObjectKey::new("mixed").unwrap();
    let segments = [Slice::new(pid, 0, 4096), Slice::new(sid, 0, LEN)];
    let wrote_mixed = run(m.backend.write(&[WriteItem {
        key: &mixed,
        segments: &segments,
    }]));
    assert!(matches!(wrote_mixed[..], [Ok(())]), "{wrote_mixed:?}");
    assert_eq!(copied_bytes(&m.backend.region_path(pid)), before + 4096);
    let whole = MemoryRegion::from_aligned(
        hicache_core::raw::AlignedBuf::zeroed(LEN as usize + 4096, 4096).unwrap(),
    );
    let wid = m.backend.register(whole.clone()).unwrap();
    assert!(matches!(
        read(&m.backend, &mixed, wid, LEN + 4096).unwrap(),
        ReadOutcome::Hit
    ));
    let got = contents(&whole);
    assert!(got[..4096] == contents(&plain)[..4096] && got[4096..] == wrote[..]);
    m.backend.deregister(wid).unwrap();

    // Deregistering unpublishes; the file goes with the last clone of the region.
    m.backend.deregister(sid).unwrap();
    assert!(m.links().is_empty(), "{:?}", m.links());
    drop(shared);
    assert!(!shm.exists());
    m.backend.deregister(pid).unwrap();
}

#[test]
fn without_its_link_an_in_place_transfer_fails_instead_of_moving_other_memory() {
    let _turn = serial();
    let m = Mount::new();
    let shared = MemoryRegion::shared_host(LEN).unwrap();
    let sid = m.backend.register(shared.clone()).unwrap();
    let key = ObjectKey::new("unpublished").unwrap();
    fill(&shared, 3);
    write(&m.backend, &key, sid, LEN).unwrap();
    // The FUSE process forgets the iov when its link goes.
    for link in m.links() {
        std::fs::remove_file(link).unwrap();
    }
    let e = read(&m.backend, &key, sid, LEN).unwrap_err().to_string();
    assert!(
        e.contains("hf3fs read") && e.contains("No such file"),
        "{e}"
    );
    let e = write(&m.backend, &ObjectKey::new("other").unwrap(), sid, LEN)
        .unwrap_err()
        .to_string();
    assert!(e.contains("hf3fs write"), "{e}");
    // The object written before is whole, and the failed write published nothing.
    let exists = run(m.backend.exists(&[key, ObjectKey::new("other").unwrap()]));
    assert!(matches!(exists[..], [Ok(true), Ok(false)]), "{exists:?}");
    m.backend.deregister(sid).unwrap();
}

#[test]
fn shared_memory_that_3fs_cannot_map_is_copied_with_the_reason() {
    let m = Mount::new();
    // 3FS maps iovs from /dev/shm only: a shared file elsewhere cannot be published.
    let elsewhere = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let region = MemoryRegion::shared_host_in(elsewhere.path(), LEN).unwrap();
    let id = m.backend.register(region.clone()).unwrap();
    assert!(m.links().is_empty(), "{:?}", m.links());
    let path = m.backend.region_path(id);
    let text = path.to_string();
    assert!(path.is_copied() && text.contains("hf3fs_iovwrap"), "{text}");
    let key = ObjectKey::new("copied").unwrap();
    let wrote = fill(&region, 5);
    write(&m.backend, &key, id, LEN).unwrap();
    fill(&region, 0);
    assert!(matches!(
        read(&m.backend, &key, id, LEN).unwrap(),
        ReadOutcome::Hit
    ));
    assert!(contents(&region) == wrote);
    m.backend.deregister(id).unwrap();

    // A mount without its virtual dir: nothing to publish into.
    std::fs::remove_dir_all(m.dir.path().join("3fs-virt")).unwrap();
    let shared = MemoryRegion::shared_host(LEN).unwrap();
    let id = m.backend.register(shared).unwrap();
    let text = m.backend.region_path(id).to_string();
    assert!(text.contains("3fs-virt/iovs dir must exist"), "{text}");
    m.backend.deregister(id).unwrap();
}

#[test]
fn register_pool_reports_in_place_for_a_shared_pool_and_the_copy_for_another() {
    let _turn = serial();
    let m = Mount::new();
    let cache = HiCache::with_backend(
        m.backend.clone(),
        config(&m.dir.path().join("kv")),
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    let geometry = mha(Layout::PageFirst, 16, 8);
    let report = cache
        .register_pool(Arc::new(MmapPool::shared(geometry).unwrap()))
        .unwrap();
    let path = report
        .pool_path
        .clone()
        .expect("zero-copy mode registers the pool");
    assert!(matches!(path, RegionPath::InPlace { .. }), "{report}");
    assert!(
        report.to_string().contains("pool bytes: in place"),
        "{report}"
    );
    let report = cache
        .register_pool(Arc::new(MmapPool::new(geometry).unwrap()))
        .unwrap();
    assert!(
        report.pool_path.as_ref().is_some_and(RegionPath::is_copied),
        "{report}"
    );
    assert!(
        report.to_string().contains("USRBIO bounce iovs"),
        "{report}"
    );
    cache.close();
}

#[test]
fn the_probe_names_a_mount_without_its_virtual_dir() {
    let _turn = serial();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    make_usrbio_mount(dir.path()).unwrap();
    std::fs::remove_dir_all(dir.path().join("3fs-virt")).unwrap();
    let e = hicache_testkit::open_probed(&hicache_3fs::DESCRIPTOR, &config(&dir.path().join("kv")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("virtual dir is missing"), "{e}");
}

#[test]
fn io_abandoned_in_flight_on_a_pool_stops_the_backend_and_keeps_the_memory() {
    let _turn = serial();
    let m = Mount::new();
    let shared = MemoryRegion::shared_host(LEN).unwrap();
    let shm = shared.shared_file().unwrap().path().to_path_buf();
    let sid = m.backend.register(shared.clone()).unwrap();
    fill(&shared, 7);
    fail("hf3fs_wait_for_ios", libc::EIO);
    let e = write(&m.backend, &ObjectKey::new("lost").unwrap(), sid, LEN);
    fail("hf3fs_wait_for_ios", 0);
    let e = e.unwrap_err().to_string();
    assert!(e.contains("may still be in flight"), "{e}");
    // Nothing moves any more: the FUSE process may still write the pool.
    let e = write(&m.backend, &ObjectKey::new("after").unwrap(), sid, LEN)
        .unwrap_err()
        .to_string();
    assert!(e.contains("abandoned in flight"), "{e}");
    let e = m.backend.deregister(sid).unwrap_err().to_string();
    assert!(e.contains("kept allocated for good"), "{e}");
    // The region outlives its last handle here: still mapped, still published.
    drop(shared);
    assert!(shm.exists());
    assert_eq!(m.links().len(), 1);
    // The test's own cleanup: the file's name (the leaked mapping stays valid).
    std::fs::remove_file(&shm).unwrap();
}
