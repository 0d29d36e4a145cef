//! What names and frames an object: namespaces, MLA sharing, SGLang naming, and corrupt or
//! foreign objects read as misses.

use std::sync::Arc;

use crate::{connector, fill, keys, mha, mla, page_bytes};
use hicache_core::{
    HostSlots, Layout, MemoryBackend, MissReason, MmapPool, PageKey, ReadOutcome, SetOutcome,
    StorageIdentity, TransferMode,
};

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
