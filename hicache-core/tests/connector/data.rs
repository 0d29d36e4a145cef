//! The data path: round trips in every layout and mode, mode decisions, per-page misses,
//! existence prefixes, chunking, and objects identical across modes.

use std::sync::Arc;

use crate::{PAGES, connector, fill, keys, mha, mla, page_bytes, snapshot, unaligned_spans};
use hicache_core::raw::Capability;
use hicache_core::raw::envelope::Header;
use hicache_core::{
    AnchorPool, ConfigLoader, HiCache, HiCacheOptions, HostPool, HostSlots, Layout, MemoryBackend,
    MissReason, MmapPool, ModeRule, ReadOutcome, SetOutcome, StorageIdentity, TransferMode,
    decide_mode,
};

#[tokio::test]
async fn round_trip_every_layout_and_mode_with_guards() {
    // (alignment of the fake storage, page tokens): 1 → zero-copy without direct I/O;
    // 4096 with 16-token pages → aligned zero-copy; 4096 with 3-token pages → bounce.
    for (align, page_tokens, anchor) in [
        (1, 16, false),
        (4096, 16, false),
        (4096, 3, false),
        (4096, 16, true),
        // A 512-byte store: SGLang's raw markers are still 4096 bytes under direct I/O.
        (512, 16, true),
        (1, 16, true),
    ] {
        for geometry in Layout::ALL.into_iter().map(|l| mha(l, page_tokens)).chain(
            [
                Layout::LayerFirst,
                Layout::PageFirst,
                Layout::PageFirstDirect,
            ]
            .map(|l| mla(l, page_tokens)),
        ) {
            for (naming, format) in [
                ("hicache", "envelope"),
                ("sglang", "envelope"),
                ("sglang", "raw"),
            ] {
                let backend = Arc::new(MemoryBackend::with_alignment(align));
                let cache = connector(
                    backend.clone(),
                    &[("naming", naming), ("page_format", format)],
                    StorageIdentity::single("m"),
                );
                let ctx = format!(
                    "align {align} tokens {page_tokens} {} {:?} {naming} {format} anchor {anchor}",
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
                    let name = cache.object_names(&ks[0]).unwrap()[0].clone();
                    if format == "raw" {
                        // SGLang's marker: 1 byte of 0x01, or 4096 bytes under direct I/O.
                        let marker = backend.raw_object(name.as_str()).unwrap();
                        let len = if align > 1 { align.max(4096) } else { 1 };
                        assert_eq!(marker, vec![1u8; len as usize], "{ctx}");
                    }
                    if naming == "hicache" {
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
                // SGLang naming: SGLang's own rule (its two page layouts, 4096 under direct I/O).
                let expect_zero_copy = if naming == "sglang" {
                    let sglang_align = if align > 1 { align.max(4096) } else { 1 };
                    matches!(
                        geometry.layout(),
                        Layout::PageFirst | Layout::PageFirstDirect
                    ) && geometry.spans_aligned(pool.base() as u64, sglang_align)
                } else {
                    geometry.spans_aligned(pool.base() as u64, align)
                };
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

/// SGLang's rule where the capability shows whether direct I/O was asked for.
fn sglang(capability: &Capability) -> ModeRule {
    ModeRule::Sglang {
        page_aligned: capability.direct_io,
    }
}

/// A FILE store without O_DIRECT while the config asks for direct I/O (tmpfs before Linux
/// 6.6): SGLang keeps its 4096-byte rule there, so SGLang naming keeps it too — a stride of
/// 3 tokens (3 KiB) bounces as one flat page, and raw anchor markers are 4096 bytes.
#[tokio::test]
async fn sglang_naming_keeps_its_rule_on_file_stores_without_o_direct() {
    for (direct, want, marker) in [
        ("true", TransferMode::Bounce, 4096),
        ("false", TransferMode::ZeroCopy, 1),
    ] {
        let backend = Arc::new(MemoryBackend::new().as_file_store());
        let settings = [
            ("naming", "sglang"),
            ("page_format", "raw"),
            ("use_direct_io", direct),
        ];
        let cache = connector(backend.clone(), &settings, StorageIdentity::single("m"));
        let pool = Arc::new(MmapPool::new(mha(Layout::PageFirst, 3)).unwrap());
        let report = cache.register_pool(pool.clone()).unwrap();
        assert_eq!(
            report.mode, want,
            "use_direct_io {direct}: {}",
            report.reason
        );
        let ks = keys("f", 2);
        let written = fill(&pool, 0, 3);
        let set = cache
            .batch_set(&ks[..1], HostSlots::Pages(&[0]))
            .await
            .unwrap();
        assert!(matches!(set[0], Ok(SetOutcome::Written)), "{set:?}");
        let names = cache.object_names(&ks[0]).unwrap();
        let parts = if want == TransferMode::ZeroCopy { 2 } else { 1 };
        assert_eq!(names.len(), parts, "{names:?}");
        let got = cache
            .batch_get(&ks[..1], HostSlots::Pages(&[4]))
            .await
            .unwrap();
        assert!(matches!(got[0], Ok(ReadOutcome::Hit)), "{got:?}");
        assert_eq!(page_bytes(&pool, 4), written);

        let cache = connector(backend.clone(), &settings, StorageIdentity::single("m"));
        let anchor = AnchorPool::new(mha(Layout::PageFirst, 3)).unwrap();
        cache.register_pool(Arc::new(anchor)).unwrap();
        let set = cache
            .batch_set(&ks[1..], HostSlots::Pages(&[0]))
            .await
            .unwrap();
        assert!(matches!(set[0], Ok(SetOutcome::Written)), "{set:?}");
        let name = cache.object_names(&ks[1]).unwrap()[0].clone();
        assert_eq!(
            backend.raw_object(name.as_str()).unwrap(),
            vec![1u8; marker]
        );
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
        decide_mode(&g, None, &aligned, ModeRule::Hicache).0,
        TransferMode::Anchor
    );
    assert_eq!(
        decide_mode(&g, Some(0), &aligned, ModeRule::Hicache).0,
        TransferMode::ZeroCopy
    );
    let (mode, why) = decide_mode(&g, Some(512), &aligned, ModeRule::Hicache);
    assert_eq!(mode, TransferMode::Bounce);
    assert!(why.contains("4096-byte alignment"), "{why}");
    // The same base is fine on a storage that reports 512-byte alignment (ext4 here).
    let mut ext4 = aligned;
    ext4.io_alignment = 512;
    assert_eq!(
        decide_mode(&g, Some(512), &ext4, ModeRule::Hicache).0,
        TransferMode::ZeroCopy
    );
    // Without direct I/O alignment does not matter.
    let mut buffered = aligned;
    buffered.direct_io = false;
    assert_eq!(
        decide_mode(&g, Some(3), &buffered, ModeRule::Hicache).0,
        TransferMode::ZeroCopy
    );
    // layer_first: zero-copy when aligned, bounce under SGLang naming or too many spans.
    let lf = mha(Layout::LayerFirst, 16);
    assert_eq!(
        decide_mode(&lf, Some(0), &aligned, ModeRule::Hicache).0,
        TransferMode::ZeroCopy
    );
    assert_eq!(
        decide_mode(&lf, Some(0), &aligned, sglang(&aligned)).0,
        TransferMode::Bounce
    );
    // SGLang naming decides as SGLang does: page_head stays a flat page, and under direct
    // I/O a base 512-aligned on a 512-byte filesystem is not enough (SGLang asks 4096).
    let ph = mha(Layout::PageHead, 16);
    assert_eq!(
        decide_mode(&ph, Some(0), &aligned, ModeRule::Hicache).0,
        TransferMode::ZeroCopy
    );
    let (mode, why) = decide_mode(&ph, Some(0), &aligned, sglang(&aligned));
    assert_eq!(mode, TransferMode::Bounce);
    assert!(why.contains("page_head"), "{why}");
    assert_eq!(
        decide_mode(&g, Some(512), &ext4, sglang(&ext4)).0,
        TransferMode::Bounce
    );
    assert_eq!(
        decide_mode(&g, Some(4096), &ext4, sglang(&ext4)).0,
        TransferMode::ZeroCopy
    );
    assert_eq!(
        decide_mode(&g, Some(3), &buffered, sglang(&buffered)).0,
        TransferMode::ZeroCopy
    );
    // Direct I/O asked for on a filesystem without O_DIRECT (tmpfs): SGLang keeps its rule,
    // so SGLang naming does too, or the two would name the same page differently.
    let (mode, why) = decide_mode(
        &g,
        Some(3),
        &buffered,
        ModeRule::Sglang { page_aligned: true },
    );
    assert_eq!(mode, TransferMode::Bounce);
    assert!(why.contains("SGLang's direct-I/O rule needs 4096"), "{why}");
    let mut few = aligned;
    few.max_segments = 4;
    let (mode, why) = decide_mode(&lf, Some(0), &few, ModeRule::Hicache);
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

#[tokio::test]
async fn enveloped_objects_are_identical_across_modes() {
    // The same page written zero-copy and through bounce produces the same header fields and
    // payload; only the header's padding follows the backend's alignment.
    let g = unaligned_spans();
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
