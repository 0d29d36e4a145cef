//! The connector's decisions and data path, against the reference in-memory backend.

use std::sync::Arc;

use hicache_core::raw::Capability;
use hicache_core::raw::envelope::Header;
use hicache_core::{
    AnchorPool, AttentionKind, BlockingHiCache, ConfigLoader, Dtype, Error, HiCache,
    HiCacheOptions, HostPool, HostSlots, Layout, MemoryBackend, MissReason, MmapPool, NamingScheme,
    PageKey, PoolGeometry, ReadOutcome, SetOutcome, StorageIdentity, TransferMode, decide_mode,
    gather_page, scatter_page,
};

const PAGES: u64 = 12;

fn mha(layout: Layout, page_tokens: u64) -> PoolGeometry {
    PoolGeometry::new(
        AttentionKind::Mha {
            kv_heads: 2,
            head_dim: 64,
        },
        4,
        Dtype::Bf16,
        page_tokens,
        layout,
        PAGES,
    )
    .unwrap()
}

fn mla(layout: Layout, page_tokens: u64) -> PoolGeometry {
    PoolGeometry::new(
        AttentionKind::Mla { kv_cache_dim: 64 },
        4,
        Dtype::Bf16,
        page_tokens,
        layout,
        PAGES,
    )
    .unwrap()
}

fn keys(prefix: &str, n: usize) -> Vec<PageKey> {
    (0..n)
        .map(|i| PageKey::new(format!("{prefix}{i:060}")).unwrap())
        .collect()
}

/// A connector over `backend` with the config values `extra` (any backend: the reference
/// one or a test wrapper around it).
fn connector<B: hicache_core::raw::StorageBackend>(
    backend: Arc<B>,
    extra: &[(&str, &str)],
    identity: StorageIdentity,
) -> HiCache {
    let mut loader = ConfigLoader::new();
    for (k, v) in extra {
        loader = loader.set(*k, *v);
    }
    HiCache::with_backend(
        backend,
        loader.load().unwrap(),
        HiCacheOptions::new(identity),
    )
    .unwrap()
}

/// Fills page `page` with bytes derived from `seed`, distinct per page and position.
fn fill(pool: &MmapPool, page: u64, seed: u8) -> Vec<u8> {
    let g = pool.geometry();
    let flat: Vec<u8> = (0..g.page_bytes())
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 8) as u8)
        })
        .collect();
    scatter_page(pool, page, &flat).unwrap();
    flat
}

fn page_bytes(pool: &MmapPool, page: u64) -> Vec<u8> {
    let mut out = vec![0; pool.geometry().page_bytes() as usize];
    gather_page(pool, page, &mut out).unwrap();
    out
}

fn snapshot(pool: &MmapPool) -> Vec<u8> {
    let mut out = vec![0; pool.geometry().pool_bytes() as usize];
    pool.read_bytes(0, &mut out).unwrap();
    out
}

