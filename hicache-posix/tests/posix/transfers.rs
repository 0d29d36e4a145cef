//! Pages moved on each filesystem and engine: with and without O_DIRECT, alignment, the
//! buffered fallback, fixed buffers, ten thousand pages in one call.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{
    ENGINES, backend, backend_with, connector, connector_with, fill, geometry, keys, mha, page,
    parents, walk,
};
use hicache_core::raw::{AlignedBuf, ObjectKey, ReadItem, Slice, StorageBackend, WriteItem};
use hicache_core::{
    AttentionKind, ConfigLoader, Error, HiCache, HiCacheOptions, HostSlots, Layout, MemoryRegion,
    MmapPool, ReadOutcome, StorageIdentity, TransferMode,
};
use hicache_posix::EngineChoice;

#[tokio::test]
async fn round_trips_on_each_filesystem_with_and_without_direct_io() {
    for (label, parent) in parents() {
        for (direct, engine) in [true, false]
            .into_iter()
            .flat_map(|d| ENGINES.map(|e| (d, e)))
        {
            for (layout, tokens, attention) in [
                (Layout::PageFirst, 16, mha()),
                (Layout::LayerFirst, 16, mha()),
                (Layout::PageFirstDirect, 3, mha()),
                (
                    Layout::PageFirst,
                    16,
                    AttentionKind::Mla { kv_cache_dim: 64 },
                ),
            ] {
                let dir = tempfile::tempdir_in(&parent).unwrap();
                let cache = connector_with(
                    &[dir.path().join("a"), dir.path().join("b")],
                    direct,
                    "m",
                    engine,
                );
                let pool = Arc::new(MmapPool::new(geometry(layout, tokens, attention)).unwrap());
                let report = cache.register_pool(pool.clone()).unwrap();
                let ctx = format!(
                    "{label} direct={direct} {layout} tokens={tokens} {:?} mode={}",
                    attention, report.mode
                );
                let ks = keys("r", 6);
                let data: Vec<Vec<u8>> = (0..6).map(|p| fill(&pool, p, p as u8 + 1)).collect();
                let set = cache
                    .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3, 4, 5]))
                    .await
                    .unwrap();
                assert!(set.iter().all(|r| r.is_ok()), "{ctx}: {set:?}");
                assert_eq!(cache.batch_exists(&ks).await.unwrap(), 6, "{ctx}");
                let got = cache
                    .batch_get(&ks, HostSlots::Pages(&[8, 9, 10, 11, 12, 13]))
                    .await
                    .unwrap();
                assert!(
                    got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
                    "{ctx}: {got:?}"
                );
                for (i, d) in data.iter().enumerate() {
                    assert_eq!(&page(&pool, 8 + i as u64), d, "{ctx}: page {i}");
                }
                // Every bucket dir exists under both roots (besides the hidden spare dir).
                for root in ["a", "b"] {
                    let buckets = std::fs::read_dir(dir.path().join(root))
                        .unwrap()
                        .filter(|e| {
                            !e.as_ref()
                                .unwrap()
                                .file_name()
                                .to_string_lossy()
                                .starts_with('.')
                        })
                        .count();
                    assert_eq!(buckets, 256, "{ctx}");
                }
            }
        }
    }
}

#[tokio::test]
async fn direct_io_reports_the_real_alignment_and_zero_copy() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path(), true);
    let info = b.info();
    assert!(info.capability.direct_io);
    let fs = &b.roots()[0].fs;
    assert_eq!(info.capability.io_alignment, fs.io_alignment());
    let cache = connector(&[dir.path().to_path_buf()], true, "m");
    let pool = Arc::new(MmapPool::new(geometry(Layout::PageFirst, 16, mha())).unwrap());
    let report = cache.register_pool(pool).unwrap();
    assert_eq!(report.mode, TransferMode::ZeroCopy, "{}", report.reason);
}

#[tokio::test]
async fn unaligned_slices_are_rejected_before_any_io() {
    for engine in ENGINES {
        unaligned_slices_rejected(engine).await;
    }
}

