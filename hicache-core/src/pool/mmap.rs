//! [`MmapPool`]: a host pool in an anonymous (or shared-memory), page-aligned, pre-faulted
//! mmap.

use std::fmt;
use std::path::Path;

use crate::error::Result;
use crate::memory::{HostPages, MemoryRegion, SharedFile};

use super::{HostPool, PoolGeometry};

/// A host pool in an anonymous, page-aligned, pre-faulted mmap (SGLang's `alloc_mmap`).
///
/// Pre-faulting (`MADV_POPULATE_WRITE`, or touching every page) keeps first-touch faults out
/// of transfers and benchmarks. [`MmapPool::with_pages`] picks the page size: huge pages for
/// a pool that direct I/O moves to a device, base pages where the kernel copies the bytes
/// (see [`HostPages`] for what each did on a virtio disk and on tmpfs). A
/// [shared](MmapPool::shared) pool is a tmpfs file, whose huge pages the system's
/// `shmem_enabled` setting governs. Its bytes are reached only through its one
/// [`MemoryRegion`], so [`MmapPool::write_bytes`] and [`MmapPool::read_bytes`] pin what they
/// touch and fail with [`Error::MemoryBusy`](crate::Error::MemoryBusy) rather than race a transfer.
pub struct MmapPool {
    geometry: PoolGeometry,
    region: MemoryRegion,
}

impl fmt::Debug for MmapPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmapPool")
            .field("geometry", &self.geometry)
            .field("addr", &format_args!("{:#x}", self.region.addr()))
            .field(
                "shared_file",
                &self.region.shared_file().map(SharedFile::path),
            )
            .finish()
    }
}

impl MmapPool {
    /// Maps and pre-faults a zeroed pool for `geometry` in base pages.
    pub fn new(geometry: PoolGeometry) -> Result<Self> {
        Self::with_pages(geometry, HostPages::Base)
    }

    /// As [`new`](Self::new), in `pages`: [`HostPages::Huge`] for a pool that direct I/O
    /// moves to and from a device, [`HostPages::Base`] for one whose bytes the kernel copies
    /// (buffered I/O, a memory filesystem).
    pub fn with_pages(geometry: PoolGeometry, pages: HostPages) -> Result<Self> {
        let region = MemoryRegion::anonymous_host(geometry.pool_bytes(), pages)?;
        Ok(MmapPool { geometry, region })
    }

    /// A zeroed, pre-faulted pool for `geometry` in a new shared-memory file under
    /// [`SHM_DIR`](crate::SHM_DIR) ([`MemoryRegion::shared_host`]): a plugin whose I/O runs in
    /// another process (3FS's FUSE process) can then move its pages in place instead of
    /// copying them through its own buffers. The file is unlinked when the pool and every
    /// registration of its memory are gone.
    pub fn shared(geometry: PoolGeometry) -> Result<Self> {
        Self::shared_in(Path::new(crate::SHM_DIR), geometry)
    }

    /// As [`shared`](Self::shared), with the file in `dir`.
    pub fn shared_in(dir: &Path, geometry: PoolGeometry) -> Result<Self> {
        let region = MemoryRegion::shared_host_in(dir, geometry.pool_bytes())?;
        Ok(MmapPool { geometry, region })
    }

    /// The shared-memory file the pool lives in, when made by [`shared`](Self::shared).
    pub fn shared_file(&self) -> Option<&SharedFile> {
        self.region.shared_file()
    }

    /// Copies `bytes` into the pool at `offset` (test and fill helper).
    pub fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut dst = self
            .region
            .target(offset, bytes.len() as u64, "MmapPool::write_bytes")?;
        dst.copy_from(0, bytes)
    }

    /// Copies pool bytes at `offset` into `out`.
    pub fn read_bytes(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let src = self
            .region
            .source(offset, out.len() as u64, "MmapPool::read_bytes")?;
        out.copy_from_slice(src.host_bytes()?);
        Ok(())
    }

    /// Base address (page-aligned).
    pub fn base(&self) -> usize {
        self.region.addr()
    }
}

impl HostPool for MmapPool {
    fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    fn memory(&self) -> Option<MemoryRegion> {
        Some(self.region.clone())
    }
}