#[tokio::test]
async fn round_trip_every_layout_and_mode_with_guards() {
    // (alignment of the fake storage, page tokens): 1 → zero-copy without direct I/O;
    // 4096 with 16-token pages → aligned zero-copy; 4096 with 3-token pages → bounce.
    for (align, page_tokens, anchor) in [
        (1, 16, false),
        (4096, 16, false),
        (4096, 3, false),
        (4096, 16, true),
    ] {
        for geometry in Layout::ALL.into_iter().map(|l| mha(l, page_tokens)).chain(
            [
                Layout::LayerFirst,
                Layout::PageFirst,
                Layout::PageFirstDirect,
            ]
            .map(|l| mla(l, page_tokens)),
        ) {
            for naming in ["hicache", "sglang"] {
                let backend = Arc::new(MemoryBackend::with_alignment(align));
                let cache = connector(
                    backend.clone(),
                    &[("naming", naming)],
                    StorageIdentity::single("m"),
                );
                let ctx = format!(
                    "align {align} tokens {page_tokens} {} {:?} {naming} anchor {anchor}",
                    geometry.layout(),
                    geometry.attention()
                );
                if anchor {
                    let report = cache
                        .register_pool(Arc::new(AnchorPool::new(geometry).unwrap()))
                        .unwrap();
                    assert_eq!(report.mode, TransferMode::Anchor, "{ctx}");
                    let ks = keys("a", 3);
                    let set = cache
                        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
                        .await
                        .unwrap();
                    assert!(
                        set.iter().all(|r| matches!(r, Ok(SetOutcome::Written))),
                        "{ctx}"
                    );
                    assert_eq!(cache.batch_exists(&ks).await.unwrap(), 3, "{ctx}");
                    let got = cache
                        .batch_get(&ks, HostSlots::Pages(&[5, 6, 7]))
                        .await
                        .unwrap();
                    assert!(
                        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
                        "{ctx}"
                    );
                    // Markers say they are markers (under hicache's own naming they are
                    // enveloped; SGLang naming stores raw markers).
                    if naming == "hicache" {
                        let name = cache.object_names(&ks[0]).unwrap()[0].clone();
                        let marker = backend.raw_object(name.as_str()).unwrap();
                        let h = Header::decode(&marker).unwrap();
                        assert_ne!(
                            h.flags & hicache_core::raw::envelope::FLAG_ANCHOR,
                            0,
                            "{ctx}"
                        );
                    }
                    continue;
                }
                let pool = Arc::new(MmapPool::new(geometry).unwrap());
                let report = cache.register_pool(pool.clone()).unwrap();
                let expect_zero_copy = geometry.spans_aligned(pool.base() as u64, align)
                    && !(naming == "sglang" && geometry.spans_per_page() > 2);
                assert_eq!(
                    report.mode == TransferMode::ZeroCopy,
                    expect_zero_copy,
                    "{ctx}: {}",
                    report.reason
                );
                let ks = keys("k", 4);
                let written: Vec<Vec<u8>> =
                    (0..4).map(|i| fill(&pool, i, i as u8 * 7 + 1)).collect();
                let set = cache
                    .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
                    .await
                    .unwrap();
                assert!(
                    set.iter().all(|r| matches!(r, Ok(SetOutcome::Written))),
                    "{ctx}: {set:?}"
                );
                // Guard pattern: every target page and its neighbours hold known bytes.
                for p in 4..PAGES {
                    fill(&pool, p, 0xEE);
                }
                let before = snapshot(&pool);
                let got = cache
                    .batch_get(&ks, HostSlots::Pages(&[6, 8, 9, 11]))
                    .await
                    .unwrap();
                assert!(
                    got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
                    "{ctx}: {got:?}"
                );
                for (i, target) in [6u64, 8, 9, 11].into_iter().enumerate() {
                    assert_eq!(
                        page_bytes(&pool, target),
                        written[i],
                        "{ctx}: page {target}"
                    );
                }
                let after = snapshot(&pool);
                for untouched in [4u64, 5, 7, 10] {
                    for span in geometry.page_spans(untouched).unwrap() {
                        let r = span.offset as usize..(span.offset + span.len) as usize;
                        assert_eq!(
                            before[r.clone()],
                            after[r],
                            "{ctx}: guard page {untouched} changed"
                        );
                    }
                }
                let objects = backend.object_names();
                assert_eq!(objects.len() as u64, 4 * report.objects_per_page, "{ctx}");
            }
        }
    }
}

