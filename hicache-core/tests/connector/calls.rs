//! What the connector asks of its backend: registration kept in step, staging refused, two
//! objects per page counted and batched by objects.

use std::sync::Arc;

use crate::{connector, keys, mha, mla};
use hicache_core::{
    Error, HostSlots, Layout, MemoryBackend, MmapPool, ReadOutcome, StorageIdentity, TransferMode,
};

/// The reference backend, counting what is registered with it (and refusing every
/// registration when `refuse` is set).
#[derive(Debug, Default)]
pub(crate) struct Counting {
    pub(crate) inner: MemoryBackend,
    pub(crate) registered: std::sync::atomic::AtomicI64,
    pub(crate) refuse: bool,
    /// The most objects one write, read or exists call carried.
    pub(crate) largest_call: std::sync::atomic::AtomicUsize,
    /// How long each `exists` call takes.
    pub(crate) exists_delay: std::time::Duration,
}

impl Counting {
    fn saw(&self, objects: usize) {
        self.largest_call
            .fetch_max(objects, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl hicache_core::raw::StorageBackend for Counting {
    fn info(&self) -> hicache_core::raw::BackendInfo {
        self.inner.info()
    }
    fn register(
        &self,
        region: hicache_core::MemoryRegion,
    ) -> hicache_core::Result<hicache_core::raw::RegionId> {
        if self.refuse {
            return Err(Error::backend("COUNTING", "registration refused"));
        }
        let id = self.inner.register(region)?;
        self.registered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(id)
    }
    fn deregister(&self, id: hicache_core::raw::RegionId) -> hicache_core::Result<()> {
        self.inner.deregister(id)?;
        self.registered
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    async fn write(
        &self,
        batch: &[hicache_core::raw::WriteItem<'_>],
    ) -> Vec<hicache_core::Result<()>> {
        self.saw(batch.len());
        self.inner.write(batch).await
    }
    async fn read(
        &self,
        batch: &[hicache_core::raw::ReadItem<'_>],
    ) -> Vec<hicache_core::Result<ReadOutcome>> {
        self.saw(batch.len());
        self.inner.read(batch).await
    }
    async fn exists(
        &self,
        keys: &[hicache_core::raw::ObjectKey],
    ) -> Vec<hicache_core::Result<bool>> {
        self.saw(keys.len());
        tokio::time::sleep(self.exists_delay).await;
        self.inner.exists(keys).await
    }
    async fn remove(&self, keys: &[hicache_core::raw::ObjectKey]) -> Vec<hicache_core::Result<()>> {
        self.inner.remove(keys).await
    }
    async fn usage(&self) -> hicache_core::Result<hicache_core::raw::Usage> {
        self.inner.usage().await
    }
}

/// Unregistering a pool (async, blocking or by re-registering) deregisters every region
/// the connector registered for it: the pool itself in zero-copy mode, staging in bounce.
#[tokio::test]
async fn unregistering_deregisters_everything_registered() {
    for transfer in ["auto", "bounce"] {
        let backend = Arc::new(Counting::default());
        let cache = connector(
            backend.clone(),
            &[("transfer_mode", transfer)],
            StorageIdentity::single("m"),
        );
        let live = || backend.registered.load(std::sync::atomic::Ordering::SeqCst);
        let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
        let ks = keys("reg", 4);
        for round in 0..3 {
            cache.register_pool(pool.clone()).unwrap();
            cache
                .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
                .await
                .unwrap();
            cache
                .batch_get(&ks, HostSlots::Pages(&[4, 5, 6, 7]))
                .await
                .unwrap();
            assert!(live() > 0, "{transfer}: nothing registered");
            match round {
                0 => cache.unregister_pool().await,
                1 => cache.close(),
                _ => drop(cache.register_pool(pool.clone()).unwrap()),
            }
            if round < 2 {
                assert_eq!(
                    live(),
                    0,
                    "{transfer}, round {round}: regions left registered"
                );
            }
        }
        cache.unregister_pool().await;
        assert_eq!(live(), 0, "{transfer}: regions left registered");
    }
}

/// Staging memory the backend refuses to register fails every page of the call with that
/// error: one result per page, none dropped.
#[tokio::test]
async fn refused_staging_fails_each_page_of_the_call() {
    let backend = Arc::new(Counting {
        refuse: true,
        ..Counting::default()
    });
    let cache = connector(
        backend,
        &[("transfer_mode", "bounce")],
        StorageIdentity::single("m"),
    );
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    cache.register_pool(pool).unwrap();
    let ks = keys("refused", 3);
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
        .await
        .unwrap();
    assert_eq!(set.len(), 3);
    for r in &set {
        let e = r.as_ref().unwrap_err();
        assert!(e.to_string().contains("registration refused"), "{e}");
    }
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[3, 4, 5]))
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|r| r.is_err()), "{got:?}");
}

/// Under SGLang naming in zero-copy mode a page is two objects (`_k`, `_v`): the report
/// counts both, and no plugin call carries more than `STORAGE_BATCH_SIZE` objects.
#[tokio::test]
async fn two_objects_per_page_are_counted_and_batched_by_objects() {
    let backend = Arc::new(Counting::default());
    let cache = connector(
        backend.clone(),
        &[("naming", "sglang"), ("page_format", "envelope")],
        StorageIdentity::single("m"),
    );
    let geometry = mha(Layout::PageFirst, 16).with_pages(400).unwrap();
    let pool = Arc::new(MmapPool::new(geometry).unwrap());
    let report = cache.register_pool(pool).unwrap();
    assert_eq!(report.mode, TransferMode::ZeroCopy, "{report}");
    assert_eq!(report.objects_per_page, 2);
    let header = hicache_core::raw::envelope::header_len(1);
    assert_eq!(
        report.stored_bytes_per_page,
        2 * (header + geometry.span_len()),
        "{report}"
    );
    let ks = keys("twice", 200);
    let src: Vec<u64> = (0..200).collect();
    let dst: Vec<u64> = (200..400).collect();
    let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await.unwrap();
    assert!(set.iter().all(|r| r.is_ok()));
    let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await.unwrap();
    assert!(got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))));
    assert_eq!(cache.batch_exists(&ks).await.unwrap(), 200);
    let largest = backend
        .largest_call
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        largest <= hicache_core::STORAGE_BATCH_SIZE && largest > 100,
        "a plugin call carried {largest} objects"
    );
}

