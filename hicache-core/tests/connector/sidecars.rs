//! Sidecar pools' lifecycle: clearing, replacing and unregistering them, and the
//! registrations the connector refuses.

use std::sync::Arc;

use hicache_core::raw::AlignedBuf;
use hicache_core::{
    BufferLayout, Error, HostSlots, Layout, MemoryBackend, MemoryRegion, MmapPool, PoolId,
    PoolName, PoolTransfer, SetOutcome, SidecarGeometry, SidecarPool, StorageIdentity,
};

use super::{connector, keys, mha};

fn sidecar(name: &str, replicated: bool) -> SidecarPool {
    let g = SidecarGeometry::new(
        4,
        super::PAGES,
        vec![BufferLayout::page_major(4096).unwrap()],
        replicated,
        "test",
    )
    .unwrap();
    let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096 * 12, 4096).unwrap());
    SidecarPool::new(PoolName::new(name).unwrap(), g, vec![region]).unwrap()
}

fn put<'a>(pool: &'a PoolName, keys: &'a [hicache_core::PageKey]) -> PoolTransfer<'a> {
    PoolTransfer {
        pool: PoolId::Sidecar(pool),
        keys,
        slots: HostSlots::Pages(&[0, 1, 2][..keys.len()]),
    }
}

/// `clear` takes the sidecars' pages with the KV pool's; `unregister_sidecar` makes later
/// calls naming the pool fail; a re-registered sidecar of the same geometry finds its pages.
#[tokio::test]
async fn sidecars_are_cleared_replaced_and_unregistered() {
    let backend = Arc::new(MemoryBackend::new());
    let cache = connector(backend.clone(), &[], StorageIdentity::single("m"));
    cache
        .register_pool(Arc::new(MmapPool::new(mha(Layout::PageFirst, 4)).unwrap()))
        .unwrap();
    let mamba = PoolName::new("mamba").unwrap();
    cache.register_sidecar(sidecar("mamba", false)).unwrap();
    assert_eq!(cache.sidecar_names(), vec![mamba.clone()]);
    let ks = keys("sc", 3);
    let set = cache.batch_set_v2(&[put(&mamba, &ks)]).await.unwrap();
    assert!(set[0].iter().all(|r| matches!(r, Ok(SetOutcome::Written))));
    // Replacing the sidecar with the same geometry keeps its pages reachable.
    cache.register_sidecar(sidecar("mamba", false)).unwrap();
    let query = [hicache_core::PoolQuery {
        pool: &mamba,
        policy: hicache_core::HitPolicy::AllPages,
    }];
    let kv = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
        .await
        .unwrap();
    assert!(kv.iter().all(|r| r.is_ok()));
    assert_eq!(cache.batch_exists_v2(&ks, &query).await.unwrap().hit, 3);
    assert_eq!(
        cache.clear().await.unwrap(),
        6,
        "3 KV pages and 3 sidecar pages"
    );
    assert_eq!(backend.object_count(), 0);
    assert!(cache.unregister_sidecar(&mamba).await);
    assert!(!cache.unregister_sidecar(&mamba).await);
    let e = cache.batch_set_v2(&[put(&mamba, &ks)]).await.unwrap_err();
    assert!(e.to_string().contains("mamba"), "{e}");
    // Unregistering the KV pool lets go of the sidecars too.
    cache.register_sidecar(sidecar("mamba", false)).unwrap();
    cache.unregister_pool().await;
    assert!(cache.sidecar_names().is_empty());
}

/// Refused registrations: a replicated Mamba pool under SGLang naming (SGLang names Mamba
/// objects per TP rank), a pool named `kv`, and buffers that do not match the geometry.
#[test]
fn bad_sidecars_are_refused() {
    let backend = Arc::new(MemoryBackend::new());
    let sglang = connector(
        backend,
        &[("naming", "sglang")],
        StorageIdentity::single("m"),
    );
    let e = sglang.register_sidecar(sidecar("mamba", true)).unwrap_err();
    assert!(e.to_string().contains("rank_replicated = false"), "{e}");
    assert!(sglang.register_sidecar(sidecar("indexer", true)).is_ok());
    assert!(matches!(
        PoolName::new("kv"),
        Err(Error::InvalidPool { .. })
    ));
    let g = SidecarGeometry::new(
        4,
        12,
        vec![BufferLayout::page_major(4096).unwrap()],
        false,
        "t",
    )
    .unwrap();
    let small = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096 * 11, 4096).unwrap());
    let e = SidecarPool::new(PoolName::new("swa").unwrap(), g.clone(), vec![small]).unwrap_err();
    assert!(e.to_string().contains("needs 49152"), "{e}");
    let e = SidecarPool::new(PoolName::new("swa").unwrap(), g, vec![]).unwrap_err();
    assert!(e.to_string().contains("1 buffers but 0"), "{e}");
}
