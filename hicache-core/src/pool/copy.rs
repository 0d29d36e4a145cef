//! Pages copied between a pool and a flat buffer on the CPU, in flat-page order, under pins.

use crate::error::{Error, Result};
use crate::memory::{MemKind, MemoryRegion};

use super::{HostPool, PoolGeometry};

/// Checks that the pool's memory is big enough for its geometry and is host memory.
fn checked_memory(region: Option<MemoryRegion>, geometry: &PoolGeometry) -> Result<MemoryRegion> {
    let region = region.ok_or_else(|| Error::InvalidPool {
        reason: "an anchor pool has no bytes to copy".into(),
    })?;
    let need = geometry.pool_bytes();
    if region.len() < need {
        return Err(Error::InvalidPool {
            reason: format!(
                "pool memory is {} bytes but the geometry needs {need}",
                region.len()
            ),
        });
    }
    if region.kind() != MemKind::Host {
        return Err(Error::InvalidPool {
            reason: format!("cannot copy pages of {} memory on the CPU", region.kind()),
        });
    }
    Ok(region)
}

/// Copies page `page` into `dst` in flat-page order (`dst.len()` must be `page_bytes()`).
///
/// The pool's geometry and memory are read once. The page's spans are pinned for reading,
/// so a transfer writing them makes this an [`Error::MemoryBusy`], never a torn copy.
pub fn gather_page(pool: &dyn HostPool, page: u64, dst: &mut [u8]) -> Result<()> {
    let geometry = *pool.geometry();
    let region = checked_memory(pool.memory(), &geometry)?;
    gather_from(&region, &geometry, page, dst)
}

/// Copies a flat page from `src` into page `page` (`src.len()` must be `page_bytes()`).
///
/// The page's spans are pinned for writing, so a transfer using them makes this an
/// [`Error::MemoryBusy`].
pub fn scatter_page(pool: &dyn HostPool, page: u64, src: &[u8]) -> Result<()> {
    let geometry = *pool.geometry();
    let region = checked_memory(pool.memory(), &geometry)?;
    scatter_into(&region, &geometry, page, src)
}

/// [`gather_page`] for a region and geometry already checked by the caller.
fn gather_from(
    region: &MemoryRegion,
    geometry: &PoolGeometry,
    page: u64,
    dst: &mut [u8],
) -> Result<()> {
    check_flat_len(geometry, dst.len())?;
    let mut at = 0usize;
    for span in geometry.page_spans(page)? {
        let src = region.source(span.offset, span.len, "host pool")?;
        let bytes = src.host_bytes()?;
        dst[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    }
    Ok(())
}

/// [`scatter_page`] for a region and geometry already checked by the caller.
fn scatter_into(
    region: &MemoryRegion,
    geometry: &PoolGeometry,
    page: u64,
    src: &[u8],
) -> Result<()> {
    check_flat_len(geometry, src.len())?;
    let mut at = 0usize;
    for span in geometry.page_spans(page)? {
        let mut dst = region.target(span.offset, span.len, "host pool")?;
        let n = dst.len();
        dst.copy_from(0, &src[at..at + n])?;
        at += n;
    }
    Ok(())
}

fn check_flat_len(g: &PoolGeometry, len: usize) -> Result<()> {
    if len as u64 != g.page_bytes() {
        return Err(Error::InvalidBatch {
            reason: format!(
                "flat page buffer is {len} bytes, a page is {}",
                g.page_bytes()
            ),
        });
    }
    Ok(())
}
