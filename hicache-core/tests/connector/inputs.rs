//! Inputs and options checked before any I/O: bad batches, pools that overclaim, staging,
//! transfer modes, segment limits, parsers, page spans.

use std::sync::Arc;

use crate::{PAGES, connector, keys, mha};
use hicache_core::raw::Capability;
use hicache_core::{
    ConfigLoader, Dtype, Error, HiCache, HiCacheOptions, HostPool, HostSlots, Layout,
    MemoryBackend, MmapPool, ModeRule, PoolGeometry, StorageIdentity, TransferMode, decide_mode,
    scatter_page,
};

#[tokio::test]
async fn bad_batches_are_typed_errors_before_io() {
    let backend = Arc::new(MemoryBackend::new());
    let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
    let ks = keys("b", 2);
    assert!(matches!(
        cache.batch_get(&ks, HostSlots::Pages(&[0, 1])).await,
        Err(Error::PoolNotRegistered)
    ));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 4)).unwrap());
    cache.register_pool(pool).unwrap();
    // Ragged token indices (one short), misaligned page start, gaps, out of range.
    let ragged: Vec<u64> = (0..7).collect();
    let misaligned: Vec<u64> = (1..9).collect();
    let gap: Vec<u64> = vec![0, 1, 2, 3, 4, 5, 6, 8];
    let outside: Vec<u64> = (PAGES * 4..PAGES * 4 + 8).collect();
    for tokens in [&ragged, &misaligned, &gap, &outside] {
        let err = cache
            .batch_set(&ks, HostSlots::Tokens(tokens))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidBatch { .. }), "{err}");
    }
    assert!(cache.batch_get(&ks, HostSlots::Pages(&[0])).await.is_err());
    assert!(
        cache
            .batch_get(&ks, HostSlots::Pages(&[0, PAGES]))
            .await
            .is_err()
    );
    assert_eq!(backend.object_count(), 0);
    let ok: Vec<u64> = (4..12).collect();
    let set = cache.batch_set(&ks, HostSlots::Tokens(&ok)).await.unwrap();
    assert!(set.iter().all(|r| r.is_ok()));
    assert!(
        cache
            .batch_set(&[], HostSlots::Pages(&[]))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        cache
            .batch_get(&[], HostSlots::Tokens(&[]))
            .await
            .unwrap()
            .is_empty()
    );
    cache.close();
    cache.close();
    assert!(matches!(
        cache.batch_exists(&ks).await,
        Err(Error::PoolNotRegistered)
    ));
}

/// A pool that claims a bigger geometry than its memory holds (`HostPool` is a safe trait,
/// so the connector and the copies must not trust it).
#[derive(Debug)]
struct Overclaiming {
    memory: MmapPool,
    geometry: PoolGeometry,
}

impl HostPool for Overclaiming {
    fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }
    fn memory(&self) -> Option<hicache_core::MemoryRegion> {
        self.memory.memory()
    }
}

#[tokio::test]
async fn a_pool_smaller_than_its_geometry_is_refused() {
    let small = MmapPool::new(mha(Layout::PageFirst, 16)).unwrap();
    let lying = Arc::new(Overclaiming {
        geometry: small.geometry().with_pages(PAGES * 2).unwrap(),
        memory: small,
    });
    let cache = connector(
        Arc::new(MemoryBackend::new()),
        &[],
        StorageIdentity::single("m"),
    );
    let e = cache.register_pool(lying.clone()).unwrap_err();
    assert!(matches!(e, Error::InvalidPool { .. }), "{e}");
    let page = vec![0u8; lying.geometry.page_bytes() as usize];
    let e = scatter_page(lying.as_ref(), PAGES + 1, &page).unwrap_err();
    assert!(matches!(e, Error::InvalidPool { .. }), "{e}");
}

