//! Pools, keys and page contents that make byte-exact checks easy.

use std::sync::Arc;

use hicache_core::{
    AttentionKind, Dtype, HostPool, Layout, MmapPool, PageKey, PoolGeometry, gather_page,
    scatter_page,
};

/// A small MHA geometry (2 heads × 64, 4 layers, bf16): 4 KiB per layer per K/V at 16 tokens.
pub fn mha(layout: Layout, page_tokens: u64, pages: u64) -> PoolGeometry {
    PoolGeometry::new(
        AttentionKind::Mha {
            kv_heads: 2,
            head_dim: 64,
        },
        4,
        Dtype::Bf16,
        page_tokens,
        layout,
        pages,
    )
    .expect("valid test geometry")
}

/// An MHA geometry whose spans (2880 bytes: 2 heads of 60, 3 tokens, bf16) no direct-I/O
/// alignment divides, so an aligned backend moves it through bounce slots.
pub fn unaligned_mha(layout: Layout, pages: u64) -> PoolGeometry {
    PoolGeometry::new(
        AttentionKind::Mha {
            kv_heads: 2,
            head_dim: 60,
        },
        4,
        Dtype::Bf16,
        3,
        layout,
        pages,
    )
    .expect("valid test geometry")
}

/// A small MLA geometry (latent 64, 4 layers, bf16).
pub fn mla(layout: Layout, page_tokens: u64, pages: u64) -> PoolGeometry {
    PoolGeometry::new(
        AttentionKind::Mla { kv_cache_dim: 64 },
        4,
        Dtype::Bf16,
        page_tokens,
        layout,
        pages,
    )
    .expect("valid test geometry")
}

/// A fresh, zeroed mmap pool.
pub fn pool(geometry: PoolGeometry) -> Arc<MmapPool> {
    Arc::new(MmapPool::new(geometry).expect("mmap pool"))
}

/// `n` distinct 64-hex-char page keys starting with `prefix` (SGLang's key shape).
pub fn keys(prefix: &str, n: usize) -> Vec<PageKey> {
    (0..n)
        .map(|i| {
            let tail = format!("{i:x}");
            let fill = 64usize.saturating_sub(prefix.len() + tail.len());
            PageKey::new(format!("{prefix}{}{tail}", "0".repeat(fill))).expect("valid key")
        })
        .collect()
}

/// The bytes `fill_page` writes for `seed`: distinct per seed and per position.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Fills host page `page` with `pattern(page_bytes, seed)` and returns the bytes.
pub fn fill_page(pool: &MmapPool, page: u64, seed: u32) -> Vec<u8> {
    let bytes = pattern(pool.geometry().page_bytes() as usize, seed);
    scatter_page(pool, page, &bytes).expect("page in pool");
    bytes
}

/// The flat bytes of host page `page`.
pub fn page_bytes(pool: &MmapPool, page: u64) -> Vec<u8> {
    let mut out = vec![0; pool.geometry().page_bytes() as usize];
    gather_page(pool, page, &mut out).expect("page in pool");
    out
}

/// The whole pool buffer.
pub fn snapshot(pool: &MmapPool) -> Vec<u8> {
    let mut out = vec![0; pool.geometry().pool_bytes() as usize];
    pool.read_bytes(0, &mut out).expect("pool bytes");
    out
}

/// Whether every byte of `page`'s spans is the same in two snapshots.
pub fn page_unchanged(geometry: &PoolGeometry, page: u64, before: &[u8], after: &[u8]) -> bool {
    geometry.page_spans(page).expect("page in pool").all(|s| {
        let r = s.offset as usize..(s.offset + s.len) as usize;
        before[r.clone()] == after[r]
    })
}

/// A filesystem mounted on a fresh temp dir for a test, unmounted on drop (needs root).
///
/// Used to get filesystems with specific behaviour: `ramfs` refuses O_DIRECT, a read-only
/// `tmpfs` refuses writes.
#[derive(Debug)]
pub struct TestMount {
    dir: tempfile::TempDir,
}

impl TestMount {
    /// Mounts `fstype` with `options` (e.g. `"ro,size=1m"`).
    pub fn new(fstype: &str, options: &str) -> std::io::Result<Self> {
        use std::ffi::CString;
        let dir = tempfile::tempdir()?;
        let c =
            |s: &str| CString::new(s).map_err(|_| std::io::Error::other("NUL in mount argument"));
        let target = c(&dir.path().to_string_lossy())?;
        let (ty, opts) = (c(fstype)?, c(options)?);
        // SAFETY: all strings are NUL-terminated and live across the call.
        let rc = unsafe {
            libc::mount(
                ty.as_ptr(),
                target.as_ptr(),
                ty.as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(TestMount { dir })
    }

    /// The mount point.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if let Ok(target) = std::ffi::CString::new(self.dir.path().to_string_lossy().as_bytes()) {
            // SAFETY: NUL-terminated path of our own mount.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