#[tokio::test]
async fn mode_decisions_use_the_real_alignment() {
    let g = mha(Layout::PageFirst, 16);
    let mut aligned = Capability::default();
    aligned.direct_io = true;
    aligned.io_alignment = 4096;
    aligned.max_segments = 64;
    assert_eq!(
        decide_mode(&g, None, &aligned, NamingScheme::Hicache).0,
        TransferMode::Anchor
    );
    assert_eq!(
        decide_mode(&g, Some(0), &aligned, NamingScheme::Hicache).0,
        TransferMode::ZeroCopy
    );
    let (mode, why) = decide_mode(&g, Some(512), &aligned, NamingScheme::Hicache);
    assert_eq!(mode, TransferMode::Bounce);
    assert!(why.contains("4096-byte alignment"), "{why}");
    // The same base is fine on a storage that reports 512-byte alignment (ext4 here).
    let mut ext4 = aligned;
    ext4.io_alignment = 512;
    assert_eq!(
        decide_mode(&g, Some(512), &ext4, NamingScheme::Hicache).0,
        TransferMode::ZeroCopy
    );
    // Without direct I/O alignment does not matter.
    let mut buffered = aligned;
    buffered.direct_io = false;
    assert_eq!(
        decide_mode(&g, Some(3), &buffered, NamingScheme::Hicache).0,
        TransferMode::ZeroCopy
    );
    // layer_first: zero-copy when aligned, bounce under SGLang naming or too many spans.
    let lf = mha(Layout::LayerFirst, 16);
    assert_eq!(
        decide_mode(&lf, Some(0), &aligned, NamingScheme::Hicache).0,
        TransferMode::ZeroCopy
    );
    assert_eq!(
        decide_mode(&lf, Some(0), &aligned, NamingScheme::Sglang).0,
        TransferMode::Bounce
    );
    let mut few = aligned;
    few.max_segments = 4;
    let (mode, why) = decide_mode(&lf, Some(0), &few, NamingScheme::Hicache);
    assert_eq!(mode, TransferMode::Bounce);
    assert!(why.contains("segments"), "{why}");
}

#[tokio::test]
async fn misses_inside_a_batch_are_per_page() {
    let backend = Arc::new(MemoryBackend::with_alignment(4096));
    let cache = connector(backend, &[], StorageIdentity::single("m"));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 3)).unwrap());
    assert_eq!(
        cache.register_pool(pool.clone()).unwrap().mode,
        TransferMode::Bounce
    );
    let ks = keys("m", 5);
    fill(&pool, 0, 1);
    fill(&pool, 2, 2);
    cache
        .batch_set(&[ks[0].clone(), ks[2].clone()], HostSlots::Pages(&[0, 2]))
        .await
        .unwrap();
    for p in 5..10 {
        fill(&pool, p, 0xAB);
    }
    let before = snapshot(&pool);
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[5, 6, 7, 8, 9]))
        .await
        .unwrap();
    assert!(matches!(got[0], Ok(ReadOutcome::Hit)));
    assert!(matches!(
        got[1],
        Ok(ReadOutcome::Miss(MissReason::NotFound))
    ));
    assert!(matches!(got[2], Ok(ReadOutcome::Hit)));
    assert!(matches!(
        got[3],
        Ok(ReadOutcome::Miss(MissReason::NotFound))
    ));
    // Bounce mode: pages that missed are untouched.
    let after = snapshot(&pool);
    for p in [6u64, 8, 9] {
        for s in pool.geometry().page_spans(p).unwrap() {
            let r = s.offset as usize..(s.offset + s.len) as usize;
            assert_eq!(before[r.clone()], after[r]);
        }
    }
    assert_eq!(cache.batch_exists(&ks).await.unwrap(), 1);
    assert_eq!(cache.batch_exists(&[]).await.unwrap(), 0);
    let stats = cache.stats();
    assert_eq!((stats.pages_hit, stats.pages_not_found), (2, 3));
}

#[tokio::test]
async fn exists_is_the_longest_prefix() {
    let backend = Arc::new(MemoryBackend::new());
    let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    cache.register_pool(pool).unwrap();
    let ks = keys("e", 3);
    cache
        .batch_set(&[ks[0].clone(), ks[2].clone()], HostSlots::Pages(&[0, 2]))
        .await
        .unwrap();
    assert_eq!(cache.batch_exists(&ks).await.unwrap(), 1);
    assert_eq!(cache.batch_exists(&ks[1..]).await.unwrap(), 0);
    let before = backend.object_count();
    cache
        .batch_set(&ks[1..2], HostSlots::Pages(&[1]))
        .await
        .unwrap();
    assert_eq!(cache.batch_exists(&ks).await.unwrap(), 3);
    for n in 0..=3 {
        assert_eq!(cache.batch_exists(&ks[..n]).await.unwrap(), n);
    }
    assert_eq!(backend.object_count(), before + 1, "exists creates nothing");
    assert!(cache.exists(&ks[2]).await.unwrap());
    cache.batch_remove(&ks[1..2]).await.unwrap();
    assert_eq!(cache.batch_exists(&ks).await.unwrap(), 1);
}

