//! The connector's decisions and data path, against the reference in-memory backend.

use std::sync::Arc;

use hicache_core::{
    AttentionKind, ConfigLoader, Dtype, HiCache, HiCacheOptions, HostPool, Layout, MmapPool,
    PageKey, PoolGeometry, StorageIdentity, gather_page, scatter_page,
};

mod blocking;
mod calls;
mod checked;
mod data;
mod identity;
mod inputs;
mod pins;
mod sealed;
mod sidecars;

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

/// Four pages whose spans are 2880 bytes: zero-copy where anything goes, bounce under
/// 4096-byte alignment.
fn unaligned_spans() -> PoolGeometry {
    PoolGeometry::new(
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
