//! Host KV pools: geometry, SGLang's four layouts, per-page spans, gather/scatter.
//!
//! Byte orders follow SGLang's host pools exactly (`MHATokenToKVPoolHost` and
//! `MLATokenToKVPoolHost` in its `mem_cache` package), with `S` = tokens in the pool
//! (`pages × page_tokens`), `L` layers, `H` KV heads, `D` head dim, `C` MLA latent dim:
//!
//! | layout | MHA buffer | MLA buffer | a page's object bytes (flat page) |
//! |---|---|---|---|
//! | `layer_first` | `[2][L][S][H][D]` | `[L][S][C]` | `[2][L][ps][H][D]` / `[L][ps][C]` |
//! | `page_first` | `[2][S][L][H][D]` | `[S][L][C]` | `[2][ps][L][H][D]` / `[ps][L][C]` |
//! | `page_first_direct` | `[2][P][L][ps][H][D]` | `[P][L][ps][C]` | `[2][L][ps][H][D]` / `[L][ps][C]` |
//! | `page_head` | `[2][P][H][ps][L][D]` | — | `[2][H][ps][L][D]` |
//!
//! [`PoolGeometry::page_spans`] lists a page's `(offset, len)` spans **in flat-page order**, so
//! an object's bytes are the same whether a page moved zero-copy (spans gathered by the
//! backend) or through a bounce buffer (spans copied by the CPU). For `layer_first` MHA that is
//! all K layers then all V layers (SGLang's `get_page_buffer_meta` interleaves `k_l0, v_l0, …`
//! but its flat page does not; the object follows the flat page).
//!
//!
//! Here: the [`HostPool`] trait and the [`AnchorPool`]; `geometry` holds the layouts'
//! arithmetic, `copy` gather/scatter, `mmap` the [`MmapPool`].

mod copy;
mod geometry;
mod mmap;
mod sidecar;

pub use copy::{gather_page, scatter_page};
pub use geometry::{AttentionKind, Dtype, Layout, PageSpans, PoolGeometry, Span};
pub use mmap::MmapPool;
pub use sidecar::{
    BufferLayout, MAX_POOL_NAME_LEN, MAX_SIDECAR_SPANS, PoolName, SidecarGeometry, SidecarPool,
};

use std::fmt;

use crate::error::Result;
use crate::memory::MemoryRegion;

/// A host buffer of KV pages that hicache moves to and from storage.
pub trait HostPool: Send + Sync + fmt::Debug {
    /// Shape and layout.
    fn geometry(&self) -> &PoolGeometry;

    /// The memory holding the pool's bytes (`pool_bytes()` long), or `None` for a logical
    /// anchor pool that has no KV bytes. Every call returns a clone of the same region, so
    /// pins taken through one handle guard the bytes for all.
    fn memory(&self) -> Option<MemoryRegion>;
}

/// A pool over a region the caller made: GPU memory (`MemKind::Device`, for a plugin that
/// moves it by DMA), an engine's own buffer, test memory.
///
/// The connector moves a device pool zero-copy only, and its pages carry no payload checksum
/// ([`PayloadCheck::DeviceUnchecked`](crate::PayloadCheck::DeviceUnchecked)): their bytes
/// never pass through host memory.
#[derive(Debug, Clone)]
pub struct RegionPool {
    geometry: PoolGeometry,
    region: MemoryRegion,
}

impl RegionPool {
    /// A pool of `geometry` over `region`, which must hold `geometry.pool_bytes()`.
    pub fn new(geometry: PoolGeometry, region: MemoryRegion) -> Result<Self> {
        geometry.validate()?;
        if region.len() < geometry.pool_bytes() {
            return Err(crate::Error::InvalidPool {
                reason: format!(
                    "the region is {} bytes but the geometry needs {}",
                    region.len(),
                    geometry.pool_bytes()
                ),
            });
        }
        Ok(RegionPool { geometry, region })
    }
}

impl HostPool for RegionPool {
    fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    fn memory(&self) -> Option<MemoryRegion> {
        Some(self.region.clone())
    }
}

/// A logical pool with no KV bytes (SGLang's `LogicalHostPool` anchor): pages are tracked by
/// small marker objects only.
#[derive(Debug, Clone)]
pub struct AnchorPool {
    geometry: PoolGeometry,
}

impl AnchorPool {
    /// An anchor pool with the geometry whose pages it stands for.
    pub fn new(geometry: PoolGeometry) -> Result<Self> {
        geometry.validate()?;
        Ok(AnchorPool { geometry })
    }
}

impl HostPool for AnchorPool {
    fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    fn memory(&self) -> Option<MemoryRegion> {
        None
    }
}

#[cfg(test)]
mod tests;