/// Staging memory follows the options: slots of one page each, as many as the chunk bytes
/// allow, at most `max_slots_per_chunk`.
#[tokio::test]
async fn staging_follows_the_options() {
    // 3-token pages are 6144 bytes: bounce mode on 4096-byte storage, 4096 header + 8192.
    let slot = 4096 + 8192;
    for (chunk_bytes, max_slots, slots) in [(1 << 20, 5, 5), (2 * slot, 1000, 2), (1, 1000, 1)] {
        let options = HiCacheOptions::new(StorageIdentity::single("m"))
            .with_staging_chunk_bytes(chunk_bytes)
            .with_max_slots_per_chunk(max_slots);
        let cache = HiCache::with_backend(
            Arc::new(MemoryBackend::with_alignment(4096)),
            ConfigLoader::new().load().unwrap(),
            options,
        )
        .unwrap();
        let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 3)).unwrap());
        let report = cache.register_pool(pool).unwrap();
        assert_eq!(report.mode, TransferMode::Bounce);
        assert_eq!(report.stored_bytes_per_page, slot, "{report}");
        assert_eq!(report.staging_chunk_bytes, slot * slots, "{report}");
        assert_eq!(
            cache.pool_report().unwrap().staging_chunk_bytes,
            slot * slots
        );
    }
}

#[tokio::test]
async fn transfer_mode_bounce_in_the_config_forces_bounce() {
    let cache = connector(
        Arc::new(MemoryBackend::new()),
        &[("transfer_mode", "bounce")],
        StorageIdentity::single("m"),
    );
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    let report = cache.register_pool(pool).unwrap();
    assert_eq!(report.mode, TransferMode::Bounce);
    assert!(report.reason.contains("transfer_mode = bounce"), "{report}");
    assert_eq!(TransferMode::Bounce.to_string(), "bounce");
    assert_eq!(TransferMode::ZeroCopy.to_string(), "zero-copy");
    assert_eq!(TransferMode::Anchor.to_string(), "anchor");
}

/// A page of `spans` spans needs `spans + 1` segments (one for the header): exactly that
/// many is zero-copy, one fewer is bounce.
#[test]
fn segment_limits_decide_at_spans_plus_one() {
    let g = mha(Layout::LayerFirst, 16);
    let spans = g.spans_per_page();
    let mut cap = Capability::default();
    cap.max_segments = u32::try_from(spans + 1).unwrap();
    let (mode, why) = decide_mode(&g, Some(0), &cap, ModeRule::Hicache);
    assert_eq!(mode, TransferMode::ZeroCopy, "{why}");
    cap.max_segments -= 1;
    assert_eq!(
        decide_mode(&g, Some(0), &cap, ModeRule::Hicache).0,
        TransferMode::Bounce
    );
}

#[test]
fn parsers_take_every_documented_name() {
    for (names, dtype) in [
        (&["f32", "fp32", "float32"][..], Dtype::F32),
        (&["f16", "fp16", "float16", "half"][..], Dtype::F16),
        (&["bf16", "bfloat16"][..], Dtype::Bf16),
        (
            &["fp8", "fp8_e4m3", "float8_e4m3fn", "e4m3"][..],
            Dtype::Fp8E4m3,
        ),
        (&["fp8_e5m2", "float8_e5m2", "e5m2"][..], Dtype::Fp8E5m2),
        (&["int8", "i8"][..], Dtype::Int8),
    ] {
        for name in names {
            assert_eq!(Dtype::parse(name).unwrap(), dtype, "{name}");
            assert_eq!(name.parse::<Dtype>().unwrap(), dtype);
        }
    }
    let e = Dtype::parse("f64").unwrap_err().to_string();
    assert!(
        e.contains("`f64` is not a dtype") && e.contains("bfloat16"),
        "{e}"
    );
    for layout in Layout::ALL {
        assert_eq!(Layout::parse(layout.as_str()).unwrap(), layout);
        assert_eq!(layout.as_str().parse::<Layout>().unwrap(), layout);
    }
    let e = Layout::parse("page-first").unwrap_err().to_string();
    assert!(e.contains("page_first_direct"), "{e}");
}

#[test]
fn page_spans_know_how_many_are_left() {
    let g = mha(Layout::LayerFirst, 16);
    assert_eq!(g.layers(), 4);
    let mut spans = g.page_spans(3).unwrap();
    let total = g.spans_per_page() as usize;
    for left in (0..total).rev() {
        assert_eq!(spans.len(), left + 1);
        spans.next().unwrap();
        assert_eq!(spans.size_hint(), (left, Some(left)));
    }
    assert!(spans.next().is_none());
}
