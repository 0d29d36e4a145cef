//! Misuse of the safe API is a typed error or cannot be written — never memory corruption.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hicache_core::{
    AttentionKind, ConfigLoader, Dtype, Error, HiCache, HiCacheOptions, HostPool, HostSlots,
    Layout, MemoryBackend, MemoryRegion, MmapPool, PageKey, PoolGeometry, StorageIdentity,
    gather_page, scatter_page,
};

fn geometry(pages: u64) -> PoolGeometry {
    PoolGeometry::new(
        AttentionKind::Mha {
            kv_heads: 2,
            head_dim: 64,
        },
        4,
        Dtype::Bf16,
        16,
        Layout::PageFirst,
        pages,
    )
    .unwrap()
}

#[test]
fn absurd_geometries_are_refused_at_construction() {
    let mha = AttentionKind::Mha {
        kv_heads: u64::MAX / 2,
        head_dim: 3,
    };
    for (attention, layers, tokens, pages) in [
        (mha, 4, 16, 8),
        (AttentionKind::Mla { kv_cache_dim: 64 }, u64::MAX, 16, 8),
        (AttentionKind::Mla { kv_cache_dim: 64 }, 4, 1 << 40, 1 << 40),
        (AttentionKind::Mla { kv_cache_dim: 64 }, 0, 16, 8),
        (AttentionKind::Mla { kv_cache_dim: 0 }, 4, 16, 8),
        (AttentionKind::Mla { kv_cache_dim: 64 }, 4, 16, 0),
    ] {
        let g = PoolGeometry::new(
            attention,
            layers,
            Dtype::Bf16,
            tokens,
            Layout::PageFirst,
            pages,
        );
        assert!(matches!(g, Err(Error::InvalidPool { .. })), "{g:?}");
    }
    let g = geometry(8);
    assert!(matches!(
        g.with_pages(u64::MAX),
        Err(Error::InvalidPool { .. })
    ));
    // Out-of-range pages are errors, not wrapping offsets.
    assert!(g.page_spans(8).is_err());
    assert!(g.page_spans(u64::MAX).is_err());
    let p = MmapPool::new(g).unwrap();
    let mut buf = vec![0; g.page_bytes() as usize];
    assert!(gather_page(&p, u64::MAX, &mut buf).is_err());
    assert!(scatter_page(&p, 8, &buf).is_err());
    assert!(scatter_page(&p, 0, &buf[1..]).is_err());
    assert!(p.write_bytes(u64::MAX, &[1]).is_err());
    assert!(p.read_bytes(g.pool_bytes() - 1, &mut [0; 2]).is_err());
}

/// A pool that answers `geometry()` differently on every call, and whose memory is only
/// big enough for the small answer.
#[derive(Debug)]
struct ShapeShifter {
    small: PoolGeometry,
    big: PoolGeometry,
    flip: AtomicBool,
    calls: AtomicU64,
    inner: MmapPool,
}

impl HostPool for ShapeShifter {
    fn geometry(&self) -> &PoolGeometry {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.flip.fetch_xor(true, Ordering::Relaxed) {
            &self.big
        } else {
            &self.small
        }
    }

    fn memory(&self) -> Option<MemoryRegion> {
        self.inner.memory()
    }
}

fn shape_shifter() -> ShapeShifter {
    let small = geometry(4);
    ShapeShifter {
        small,
        big: geometry(4096),
        flip: AtomicBool::new(false),
        calls: AtomicU64::new(0),
        inner: MmapPool::new(small).unwrap(),
    }
}

