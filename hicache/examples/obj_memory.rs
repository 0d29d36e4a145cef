//! The OBJ plugin on an in-process store (`memory://`): the same calls an engine makes
//! against S3, with nothing to run beside it.
//!
//! `cargo run -p hicache --features obj --example obj_memory` (CI runs it).

use std::sync::Arc;

use hicache::{
    AttentionKind, Dtype, HiCacheOptions, HostSlots, Layout, MmapPool, PageKey, PoolGeometry,
    ReadOutcome, StorageIdentity, scatter_page,
};

#[tokio::main]
async fn main() -> hicache::Result<()> {
    let config = hicache::config()
        .extra_config(r#"{"plugin": {"obj": {"active": true, "url": "memory://"}}}"#)
        .load()?;
    let cache = hicache::open(config, HiCacheOptions::new(StorageIdentity::single("m")))?;
    let geometry = PoolGeometry::builder(AttentionKind::Mla { kv_cache_dim: 576 })
        .layers(61)
        .page_tokens(16)
        .dtype(Dtype::Bf16)
        .layout(Layout::PageFirst)
        .pages(8)
        .build()?;
    let pool = Arc::new(MmapPool::new(geometry)?);
    let report = cache.register_pool(pool.clone())?;
    let keys: Vec<PageKey> = (0..4)
        .map(|i| PageKey::new(format!("page-{i}")))
        .collect::<hicache::Result<_>>()?;
    for p in 0..4 {
        scatter_page(
            pool.as_ref(),
            p,
            &vec![p as u8 + 7; geometry.page_bytes() as usize],
        )?;
    }
    for r in cache
        .batch_set(&keys, HostSlots::Pages(&[0, 1, 2, 3]))
        .await?
    {
        r?;
    }
    assert_eq!(cache.batch_exists(&keys).await?, 4);
    for r in cache
        .batch_get(&keys, HostSlots::Pages(&[4, 5, 6, 7]))
        .await?
    {
        assert!(matches!(r?, ReadOutcome::Hit));
    }
    println!(
        "OBJ {}: 4 pages written and read back ({report})",
        cache.backend_info().location
    );
    Ok(())
}
