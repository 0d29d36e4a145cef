//! Pages pinned by calls in flight: unregistering and zero-copy reads wait for them.

use std::sync::Arc;

use crate::calls::Counting;
use crate::{connector, fill, keys, mha, page_bytes};
use hicache_core::{
    HostSlots, Layout, MemoryBackend, MmapPool, ReadOutcome, StorageIdentity, TransferMode,
};

/// Unregistering waits for the calls in flight (an `exists` pins no pool memory, so only
/// that wait holds it back): when it returns, the call has ended and every region is
/// deregistered. Both the async and the blocking form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistering_waits_for_calls_in_flight() {
    for blocking in [false, true] {
        let backend = Arc::new(Counting {
            exists_delay: std::time::Duration::from_millis(300),
            ..Counting::default()
        });
        let cache = Arc::new(connector(
            backend.clone(),
            &[],
            StorageIdentity::single("m"),
        ));
        let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
        cache.register_pool(pool).unwrap();
        let live = || backend.registered.load(std::sync::atomic::Ordering::SeqCst);
        assert!(live() > 0);
        let in_flight = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.batch_exists(&keys("flight", 4)).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if blocking {
            let cache = cache.clone();
            tokio::task::spawn_blocking(move || cache.close())
                .await
                .unwrap();
        } else {
            cache.unregister_pool().await;
        }
        assert_eq!(
            live(),
            0,
            "blocking {blocking}: returned before the call in flight ended"
        );
        assert_eq!(in_flight.await.unwrap().unwrap(), 0);
    }
}

/// The reference backend whose writes keep their source pages pinned for `hold_ms` first,
/// as a backend whose write outlives a dropped call does (an HTTP body still being sent).
#[derive(Debug)]
struct SlowWriter {
    inner: MemoryBackend,
    pins: hicache_core::raw::RegionTable,
    hold_ms: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl hicache_core::raw::StorageBackend for SlowWriter {
    fn info(&self) -> hicache_core::raw::BackendInfo {
        self.inner.info()
    }
    fn register(
        &self,
        region: hicache_core::MemoryRegion,
    ) -> hicache_core::Result<hicache_core::raw::RegionId> {
        let id = self.inner.register(region.clone())?;
        assert_eq!(self.pins.insert(region), id, "both tables number alike");
        Ok(id)
    }
    fn deregister(&self, id: hicache_core::raw::RegionId) -> hicache_core::Result<()> {
        self.pins.remove(id)?;
        self.inner.deregister(id)
    }
    async fn write(
        &self,
        batch: &[hicache_core::raw::WriteItem<'_>],
    ) -> Vec<hicache_core::Result<()>> {
        let held: Vec<_> = batch
            .iter()
            .flat_map(|item| item.segments.iter())
            .map(|s| self.pins.source(s).unwrap())
            .collect();
        let ms = self.hold_ms.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        drop(held);
        self.inner.write(batch).await
    }
    async fn read(
        &self,
        batch: &[hicache_core::raw::ReadItem<'_>],
    ) -> Vec<hicache_core::Result<ReadOutcome>> {
        self.inner.read(batch).await
    }
    async fn exists(
        &self,
        keys: &[hicache_core::raw::ObjectKey],
    ) -> Vec<hicache_core::Result<bool>> {
        self.inner.exists(keys).await
    }
    async fn remove(&self, keys: &[hicache_core::raw::ObjectKey]) -> Vec<hicache_core::Result<()>> {
        self.inner.remove(keys).await
    }
    async fn usage(&self) -> hicache_core::Result<hicache_core::raw::Usage> {
        self.inner.usage().await
    }
}

/// A zero-copy read into pages a write still pins waits for the write instead of failing
/// with `MemoryBusy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_copy_read_waits_for_a_write_pinning_its_pages() {
    let backend = Arc::new(SlowWriter {
        inner: MemoryBackend::new(),
        pins: hicache_core::raw::RegionTable::new("SLOW"),
        hold_ms: std::sync::atomic::AtomicU64::new(0),
    });
    let cache = Arc::new(connector(
        backend.clone(),
        &[],
        StorageIdentity::single("m"),
    ));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    let report = cache.register_pool(pool.clone()).unwrap();
    assert_eq!(report.mode, TransferMode::ZeroCopy, "{report}");
    let ks = keys("pinned", 2);
    let first = fill(&pool, 0, 3);
    let set = cache
        .batch_set(&ks[..1], HostSlots::Pages(&[0]))
        .await
        .unwrap();
    assert!(set[0].is_ok(), "{set:?}");
    // Page 1 goes out slowly; meanwhile page 0's object is read into page 1.
    fill(&pool, 1, 4);
    backend
        .hold_ms
        .store(300, std::sync::atomic::Ordering::SeqCst);
    let writer = {
        let (cache, ks) = (cache.clone(), ks.clone());
        tokio::spawn(async move { cache.batch_set(&ks[1..], HostSlots::Pages(&[1])).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let got = cache
        .batch_get(&ks[..1], HostSlots::Pages(&[1]))
        .await
        .unwrap();
    assert!(matches!(got[0], Ok(ReadOutcome::Hit)), "{got:?}");
    assert!(writer.await.unwrap().unwrap()[0].is_ok());
    assert_eq!(page_bytes(&pool, 1), first);
}
