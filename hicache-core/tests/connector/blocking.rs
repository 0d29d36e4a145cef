//! The blocking API, threads on overlapping keys, and a connector opened from a registry.

use std::sync::Arc;

use crate::{connector, fill, keys, mha, page_bytes};
use hicache_core::{
    BlockingHiCache, ConfigLoader, Error, HiCache, HiCacheOptions, HostPool, HostSlots, Layout,
    MemoryBackend, MmapPool, NamingScheme, ReadOutcome, StorageIdentity,
};

#[test]
fn concurrent_threads_on_overlapping_keys_stay_correct() {
    for page_tokens in [3u64, 16] {
        let backend = Arc::new(MemoryBackend::with_alignment(4096));
        let config = ConfigLoader::new().load().unwrap();
        let options = HiCacheOptions::new(StorageIdentity::single("m")).with_max_slots_per_chunk(4);
        let cache = Arc::new(
            BlockingHiCache::new(HiCache::with_backend(backend, config, options).unwrap()).unwrap(),
        );
        let geometry = mha(Layout::PageFirst, page_tokens).with_pages(64).unwrap();
        let pool = Arc::new(MmapPool::new(geometry).unwrap());
        cache.register_pool(pool.clone()).unwrap();
        let ks = keys("t", 8);
        // Every key's page content depends only on the key, so concurrent writers of the same
        // key write identical bytes and any hit must equal them.
        let expected: Vec<Vec<u8>> = (0..8).map(|i| fill(&pool, i, 100 + i as u8)).collect();
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let cache = cache.clone();
                let ks = ks.clone();
                let pool = pool.clone();
                let expected = expected.clone();
                std::thread::spawn(move || {
                    for round in 0..60u64 {
                        let i = ((round * 3 + t) % 8) as usize;
                        match t {
                            0 => {
                                let r = cache
                                    .batch_set(&ks[i..i + 1], HostSlots::Pages(&[i as u64]))
                                    .unwrap();
                                assert!(r[0].is_ok());
                            }
                            1 => {
                                let target = 16 + (round % 16);
                                let r = cache
                                    .batch_get(&ks[i..i + 1], HostSlots::Pages(&[target]))
                                    .unwrap();
                                if matches!(r[0], Ok(ReadOutcome::Hit)) {
                                    assert_eq!(page_bytes(&pool, target), expected[i]);
                                }
                            }
                            _ => {
                                let n = cache.batch_exists(&ks).unwrap();
                                assert!(n <= 8);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

/// The blocking face does what the async one does, and unregistering ends I/O.
#[test]
fn the_blocking_api_sets_finds_removes_and_unregisters() {
    let cache = BlockingHiCache::new(connector(
        Arc::new(MemoryBackend::new()),
        &[],
        StorageIdentity::single("m"),
    ))
    .unwrap();
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    cache.register_pool(pool.clone()).unwrap();
    let ks = keys("blocking", 3);
    let data: Vec<Vec<u8>> = (0..3).map(|p| fill(&pool, p, 9)).collect();
    let set = cache.batch_set(&ks, HostSlots::Pages(&[0, 1, 2])).unwrap();
    assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
    assert_eq!(cache.batch_exists(&ks).unwrap(), 3);
    assert_eq!(cache.batch_exists(&ks[1..2]).unwrap(), 1);
    let got = cache.batch_get(&ks, HostSlots::Pages(&[5, 6, 7])).unwrap();
    assert!(got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))));
    for (i, d) in data.iter().enumerate() {
        assert_eq!(&page_bytes(&pool, 5 + i as u64), d);
    }
    let removed = cache.batch_remove(&ks[..2]).unwrap();
    assert_eq!(removed.len(), 2);
    assert!(removed.iter().all(|r| r.is_ok()));
    assert_eq!(cache.batch_exists(&ks[2..]).unwrap(), 1);
    assert_eq!(cache.batch_exists(&ks).unwrap(), 0);
    assert!(cache.exists(&ks[2]).unwrap() && !cache.exists(&ks[0]).unwrap());
    assert!(cache.stats().pages_written >= 3, "{:?}", cache.stats());
    assert!(cache.pool_report().is_some());
    cache.unregister_pool().unwrap();
    assert!(cache.pool_report().is_none());
    assert!(matches!(
        cache.batch_exists(&ks),
        Err(Error::PoolNotRegistered)
    ));
    cache.register_pool(pool).unwrap();
    cache.close();
    assert!(matches!(
        cache.exists(&ks[2]),
        Err(Error::PoolNotRegistered)
    ));
}

/// Inside an async runtime the blocking face refuses to block (a typed error, not tokio's
/// panic), and dropping it there does not panic either.
#[tokio::test]
async fn the_blocking_api_inside_a_runtime_is_an_error_not_a_panic() {
    let cache = BlockingHiCache::new(connector(
        Arc::new(MemoryBackend::new()),
        &[],
        StorageIdentity::single("m"),
    ))
    .unwrap();
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    cache.register_pool(pool).unwrap();
    let ks = keys("inside", 1);
    match cache.batch_exists(&ks) {
        Err(Error::BlockingInAsync { operation }) => assert_eq!(operation, "batch_exists"),
        other => panic!("{other:?}"),
    }
    let e = cache.batch_set(&ks, HostSlots::Pages(&[0])).unwrap_err();
    assert!(e.to_string().contains("BlockingHiCache::inner"), "{e}");
    // The async connector works here.
    assert_eq!(cache.inner().batch_exists(&ks).await.unwrap(), 0);
    drop(cache);
}

#[tokio::test]
async fn exists_report_and_close_follow_the_pool() {
    let cache = connector(
        Arc::new(MemoryBackend::new()),
        &[("naming", "sglang")],
        StorageIdentity::single("m"),
    );
    assert!(cache.pool_report().is_none());
    assert!(cache.selection_summary().is_none(), "not selected by open");
    assert_eq!(cache.config().naming.value, NamingScheme::Sglang);
    assert!(format!("{cache:?}").contains("HiCache"));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    assert!(format!("{pool:?}").contains("MmapPool"));
    assert_eq!(pool.base(), pool.memory().unwrap().addr());
    assert_ne!(pool.base(), 0);
    cache.register_pool(pool.clone()).unwrap();
    assert!(cache.pool_report().is_some());
    let ks = keys("one", 2);
    fill(&pool, 0, 1);
    cache
        .batch_set(&ks[..1], HostSlots::Pages(&[0]))
        .await
        .unwrap();
    assert!(cache.exists(&ks[0]).await.unwrap());
    assert!(!cache.exists(&ks[1]).await.unwrap());
    cache.close();
    assert!(cache.pool_report().is_none());
    assert!(matches!(
        cache.exists(&ks[0]).await,
        Err(Error::PoolNotRegistered)
    ));
}

fn usable(_: &hicache_core::raw::PluginContext<'_>) -> hicache_core::raw::Probe {
    hicache_core::raw::Probe::usable("in memory")
}

fn build_memory(
    _: &hicache_core::raw::PluginContext<'_>,
) -> hicache_core::Result<hicache_core::raw::DynBackend> {
    Ok(Arc::new(MemoryBackend::new()))
}

static MEM: hicache_core::raw::PluginDescriptor = hicache_core::raw::PluginDescriptor::new(
    "MEM",
    hicache_core::raw::BackendKind::Object,
    "the reference backend",
    usable,
    build_memory,
);

#[test]
fn a_connector_opened_from_a_registry_says_what_was_selected() {
    let registry = hicache_core::PluginRegistry::new(&[&MEM]).unwrap();
    let config = ConfigLoader::new().set("plugin", "MEM").load().unwrap();
    let cache = HiCache::open(
        &registry,
        config,
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    let summary = cache.selection_summary().unwrap();
    assert!(summary.contains("MEM") && summary.len() > 3, "{summary}");
    assert_eq!(cache.backend_info().name, "MEMORY");
}
