//! POSIX on real filesystems: ext4 (the system temp dir here) with and without O_DIRECT, and
//! tmpfs (`/dev/shm`) when present.

use std::path::{Path, PathBuf};

use hicache_core::{
    AttentionKind, ConfigLoader, Dtype, HiCache, HiCacheOptions, HostPool, Layout, MmapPool,
    PageKey, PoolGeometry, StorageIdentity, gather_page, scatter_page,
};
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig};

mod cleaner;
mod data_path;
mod integrity;
mod listing;
mod plugin;
mod safety;
mod transfers;

/// Roots to test on: (label, parent dir). ext4 is the system temp dir on this project's
/// machines; `/dev/shm` is tmpfs.
fn parents() -> Vec<(&'static str, PathBuf)> {
    let mut v = vec![("tmp", std::env::temp_dir())];
    if Path::new("/dev/shm").is_dir() {
        v.push(("shm", PathBuf::from("/dev/shm")));
    }
    v
}

const ENGINES: [EngineChoice; 2] = [EngineChoice::Threads, EngineChoice::Uring];

fn engine_name(e: EngineChoice) -> &'static str {
    match e {
        EngineChoice::Threads => "threads",
        EngineChoice::Uring => "uring",
        EngineChoice::Auto => "auto",
    }
}

fn backend(dir: &Path, direct: bool) -> PosixBackend {
    backend_with(dir, direct, EngineChoice::Auto)
}

fn backend_with(dir: &Path, direct: bool, engine: EngineChoice) -> PosixBackend {
    let cfg = PosixConfig {
        dirs: vec![dir.to_path_buf()],
        direct_io: direct,
        engine,
        threads: 4,
        queue_depth: 256,
        sync: hicache_posix::SyncMode::None,
        spare_bytes: 1 << 30,
        cleaner: None,
        file_mode: 0o600,
        dir_mode: 0o700,
    };
    PosixBackend::new(&cfg).unwrap()
}

/// Writes the first 4096 bytes of `region` as object `key`; panics on failure.
async fn write_4k(
    b: &PosixBackend,
    region: hicache_core::raw::RegionId,
    key: &hicache_core::raw::ObjectKey,
) {
    use hicache_core::raw::{Slice, StorageBackend, WriteItem};
    let segments = [Slice::new(region, 0, 4096)];
    let w = b
        .write(&[WriteItem {
            key,
            segments: &segments,
        }])
        .await;
    assert!(w[0].is_ok(), "{}: {w:?}", b.engine_description());
}

fn connector(dirs: &[PathBuf], direct: bool, model: &str) -> HiCache {
    connector_with(dirs, direct, model, EngineChoice::Auto)
}

fn connector_with(dirs: &[PathBuf], direct: bool, model: &str, engine: EngineChoice) -> HiCache {
    let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let config = ConfigLoader::new()
        .set("storage_dir", list.join(","))
        .set("use_direct_io", direct)
        .set("plugin", "posix")
        .set("plugin.posix.engine", engine_name(engine))
        .load()
        .unwrap();
    let registry =
        hicache_core::PluginRegistry::from_descriptors([&hicache_posix::DESCRIPTOR]).unwrap();
    HiCache::open(
        &registry,
        config,
        HiCacheOptions::new(StorageIdentity::single(model)),
    )
    .unwrap()
}

fn geometry(layout: Layout, page_tokens: u64, attention: AttentionKind) -> PoolGeometry {
    PoolGeometry::new(attention, 4, Dtype::Bf16, page_tokens, layout, 16).unwrap()
}

fn mha() -> AttentionKind {
    AttentionKind::Mha {
        kv_heads: 2,
        head_dim: 64,
    }
}

fn keys(prefix: &str, n: usize) -> Vec<PageKey> {
    (0..n)
        .map(|i| PageKey::new(format!("{prefix}{i:062}")).unwrap())
        .collect()
}

fn fill(pool: &MmapPool, page: u64, seed: u8) -> Vec<u8> {
    let flat: Vec<u8> = (0..pool.geometry().page_bytes())
        .map(|i| {
            (i as u8)
                .wrapping_mul(13)
                .wrapping_add(seed)
                .wrapping_add((i >> 9) as u8)
        })
        .collect();
    scatter_page(pool, page, &flat).unwrap();
    flat
}

fn page(pool: &MmapPool, p: u64) -> Vec<u8> {
    let mut v = vec![0; pool.geometry().page_bytes() as usize];
    gather_page(pool, p, &mut v).unwrap();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
