//! Writes sealed by the backend where it writes them (`write_sealed`): the connector's
//! headers must come out byte for byte as when it completes them itself, whatever pieces the
//! backend lends the payload in, and a seal given the wrong bytes must fail its page.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{connector, fill, keys, mha, page_bytes};
use hicache_core::raw::{
    BackendInfo, ObjectKey, ReadItem, RegionId, RegionTable, StorageBackend, Usage, WriteItem,
    WriteSeal,
};
use hicache_core::{
    HostSlots, Layout, MemoryBackend, MemoryRegion, MmapPool, ReadOutcome, StorageIdentity,
    TransferMode,
};

/// The reference backend, sealing its writes itself: each payload is lent to the seal in
/// pieces of `piece` bytes, without its last `short` bytes.
#[derive(Debug)]
struct Sealing {
    inner: MemoryBackend,
    /// The same registrations, to gather what a write sends.
    regions: RegionTable,
    piece: usize,
    short: usize,
    seals: AtomicUsize,
}

impl Sealing {
    fn new(piece: usize, short: usize) -> Self {
        Sealing {
            inner: MemoryBackend::new(),
            regions: RegionTable::new("SEALING"),
            piece,
            short,
            seals: AtomicUsize::new(0),
        }
    }
}

#[async_trait::async_trait]
impl StorageBackend for Sealing {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }
    fn register(&self, region: MemoryRegion) -> hicache_core::Result<RegionId> {
        let id = self.inner.register(region.clone())?;
        assert_eq!(self.regions.insert(region), id, "region ids in step");
        Ok(id)
    }
    fn deregister(&self, id: RegionId) -> hicache_core::Result<()> {
        self.inner.deregister(id)?;
        self.regions.remove(id).map(drop)
    }
    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<hicache_core::Result<()>> {
        self.inner.write(batch).await
    }
    async fn write_sealed(
        &self,
        batch: &[WriteItem<'_>],
        seal: &WriteSeal<'_>,
    ) -> Option<Vec<hicache_core::Result<()>>> {
        let results = batch
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let (first, rest) = item.segments.split_first().unwrap();
                let mut header = self.regions.gather(std::slice::from_ref(first))?;
                let payload = self.regions.gather(rest)?;
                let lent = &payload[..payload.len() - self.short];
                let pieces: Vec<IoSlice<'_>> = lent.chunks(self.piece).map(IoSlice::new).collect();
                self.seals.fetch_add(1, Ordering::SeqCst);
                seal(i, &pieces, &mut header)?;
                header.extend_from_slice(&payload);
                self.inner.put_raw_object(item.key.as_str(), header);
                Ok(())
            })
            .collect();
        Some(results)
    }
    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<hicache_core::Result<ReadOutcome>> {
        self.inner.read(batch).await
    }
    async fn exists(&self, keys: &[ObjectKey]) -> Vec<hicache_core::Result<bool>> {
        self.inner.exists(keys).await
    }
    async fn remove(&self, keys: &[ObjectKey]) -> Vec<hicache_core::Result<()>> {
        self.inner.remove(keys).await
    }
    async fn usage(&self) -> hicache_core::Result<Usage> {
        self.inner.usage().await
    }
}

#[tokio::test]
async fn sealed_objects_are_the_objects_the_connector_would_write() {
    let g = mha(Layout::PageFirst, 4);
    let ks = keys("seal", 4);
    // What the connector stores when it completes the headers itself.
    let plain = Arc::new(MemoryBackend::new());
    let cache = connector(plain.clone(), &[], StorageIdentity::single("m"));
    let pool = Arc::new(MmapPool::new(g).unwrap());
    assert_eq!(
        cache.register_pool(pool.clone()).unwrap().mode,
        TransferMode::ZeroCopy
    );
    let written: Vec<Vec<u8>> = (0..4).map(|p| fill(&pool, p, p as u8 + 9)).collect();
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
        .await
        .unwrap();
    assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
    for piece in [1, 7, 64, usize::MAX] {
        let backend = Arc::new(Sealing::new(piece, 0));
        let sealing = connector(backend.clone(), &[], StorageIdentity::single("m"));
        sealing.register_pool(pool.clone()).unwrap();
        let set = sealing
            .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
            .await
            .unwrap();
        assert!(set.iter().all(|r| r.is_ok()), "pieces of {piece}: {set:?}");
        let mut objects = 0;
        for k in &ks {
            for name in sealing.object_names(k).unwrap() {
                objects += 1;
                assert_eq!(
                    backend.inner.raw_object(name.as_str()),
                    plain.raw_object(name.as_str()),
                    "{name}, pieces of {piece}"
                );
            }
        }
        assert_eq!(backend.seals.load(Ordering::SeqCst), objects);
        for p in 0..4 {
            fill(&pool, p, 0);
        }
        let got = sealing
            .batch_get(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
            .await
            .unwrap();
        assert!(
            got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
            "{got:?}"
        );
        for p in 0..4 {
            assert_eq!(page_bytes(&pool, p), written[p as usize], "page {p}");
        }
    }
}

#[tokio::test]
async fn a_seal_lent_the_wrong_bytes_fails_its_page() {
    let backend = Arc::new(Sealing::new(usize::MAX, 1));
    let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 4)).unwrap());
    cache.register_pool(pool.clone()).unwrap();
    let ks = keys("short", 2);
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1]))
        .await
        .unwrap();
    for r in &set {
        let e = r.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("payload bytes") && e.contains("plugin bug"),
            "{e}"
        );
    }
    let exists = cache.batch_exists(&ks).await.unwrap();
    assert_eq!(exists, 0, "nothing of a refused page is stored");
}