#[tokio::test]
async fn corrupt_truncated_and_foreign_objects_read_as_misses() {
    for align in [1u64, 4096] {
        for page_tokens in [16u64, 3] {
            let backend = Arc::new(MemoryBackend::with_alignment(align));
            let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
            let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, page_tokens)).unwrap());
            let mode = cache.register_pool(pool.clone()).unwrap().mode;
            let ks = keys("c", 4);
            for p in 0..4 {
                fill(&pool, p, p as u8);
            }
            cache
                .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
                .await
                .unwrap();
            let name = |i: usize| cache.object_names(&ks[i]).unwrap()[0].as_str().to_string();
            // 0: bit flip in the payload; 1: truncated; 2: another key's object; 3: header flip.
            let mut flipped = backend.raw_object(&name(0)).unwrap();
            let last = flipped.len() - (flipped.len() - 4096) / 2;
            flipped[last] ^= 0x10;
            backend.put_raw_object(&name(0), flipped);
            let full = backend.raw_object(&name(1)).unwrap();
            backend.put_raw_object(&name(1), full[..full.len() - 4096].to_vec());
            backend.put_raw_object(&name(2), backend.raw_object(&name(3)).unwrap());
            let mut header = backend.raw_object(&name(3)).unwrap();
            header[20] ^= 1;
            backend.put_raw_object(&name(3), header);
            let got = cache
                .batch_get(&ks, HostSlots::Pages(&[4, 5, 6, 7]))
                .await
                .unwrap();
            let ctx = format!("align {align} tokens {page_tokens} {mode}");
            assert_eq!(
                got[0].as_ref().unwrap(),
                &ReadOutcome::Miss(MissReason::ChecksumMismatch),
                "{ctx}"
            );
            assert!(
                matches!(
                    got[1],
                    Ok(ReadOutcome::Miss(MissReason::SizeMismatch { .. }))
                ),
                "{ctx}"
            );
            assert_eq!(
                got[2].as_ref().unwrap(),
                &ReadOutcome::Miss(MissReason::KeyMismatch),
                "{ctx}"
            );
            assert!(
                matches!(got[3], Ok(ReadOutcome::Miss(MissReason::BadHeader { .. }))),
                "{ctx}"
            );
            assert_eq!(cache.stats().pages_invalid, 4, "{ctx}");
        }
    }
}

#[tokio::test]
async fn namespaces_isolate_models_ranks_and_layouts() {
    let backend = Arc::new(MemoryBackend::new());
    let writer = connector(backend.clone(), &[], StorageIdentity::single("m"));
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    writer.register_pool(pool.clone()).unwrap();
    let ks = keys("n", 1);
    fill(&pool, 0, 9);
    writer.batch_set(&ks, HostSlots::Pages(&[0])).await.unwrap();
    let tp1 = StorageIdentity {
        tp_rank: 1,
        tp_size: 2,
        ..StorageIdentity::single("m")
    };
    for (identity, geometry) in [
        (StorageIdentity::single("other"), mha(Layout::PageFirst, 16)),
        (tp1, mha(Layout::PageFirst, 16)),
        (
            StorageIdentity::single("m"),
            mha(Layout::PageFirstDirect, 16),
        ),
    ] {
        let reader = connector(backend.clone(), &[], identity);
        reader
            .register_pool(Arc::new(MmapPool::new(geometry).unwrap()))
            .unwrap();
        assert_eq!(reader.batch_exists(&ks).await.unwrap(), 0);
        let got = reader.batch_get(&ks, HostSlots::Pages(&[1])).await.unwrap();
        assert!(matches!(
            got[0],
            Ok(ReadOutcome::Miss(MissReason::NotFound))
        ));
    }
    // An object copied under another namespace's name is caught by its header.
    let reader = connector(backend.clone(), &[], StorageIdentity::single("other"));
    reader
        .register_pool(Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap()))
        .unwrap();
    let foreign = backend
        .raw_object(writer.object_names(&ks[0]).unwrap()[0].as_str())
        .unwrap();
    backend.put_raw_object(reader.object_names(&ks[0]).unwrap()[0].as_str(), foreign);
    let got = reader.batch_get(&ks, HostSlots::Pages(&[1])).await.unwrap();
    assert_eq!(
        got[0].as_ref().unwrap(),
        &ReadOutcome::Miss(MissReason::ForeignNamespace)
    );
}

