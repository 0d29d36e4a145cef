//! The blocking API from three threads at once, as SGLang's storage threads call it: each
//! thread writes, checks and reads back its own pages through one shared `BlockingHiCache`.
//!
//! `cargo run -p hicache --example blocking_threads` (CI runs it).

use std::sync::Arc;

use hicache::{
    AttentionKind, BlockingHiCache, Dtype, HiCacheOptions, HostPool, HostSlots, Layout, MmapPool,
    PageKey, PoolGeometry, ReadOutcome, StorageIdentity, gather_page, scatter_page,
};

const THREADS: u64 = 3;
const PAGES_PER_THREAD: u64 = 16;

fn main() -> hicache::Result<()> {
    let dir = tempfile::tempdir()
        .map_err(|e| hicache::Error::io(hicache::Component::Tool("example"), "tempdir", None, e))?;
    let config = hicache::config()
        .set("storage_dir", dir.path().display().to_string())
        .load()?;
    let cache = Arc::new(BlockingHiCache::new(hicache::HiCache::open(
        &hicache::registry()?,
        config,
        HiCacheOptions::new(StorageIdentity::single("qwen3-8b")),
    )?)?);
    let geometry = PoolGeometry::builder(AttentionKind::Mha {
        kv_heads: 8,
        head_dim: 128,
    })
    .layers(36)
    .page_tokens(8)
    .dtype(Dtype::Bf16)
    .layout(Layout::PageFirst)
    // Each thread writes from its own pages and reads into another range of its own.
    .pages(2 * THREADS * PAGES_PER_THREAD)
    .build()?;
    let pool = Arc::new(MmapPool::new(geometry)?);
    cache.register_pool(pool.clone())?;

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, pool) = (cache.clone(), pool.clone());
            std::thread::spawn(move || -> hicache::Result<()> {
                let first = t * PAGES_PER_THREAD;
                let src: Vec<u64> = (first..first + PAGES_PER_THREAD).collect();
                let dst: Vec<u64> = src.iter().map(|p| p + THREADS * PAGES_PER_THREAD).collect();
                let keys: Vec<PageKey> = src
                    .iter()
                    .map(|p| PageKey::new(format!("thread-{t}-page-{p}")))
                    .collect::<hicache::Result<_>>()?;
                let len = pool.geometry().page_bytes() as usize;
                for &p in &src {
                    scatter_page(pool.as_ref(), p, &vec![p as u8 + 1; len])?;
                }
                for r in cache.batch_set(&keys, HostSlots::Pages(&src))? {
                    r?;
                }
                assert_eq!(cache.batch_exists(&keys)?, keys.len());
                for r in cache.batch_get(&keys, HostSlots::Pages(&dst))? {
                    assert!(matches!(r?, ReadOutcome::Hit));
                }
                let mut page = vec![0u8; len];
                for (s, d) in src.iter().zip(&dst) {
                    gather_page(pool.as_ref(), *d, &mut page)?;
                    assert!(page.iter().all(|b| *b == *s as u8 + 1), "page {d}");
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker thread")?;
    }
    let stats = cache.stats();
    assert_eq!(stats.pages_written, THREADS * PAGES_PER_THREAD);
    cache.close();
    println!(
        "{THREADS} threads wrote, found and read back {PAGES_PER_THREAD} pages each: {stats:?}"
    );
    Ok(())
}