#[test]
fn a_geometry_that_changes_between_calls_is_read_once_per_call() {
    let p = shape_shifter();
    let mut buf = vec![0u8; p.small.page_bytes() as usize];
    for page in [0u64, 3, 100, 4095] {
        for _ in 0..4 {
            let before = p.calls.load(Ordering::Relaxed);
            let r = gather_page(&p, page, &mut buf);
            assert_eq!(
                p.calls.load(Ordering::Relaxed),
                before + 1,
                "one geometry read"
            );
            // Either the small answer (page in range: Ok, else error) or the big one (the
            // memory is too small: error) — never a copy outside the mapping.
            if let Err(e) = &r {
                assert!(
                    matches!(e, Error::InvalidPool { .. } | Error::InvalidBatch { .. }),
                    "{e}"
                );
            }
            let r = scatter_page(&p, page, &buf);
            if let Err(e) = &r {
                assert!(
                    matches!(e, Error::InvalidPool { .. } | Error::InvalidBatch { .. }),
                    "{e}"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_connector_keeps_the_geometry_it_registered() {
    let cache = HiCache::with_backend(
        Arc::new(MemoryBackend::new()),
        ConfigLoader::new().load().unwrap(),
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    let keys: Vec<PageKey> = (0..4)
        .map(|i| PageKey::new(format!("k{i:063}")).unwrap())
        .collect();
    for _ in 0..4 {
        let p = Arc::new(shape_shifter());
        match cache.register_pool(p.clone()) {
            Ok(report) => {
                assert_eq!(report.page_bytes, p.small.page_bytes());
                let calls = p.calls.load(Ordering::Relaxed);
                let set = cache
                    .batch_set(&keys, HostSlots::Pages(&[0, 1, 2, 3]))
                    .await
                    .unwrap();
                assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
                // Pages beyond the registered geometry are refused before any I/O.
                assert!(
                    cache
                        .batch_get(&keys[..1], HostSlots::Pages(&[4000]))
                        .await
                        .is_err()
                );
                assert_eq!(
                    p.calls.load(Ordering::Relaxed),
                    calls,
                    "calls use the registered geometry"
                );
            }
            Err(e) => assert!(matches!(e, Error::InvalidPool { .. }), "{e}"),
        }
    }
}

#[test]
fn accessors_never_race_a_transfer() {
    let g = geometry(4);
    let p = MmapPool::new(g).unwrap();
    let memory = p.memory().unwrap();
    // A transfer filling bytes 0..8192 (what a backend's read pin is).
    let pin = memory.target(0, 8192, "a read in flight").unwrap();
    assert!(matches!(
        p.write_bytes(4096, &[1; 16]),
        Err(Error::MemoryBusy { .. })
    ));
    assert!(matches!(
        p.read_bytes(0, &mut [0; 16]),
        Err(Error::MemoryBusy { .. })
    ));
    let mut page = vec![0; g.page_bytes() as usize];
    assert!(matches!(
        gather_page(&p, 0, &mut page),
        Err(Error::MemoryBusy { .. })
    ));
    // Bytes outside the transfer are free.
    p.write_bytes(8192, &[1; 16]).unwrap();
    drop(pin);
    p.write_bytes(4096, &[1; 16]).unwrap();

    // Threads writing whole-range patterns and reading the same range: a read that succeeds
    // sees one pattern, never a mix.
    let p = Arc::new(p);
    let len = 64 << 10;
    p.write_bytes(0, &vec![9; len]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u8)
        .map(|w| {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let bytes = vec![w + 1; len];
                let mut ok = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match p.write_bytes(0, &bytes) {
                        Ok(()) => ok += 1,
                        Err(Error::MemoryBusy { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                    // Two writers on two cores could otherwise hold the range every time the
                    // reader looks.
                    std::thread::yield_now();
                }
                ok
            })
        })
        .collect();
    let mut seen = 0;
    let mut out = vec![0u8; len];
    // At least 2000 attempts, and on until 200 reads got through (however busy the machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut attempts = 0;
    while attempts < 2000 || (seen < 200 && std::time::Instant::now() < deadline) {
        attempts += 1;
        match p.read_bytes(0, &mut out) {
            Ok(()) => {
                assert!(out.iter().all(|b| *b == out[0]), "a torn read");
                seen += 1;
            }
            Err(Error::MemoryBusy { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(seen > 0 && written > 0, "seen {seen}, written {written}");
}