/// Calls of large pages checksum and verify on two threads: every page still lands where
/// its own key says, a corrupted one is still caught (and only that one), in zero-copy and
/// in bounce mode.
#[tokio::test]
async fn large_pages_checksum_and_verify_split_over_threads() {
    // 2 (K, V) × 2 heads × 64 dims × 2 bytes × 4 layers = 2 KiB per token: 512 tokens make
    // a 1 MiB page (zero-copy); 511 tokens a page no 4096-byte storage can take in place
    // (bounce). 12 pages of about 1 MiB are past the 4 MiB at which the work is split.
    for (tokens, mode) in [(512, TransferMode::ZeroCopy), (511, TransferMode::Bounce)] {
        let backend = Arc::new(MemoryBackend::with_alignment(4096));
        let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
        let geometry = mha(Layout::PageFirst, tokens).with_pages(24).unwrap();
        let pool = Arc::new(MmapPool::new(geometry).unwrap());
        let report = cache.register_pool(pool.clone()).unwrap();
        assert_eq!(report.mode, mode, "{report}");
        let written: Vec<Vec<u8>> = (0..12).map(|p| crate::fill(&pool, p, p as u8)).collect();
        let ks = keys("large", 12);
        let src: Vec<u64> = (0..12).collect();
        let dst: Vec<u64> = (12..24).collect();
        let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await.unwrap();
        assert!(set.iter().all(|r| r.is_ok()), "{mode}: {set:?}");
        // One stored object gets a flipped byte in the middle of its payload (its end may be
        // alignment padding, which no page byte lives in).
        let names = backend.object_names();
        let victim = names
            .iter()
            .find(|n| n.contains(&ks[7].to_string()))
            .unwrap();
        let mut bytes = backend.raw_object(victim).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        backend.put_raw_object(victim, bytes);
        let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await.unwrap();
        for (i, r) in got.iter().enumerate() {
            if i == 7 {
                assert!(
                    matches!(
                        r,
                        Ok(ReadOutcome::Miss(
                            hicache_core::MissReason::ChecksumMismatch
                        ))
                    ),
                    "{mode}: page 7 {r:?}"
                );
                continue;
            }
            assert!(matches!(r, Ok(ReadOutcome::Hit)), "{mode}: page {i} {r:?}");
            assert_eq!(
                &crate::page_bytes(&pool, 12 + i as u64),
                &written[i],
                "{mode}: page {i}"
            );
        }
    }
}

/// `clear` removes the registered namespace's objects only: another model's pages, and
/// objects not named by hicache, stay; a rank that does not write removes nothing; SGLang
/// naming is refused, because its suffixes cannot tell models apart.
#[tokio::test]
async fn clear_removes_this_namespace_only() {
    let backend = Arc::new(MemoryBackend::new());
    let open = |model: &str, extra: &[(&str, &str)]| {
        let cache = connector(backend.clone(), extra, StorageIdentity::single(model));
        cache
            .register_pool(Arc::new(MmapPool::new(mha(Layout::PageFirst, 4)).unwrap()))
            .unwrap();
        cache
    };
    let (mine, other) = (open("m", &[]), open("big_m", &[]));
    let ks = keys("clr", 3);
    for cache in [&mine, &other] {
        let set = cache
            .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
            .await
            .unwrap();
        assert!(set.iter().all(|r| r.is_ok()));
    }
    backend.put_raw_object("not-hicache.bin", vec![1; 8]);
    assert_eq!(mine.clear().await.unwrap(), 3);
    assert_eq!(mine.batch_exists(&ks).await.unwrap(), 0);
    assert_eq!(other.batch_exists(&ks).await.unwrap(), 3);
    assert!(backend.raw_object("not-hicache.bin").is_some());
    assert_eq!(mine.clear().await.unwrap(), 0, "nothing left to remove");

    // An MLA rank above 0 does not write, so it removes nothing (rank 0's pages stay).
    let rank = |tp_rank| StorageIdentity {
        tp_rank,
        tp_size: 2,
        ..StorageIdentity::single("m")
    };
    let mla_pool = || Arc::new(MmapPool::new(mla(Layout::PageFirst, 4)).unwrap());
    let (rank0, rank1) = (
        connector(backend.clone(), &[], rank(0)),
        connector(backend.clone(), &[], rank(1)),
    );
    rank0.register_pool(mla_pool()).unwrap();
    rank1.register_pool(mla_pool()).unwrap();
    rank0
        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
        .await
        .unwrap();
    assert_eq!(rank1.clear().await.unwrap(), 0);
    assert_eq!(rank1.batch_exists(&ks).await.unwrap(), 3);

    let sglang = open("m", &[("naming", "sglang")]);
    let e = sglang.clear().await.unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert_eq!(other.batch_exists(&ks).await.unwrap(), 3);
}