#[tokio::test]
async fn mla_non_writer_ranks_skip_truthfully_and_read_rank_zero_pages() {
    let backend = Arc::new(MemoryBackend::new());
    let rank = |r: u32, size: u32| StorageIdentity {
        tp_rank: r,
        tp_size: size,
        ..StorageIdentity::single("ds")
    };
    let r2 = connector(backend.clone(), &[], rank(2, 4));
    let pool2 = Arc::new(MmapPool::new(mla(Layout::PageFirst, 16)).unwrap());
    assert!(!r2.register_pool(pool2.clone()).unwrap().writer);
    let ks = keys("mla", 2);
    let set = r2.batch_set(&ks, HostSlots::Pages(&[0, 1])).await.unwrap();
    assert!(
        set.iter()
            .all(|r| matches!(r, Ok(SetOutcome::SkippedNotWriter)))
    );
    assert_eq!(backend.object_count(), 0);
    let r0 = connector(backend.clone(), &[], rank(0, 4));
    let pool0 = Arc::new(MmapPool::new(mla(Layout::PageFirst, 16)).unwrap());
    r0.register_pool(pool0.clone()).unwrap();
    let data = fill(&pool0, 0, 42);
    r0.batch_set(&ks[..1], HostSlots::Pages(&[0]))
        .await
        .unwrap();
    let got = r2
        .batch_get(&ks[..1], HostSlots::Pages(&[3]))
        .await
        .unwrap();
    assert!(matches!(got[0], Ok(ReadOutcome::Hit)));
    assert_eq!(page_bytes(&pool2, 3), data);
    let r08 = connector(backend, &[], rank(0, 8));
    r08.register_pool(Arc::new(MmapPool::new(mla(Layout::PageFirst, 16)).unwrap()))
        .unwrap();
    assert_eq!(r08.batch_exists(&ks[..1]).await.unwrap(), 1);
}

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

#[tokio::test]
async fn batches_larger_than_staging_are_chunked() {
    for page_tokens in [3u64, 16] {
        let backend = Arc::new(MemoryBackend::with_alignment(4096));
        let config = ConfigLoader::new().load().unwrap();
        let options = HiCacheOptions::new(StorageIdentity::single("m"))
            .with_max_slots_per_chunk(5)
            .with_staging_chunk_bytes(1 << 20);
        let cache = HiCache::with_backend(backend, config, options).unwrap();
        let geometry = mha(Layout::PageFirst, page_tokens).with_pages(300).unwrap();
        let pool = Arc::new(MmapPool::new(geometry).unwrap());
        cache.register_pool(pool.clone()).unwrap();
        let ks = keys("big", 150);
        let src: Vec<u64> = (0..150).collect();
        let dst: Vec<u64> = (150..300).collect();
        let data: Vec<Vec<u8>> = src.iter().map(|p| fill(&pool, *p, *p as u8)).collect();
        let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await.unwrap();
        assert_eq!(set.len(), 150);
        assert!(set.iter().all(|r| r.is_ok()));
        let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await.unwrap();
        assert!(got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))));
        for (i, p) in dst.iter().enumerate() {
            assert_eq!(page_bytes(&pool, *p), data[i]);
        }
        assert_eq!(cache.batch_exists(&ks).await.unwrap(), 150);
    }
}

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