async fn unaligned_slices_rejected(engine: EngineChoice) {
    let dir = tempfile::tempdir().unwrap();
    let b = backend_with(dir.path(), true, engine);
    let align = b.info().capability.io_alignment;
    assert!(align >= 512);
    let buf = AlignedBuf::zeroed(64 * 1024, 4096).unwrap();
    let region = b.register(MemoryRegion::from_aligned(buf)).unwrap();
    let key = ObjectKey::new("unaligned").unwrap();
    for bad in [
        Slice::new(region, 1, 4096),
        Slice::new(region, 0, 100),
        Slice::new(region, 0, 64 * 1024 + 4096),
    ] {
        let segs = [bad];
        let r = b
            .write(&[WriteItem {
                key: &key,
                segments: &segs,
            }])
            .await;
        assert!(
            matches!(
                r[0],
                Err(Error::Misaligned { .. }) | Err(Error::SliceOutOfRange { .. })
            ),
            "{:?}",
            r[0]
        );
        let r = b
            .read(&[ReadItem {
                key: &key,
                segments: &segs,
            }])
            .await;
        assert!(r[0].is_err());
    }
    let unknown = [Slice::new(hicache_core::raw::RegionId(999), 0, 4096)];
    let r = b
        .write(&[WriteItem {
            key: &key,
            segments: &unknown,
        }])
        .await;
    assert!(matches!(r[0], Err(Error::UnregisteredRegion { .. })));
    assert!(!b.object_path(&key).exists());
    // Nothing reached the disk: no file anywhere under the root but the spare dir's lock.
    let files: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| !(p.ends_with("lock") && p.to_string_lossy().contains("/.hicache-spare/")))
        .collect();
    assert!(files.is_empty(), "{files:?}");
    // A good item next to a bad one still succeeds.
    let good = [Slice::new(region, 0, 4096)];
    let bad = [Slice::new(region, 1, 4096)];
    let k2 = ObjectKey::new("good").unwrap();
    let r = b
        .write(&[
            WriteItem {
                key: &key,
                segments: &bad,
            },
            WriteItem {
                key: &k2,
                segments: &good,
            },
        ])
        .await;
    assert!(r[0].is_err() && r[1].is_ok());
    assert_eq!(std::fs::metadata(b.object_path(&k2)).unwrap().len(), 4096);
}

#[tokio::test]
async fn a_filesystem_without_o_direct_falls_back_to_buffered_io() {
    let ramfs = hicache_testkit::fixtures::TestMount::new("ramfs", "")
        .unwrap_or_else(|e| panic!("mount -t ramfs failed ({e}); this test needs root"));
    let b = backend(ramfs.path(), true);
    let root = &b.roots()[0];
    assert_eq!(root.fs.fs_type, "ramfs");
    assert!(!root.direct);
    let why = root.direct_fallback.as_deref().unwrap();
    assert!(
        why.contains("O_DIRECT refused") && why.contains("ramfs"),
        "{why}"
    );
    assert!(
        !b.info().capability.direct_io,
        "the capability says direct I/O is off"
    );
    drop(b);
    let cache = connector(&[ramfs.path().to_path_buf()], true, "m");
    let pool = Arc::new(MmapPool::new(geometry(Layout::PageFirst, 16, mha())).unwrap());
    cache.register_pool(pool.clone()).unwrap();
    let ks = keys("ramfs", 2);
    let data: Vec<Vec<u8>> = (0..2).map(|p| fill(&pool, p, 50 + p as u8)).collect();
    assert!(
        cache
            .batch_set(&ks, HostSlots::Pages(&[0, 1]))
            .await
            .unwrap()
            .iter()
            .all(|r| r.is_ok())
    );
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[4, 5]))
        .await
        .unwrap();
    assert!(got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))));
    assert_eq!(page(&pool, 4), data[0]);
    let probe = hicache_posix::probe_dir(ramfs.path(), true).unwrap();
    assert_eq!(probe.direct_io, Some(false));
}

#[tokio::test]
async fn io_uring_moves_single_segment_objects_on_fixed_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(backend_with(dir.path(), true, EngineChoice::Uring));
    let config = ConfigLoader::new().load().unwrap();
    let cache = HiCache::with_backend(
        backend.clone(),
        config,
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    // Spans of 2880 bytes fit no alignment: bounce mode, one staging slot per object.
    let g = hicache_testkit::fixtures::unaligned_mha(Layout::PageFirst, 8);
    let pool = Arc::new(MmapPool::new(g).unwrap());
    assert_eq!(
        cache.register_pool(pool.clone()).unwrap().mode,
        TransferMode::Bounce
    );
    let ks = keys("fixed", 3);
    let data: Vec<Vec<u8>> = (0..3).map(|p| fill(&pool, p, 9 + p as u8)).collect();
    assert!(
        cache
            .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
            .await
            .unwrap()
            .iter()
            .all(|r| r.is_ok())
    );
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[4, 5, 6]))
        .await
        .unwrap();
    assert!(got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))));
    for (i, d) in data.iter().enumerate() {
        assert_eq!(&page(&pool, 4 + i as u64), d);
    }
    assert_eq!(
        backend.fixed_buffer_transfers(),
        6,
        "3 writes and 3 reads on fixed buffers"
    );
    // Deregistering (closing the pool) releases the buffers; later transfers still work.
    cache.close();
    cache.register_pool(pool.clone()).unwrap();
    let got = cache.batch_get(&ks, HostSlots::Pages(&[7])).await;
    assert!(got.is_err(), "three keys need three pages");
    let got = cache
        .batch_get(&ks[..1], HostSlots::Pages(&[7]))
        .await
        .unwrap();
    assert!(matches!(got[0], Ok(ReadOutcome::Hit)));
}

