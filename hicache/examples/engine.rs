//! An inference engine's use of hicache, end to end and async: configuration from a TOML
//! file plus the environment, a Llama-3-8B-shaped `page_first` host pool, then pages
//! written, checked for, read back, verified and removed.
//!
//! `cargo run -p hicache --example engine` (CI runs it). It stores under a temporary dir.

use std::sync::Arc;

use hicache::{
    AttentionKind, Dtype, EnvSnapshot, HiCacheOptions, HostSlots, Layout, MmapPool, PageKey,
    PoolGeometry, ReadOutcome, StorageIdentity, gather_page, scatter_page,
};

const PAGES: u64 = 64;

#[tokio::main]
async fn main() -> hicache::Result<()> {
    let dir = tempfile::tempdir()
        .map_err(|e| hicache::Error::io(hicache::Component::Tool("example"), "tempdir", None, e))?;
    let file = dir.path().join("hicache.toml");
    let storage = dir.path().join("pages");
    std::fs::write(
        &file,
        format!(
            "storage_dir = {:?}\n\n[plugin.posix]\nactive = true\nengine = \"threads\"\n",
            storage.display().to_string()
        ),
    )
    .map_err(|e| {
        hicache::Error::io(
            hicache::Component::Tool("example"),
            "write config",
            Some(file.clone()),
            e,
        )
    })?;
    let config = hicache::config()
        .file(&file)
        .env(EnvSnapshot::from_process())
        .load()?;
    let cache = hicache::open(
        config,
        HiCacheOptions::new(StorageIdentity::single("llama-3-8b")),
    )?;

    // Llama-3-8B: 32 layers, 8 KV heads of 128, bf16; 16 tokens per page.
    let geometry = PoolGeometry::builder(AttentionKind::Mha {
        kv_heads: 8,
        head_dim: 128,
    })
    .layers(32)
    .page_tokens(16)
    .dtype(Dtype::Bf16)
    .layout(Layout::PageFirst)
    .pages(2 * PAGES)
    .build()?;
    let pool = Arc::new(MmapPool::new(geometry)?);
    let report = cache.register_pool(pool.clone())?;
    println!("pool: {geometry}\nmode: {report}");

    let keys: Vec<PageKey> = (0..PAGES)
        .map(|i| PageKey::new(format!("prefix-hash-{i:04}")))
        .collect::<hicache::Result<_>>()?;
    let written: Vec<Vec<u8>> = (0..PAGES)
        .map(|p| {
            let bytes = (0..geometry.page_bytes())
                .map(|i| (i as u8) ^ (p as u8))
                .collect::<Vec<u8>>();
            scatter_page(pool.as_ref(), p, &bytes).map(|()| bytes)
        })
        .collect::<hicache::Result<_>>()?;
    let slots: Vec<u64> = (0..PAGES).collect();
    for r in cache.batch_set(&keys, HostSlots::Pages(&slots)).await? {
        r?;
    }
    let found = cache.batch_exists(&keys).await?;
    assert_eq!(found as u64, PAGES, "every page written is found");

    let read_slots: Vec<u64> = (PAGES..2 * PAGES).collect();
    let got = cache
        .batch_get(&keys, HostSlots::Pages(&read_slots))
        .await?;
    let mut page = vec![0u8; geometry.page_bytes() as usize];
    for (i, outcome) in got.into_iter().enumerate() {
        assert!(matches!(outcome?, ReadOutcome::Hit), "page {i} is a hit");
        gather_page(pool.as_ref(), PAGES + i as u64, &mut page)?;
        assert!(page == written[i], "page {i} reads back as written");
    }
    for r in cache.batch_remove(&keys).await? {
        r?;
    }
    assert_eq!(cache.batch_exists(&keys).await?, 0);
    cache.unregister_pool().await;
    println!(
        "{PAGES} pages of {} written, found, read back, verified and removed; {:?}",
        hicache::ByteSize(geometry.page_bytes()),
        cache.stats()
    );
    Ok(())
}
