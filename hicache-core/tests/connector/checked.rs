//! Reads checked by the backend where it read them (`read_checked`): the connector's
//! verification must give the same verdicts whatever pieces the backend lends the bytes in,
//! and the connector must rely on what the check saw.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{connector, fill, keys, mha, page_bytes, unaligned_spans};
use hicache_core::raw::{
    BackendInfo, ObjectKey, ReadCheck, ReadItem, RegionId, RegionTable, StorageBackend, Usage,
    WriteItem,
};
use hicache_core::{
    HostSlots, Layout, MemoryBackend, MemoryRegion, MissReason, MmapPool, ReadOutcome,
    StorageIdentity, TransferMode,
};

/// The reference backend, checking its reads itself: each object's bytes are lent to the
/// check in pieces of `piece` bytes (or, with `lie`, as zeros of the same length).
#[derive(Debug)]
struct Checking {
    inner: MemoryBackend,
    /// The same registrations, to read back what a read delivered.
    regions: RegionTable,
    piece: usize,
    lie: bool,
    checks: AtomicUsize,
}

impl Checking {
    fn new(align: u64, piece: usize, lie: bool) -> Self {
        Checking {
            inner: MemoryBackend::with_alignment(align),
            regions: RegionTable::new("CHECKING"),
            piece,
            lie,
            checks: AtomicUsize::new(0),
        }
    }
}

#[async_trait::async_trait]
impl StorageBackend for Checking {
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
    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<hicache_core::Result<ReadOutcome>> {
        self.inner.read(batch).await
    }
    async fn read_checked(
        &self,
        batch: &[ReadItem<'_>],
        check: &ReadCheck<'_>,
    ) -> Option<Vec<hicache_core::Result<ReadOutcome>>> {
        let mut results = self.inner.read(batch).await;
        for (i, (item, r)) in batch.iter().zip(results.iter_mut()).enumerate() {
            if !matches!(r, Ok(ReadOutcome::Hit)) {
                continue;
            }
            let mut bytes = self.regions.gather(item.segments).unwrap();
            if self.lie {
                bytes.fill(0);
            }
            let pieces: Vec<IoSlice<'_>> = bytes.chunks(self.piece).map(IoSlice::new).collect();
            self.checks.fetch_add(1, Ordering::SeqCst);
            if let Err(reason) = check(i, &pieces) {
                *r = Ok(ReadOutcome::Miss(reason));
            }
        }
        Some(results)
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
async fn verdicts_do_not_depend_on_how_the_bytes_are_lent() {
    // Zero-copy (header in staging, payload in the pool) and bounce under 4096-byte
    // alignment (header, payload and padding in one staging slot).
    let g = unaligned_spans();
    for (align, mode) in [(1u64, TransferMode::ZeroCopy), (4096, TransferMode::Bounce)] {
        for piece in [1, 7, 64, 4096, usize::MAX] {
            let backend = Arc::new(Checking::new(align, piece, false));
            let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
            let pool = Arc::new(MmapPool::new(g).unwrap());
            assert_eq!(cache.register_pool(pool.clone()).unwrap().mode, mode);
            let ks = keys("chk", 4);
            let written: Vec<Vec<u8>> = (0..4).map(|p| fill(&pool, p, p as u8 + 1)).collect();
            let set = cache
                .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
                .await
                .unwrap();
            assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
            // One stored payload byte flipped (the object's last payload byte).
            let name = cache.object_names(&ks[2]).unwrap()[0].clone();
            let mut object = backend.inner.raw_object(name.as_str()).unwrap();
            let header = hicache_core::raw::envelope::Header::decode(&object).unwrap();
            object[header.object_len() as usize - 1] ^= 1;
            backend.inner.put_raw_object(name.as_str(), object);
            for p in 0..4 {
                fill(&pool, p, 0);
            }
            let got = cache
                .batch_get(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
                .await
                .unwrap();
            let got: Vec<_> = got.into_iter().map(Result::unwrap).collect();
            assert_eq!(
                got,
                [
                    ReadOutcome::Hit,
                    ReadOutcome::Hit,
                    ReadOutcome::Miss(MissReason::ChecksumMismatch),
                    ReadOutcome::Hit
                ],
                "{mode:?}, pieces of {piece}"
            );
            for p in [0, 1, 3] {
                assert_eq!(
                    page_bytes(&pool, p),
                    written[p as usize],
                    "{mode:?} page {p}"
                );
            }
            assert_eq!(backend.checks.load(Ordering::SeqCst), 4);
        }
    }
}

#[tokio::test]
async fn the_connector_goes_by_what_the_check_saw() {
    // The objects are stored intact, but the backend lends zeros to the check: every page
    // must miss, which only the check can have decided.
    let backend = Arc::new(Checking::new(1, 4096, true));
    let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 4)).unwrap());
    cache.register_pool(pool.clone()).unwrap();
    let ks = keys("lent", 2);
    fill(&pool, 0, 1);
    fill(&pool, 1, 2);
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1]))
        .await
        .unwrap();
    assert!(set.iter().all(|r| r.is_ok()));
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[0, 1]))
        .await
        .unwrap();
    for r in got {
        assert!(
            matches!(r, Ok(ReadOutcome::Miss(MissReason::BadHeader { .. }))),
            "{r:?}"
        );
    }
    assert_eq!(backend.checks.load(Ordering::SeqCst), 2);
}