/// One call of 10,000 pages, on both engines: every page stored, counted and read back.
#[tokio::test]
async fn ten_thousand_pages_in_one_call() {
    const PAGES: u64 = 10_000;
    let parent = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    for engine in [EngineChoice::Threads, EngineChoice::Uring] {
        let dir = tempfile::tempdir_in(&parent).unwrap();
        let cache = connector_with(&[dir.path().to_path_buf()], false, "m", engine);
        // 2 KiB pages (one token): 20 MiB written, 20 MiB read back.
        let g = geometry(Layout::PageFirst, 1, mha())
            .with_pages(2 * PAGES)
            .unwrap();
        let pool = Arc::new(MmapPool::new(g).unwrap());
        cache.register_pool(pool.clone()).unwrap();
        let data: Vec<Vec<u8>> = (0..PAGES).map(|p| fill(&pool, p, p as u8)).collect();
        let ks = keys("tenk", PAGES as usize);
        let src: Vec<u64> = (0..PAGES).collect();
        let dst: Vec<u64> = (PAGES..2 * PAGES).collect();
        let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await.unwrap();
        assert_eq!(set.len(), PAGES as usize);
        assert!(set.iter().all(|r| r.is_ok()), "{engine:?}");
        assert_eq!(cache.batch_exists(&ks).await.unwrap(), PAGES as usize);
        let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await.unwrap();
        assert!(
            got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
            "{engine:?}"
        );
        for (i, p) in dst.iter().enumerate() {
            assert!(page(&pool, *p) == data[i], "{engine:?} page {i}");
        }
    }
}

/// SGLang naming on tmpfs with and without direct I/O asked for. tmpfs takes O_DIRECT only
/// since Linux 6.6; SGLang keeps its 4096-byte rule either way (where O_DIRECT fails it falls
/// back to buffered I/O and still aligns), so hicache must too, or the same page would be a
/// `_k`/`_v` pair on one side and a flat page on the other, and a 1-byte marker where SGLang
/// reads 4096. The connector test `sglang_naming_keeps_its_rule_on_file_stores_without_o_direct`
/// covers a store that has no O_DIRECT on any kernel.
#[tokio::test]
async fn sglang_naming_keeps_sglangs_direct_io_rule_where_o_direct_is_missing() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm (tmpfs) on this machine");
        return;
    }
    for direct in [true, false] {
        let dir = tempfile::tempdir_in(shm).unwrap();
        let config = ConfigLoader::new()
            .set("storage_dir", dir.path().display().to_string())
            .set("use_direct_io", direct)
            .set("plugin", "posix")
            .set("naming", "sglang")
            .set("page_format", "raw")
            .load()
            .unwrap();
        let registry =
            hicache_core::PluginRegistry::from_descriptors([&hicache_posix::DESCRIPTOR]).unwrap();
        let open = || {
            HiCache::open(
                &registry,
                config.clone(),
                HiCacheOptions::new(StorageIdentity::single("org/m")),
            )
            .unwrap()
        };
        // 3 tokens: a 3072-byte page stride, not a multiple of 4096; 4 tokens: 4096.
        for (tokens, zero_copy) in [(3, !direct), (4, true)] {
            let cache = open();
            let pool = Arc::new(MmapPool::new(geometry(Layout::PageFirst, tokens, mha())).unwrap());
            let report = cache.register_pool(pool.clone()).unwrap();
            let want = if zero_copy {
                TransferMode::ZeroCopy
            } else {
                TransferMode::Bounce
            };
            assert_eq!(
                report.mode, want,
                "direct {direct} tokens {tokens}: {report:?}"
            );
            if !zero_copy {
                assert!(
                    report.reason.contains("SGLang's direct-I/O rule"),
                    "{report:?}"
                );
            }
            let ks = keys(&format!("t{tokens}-"), 2);
            let data = fill(&pool, 0, tokens as u8);
            fill(&pool, 1, 7);
            let set = cache
                .batch_set(&ks, HostSlots::Pages(&[0, 1]))
                .await
                .unwrap();
            assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
            let names = cache.object_names(&ks[0]).unwrap();
            assert_eq!(names.len(), if zero_copy { 2 } else { 1 }, "{names:?}");
            let got = cache
                .batch_get(&ks, HostSlots::Pages(&[5, 6]))
                .await
                .unwrap();
            assert!(
                got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
                "{got:?}"
            );
            assert_eq!(page(&pool, 5), data);
        }
        // The anchor marker: SGLang reads 4096 bytes when it aligns, 1 otherwise.
        let cache = open();
        let anchor = hicache_core::AnchorPool::new(geometry(Layout::PageFirst, 4, mha())).unwrap();
        cache.register_pool(Arc::new(anchor)).unwrap();
        let ks = keys("anchor-", 1);
        let set = cache.batch_set(&ks, HostSlots::Pages(&[0])).await.unwrap();
        assert!(set[0].is_ok(), "{set:?}");
        let marker = walk(dir.path())
            .into_iter()
            .find(|p| p.to_string_lossy().contains("anchor-"))
            .unwrap();
        let len = std::fs::metadata(&marker).unwrap().len();
        assert_eq!(len, if direct { 4096 } else { 1 }, "direct {direct}");
    }
}