#[tokio::test]
async fn sglang_naming_and_raw_format_match_sglang_objects() {
    let backend = Arc::new(MemoryBackend::new());
    let identity = StorageIdentity {
        tp_rank: 0,
        tp_size: 2,
        ..StorageIdentity::single("Qwen/Qwen3-8B")
    };
    let cache = connector(
        backend.clone(),
        &[("naming", "sglang"), ("page_format", "raw")],
        identity,
    );
    let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 16)).unwrap());
    let report = cache.register_pool(pool.clone()).unwrap();
    assert_eq!(
        (report.mode, report.objects_per_page),
        (TransferMode::ZeroCopy, 2)
    );
    let key = PageKey::new("H").unwrap();
    let flat = fill(&pool, 0, 3);
    cache
        .batch_set(std::slice::from_ref(&key), HostSlots::Pages(&[0]))
        .await
        .unwrap();
    assert_eq!(
        backend.object_names(),
        ["H_Qwen-Qwen3-8B_0_2_k", "H_Qwen-Qwen3-8B_0_2_v"]
    );
    let half = flat.len() / 2;
    assert_eq!(
        backend.raw_object("H_Qwen-Qwen3-8B_0_2_k").unwrap(),
        flat[..half]
    );
    assert_eq!(
        backend.raw_object("H_Qwen-Qwen3-8B_0_2_v").unwrap(),
        flat[half..]
    );
    // A page whose V object is missing does not exist.
    backend.put_raw_object("H2_Qwen-Qwen3-8B_0_2_k", flat[..half].to_vec());
    let k2 = PageKey::new("H2").unwrap();
    assert_eq!(cache.batch_exists(&[key.clone(), k2]).await.unwrap(), 1);
    let got = cache
        .batch_get(std::slice::from_ref(&key), HostSlots::Pages(&[5]))
        .await
        .unwrap();
    assert!(matches!(got[0], Ok(ReadOutcome::Hit)));
    assert_eq!(page_bytes(&pool, 5), flat);
}

#[tokio::test]
async fn enveloped_objects_are_identical_across_modes() {
    // The same page written zero-copy and through bounce produces the same header fields and
    // payload; only the header's padding follows the backend's alignment.
    // Spans of 2880 bytes: zero-copy where anything goes, bounce under 4096-byte alignment.
    let g = PoolGeometry::new(
        AttentionKind::Mha {
            kv_heads: 2,
            head_dim: 60,
        },
        4,
        Dtype::Bf16,
        3,
        Layout::PageFirst,
        4,
    )
    .unwrap();
    let mut objects = Vec::new();
    for (align, mode) in [(1u64, TransferMode::ZeroCopy), (4096, TransferMode::Bounce)] {
        let backend = Arc::new(MemoryBackend::with_alignment(align));
        let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
        let pool = Arc::new(MmapPool::new(g).unwrap());
        assert_eq!(cache.register_pool(pool.clone()).unwrap().mode, mode);
        fill(&pool, 0, 5);
        let ks = keys("same", 1);
        cache.batch_set(&ks, HostSlots::Pages(&[0])).await.unwrap();
        objects.push(
            backend
                .raw_object(cache.object_names(&ks[0]).unwrap()[0].as_str())
                .unwrap(),
        );
    }
    let parts: Vec<(Header, &[u8])> = objects
        .iter()
        .map(|o| {
            let h = Header::decode(o).unwrap();
            let end = h.object_len() as usize;
            assert!(end <= o.len());
            (h, &o[h.header_len as usize..end])
        })
        .collect();
    let (mut zero_copy, bounce) = (parts[0].0, parts[1].0);
    // A page object is not an anchor marker, whatever the mode.
    assert_eq!(
        zero_copy.flags & hicache_core::raw::envelope::FLAG_ANCHOR,
        0
    );
    zero_copy.header_len = bounce.header_len;
    assert_eq!(zero_copy, bounce);
    assert!(parts[0].1 == parts[1].1, "payloads differ between modes");
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
    let (mode, why) = decide_mode(&g, Some(0), &cap, NamingScheme::Hicache);
    assert_eq!(mode, TransferMode::ZeroCopy, "{why}");
    cap.max_segments -= 1;
    assert_eq!(
        decide_mode(&g, Some(0), &cap, NamingScheme::Hicache).0,
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

/// The reference backend, counting what is registered with it (and refusing every
/// registration when `refuse` is set).
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryBackend,
    registered: std::sync::atomic::AtomicI64,
    refuse: bool,
    /// The most objects one write, read or exists call carried.
    largest_call: std::sync::atomic::AtomicUsize,
    /// How long each `exists` call takes.
    exists_delay: std::time::Duration,
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
