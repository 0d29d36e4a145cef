//! The memory the backend cases move: host memory unless a variant gives other memory (a
//! GPU's, for plugins that accept device registrations).

use std::sync::Arc;

use hicache_core::raw::{AlignedBuf, SourceSlice, TargetSlice};
use hicache_core::{MemoryRegion, MmapPool, PoolGeometry, Result};

/// Where a variant's test buffers live, and how the cases put bytes in and take them out.
///
/// The cases pin a range before copying (so a transfer still holding it fails the case)
/// and hand the pin here: an implementation copies through it and touches nothing else.
pub trait TestMemory: Send + Sync + 'static {
    /// `len` zeroed bytes, aligned to at least 4096, as a region to register.
    fn alloc(&self, len: u64) -> Result<MemoryRegion>;

    /// Copies `bytes` into the pinned range (exactly as long).
    fn copy_in(&self, to: &mut TargetSlice, bytes: &[u8]) -> Result<()>;

    /// The pinned range's bytes.
    fn copy_out(&self, from: &SourceSlice) -> Result<Vec<u8>>;

    /// What memory this is, for messages (`host`, `device 0 through cudaMemcpy`).
    fn describe(&self) -> String;

    /// A zeroed host pool for the connector cases (`TrialEnv::pool`). By default an
    /// anonymous mapping; [`SharedHostMemory`] puts it in shared memory.
    fn pool(&self, geometry: PoolGeometry) -> Result<MmapPool> {
        MmapPool::new(geometry)
    }
}

/// Host memory: aligned heap buffers, copied by the CPU. Every variant's default.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostMemory;

impl TestMemory for HostMemory {
    fn alloc(&self, len: u64) -> Result<MemoryRegion> {
        Ok(MemoryRegion::from_aligned(AlignedBuf::zeroed(
            len as usize,
            4096,
        )?))
    }

    fn copy_in(&self, to: &mut TargetSlice, bytes: &[u8]) -> Result<()> {
        to.copy_from(0, bytes)
    }

    fn copy_out(&self, from: &SourceSlice) -> Result<Vec<u8>> {
        from.host_bytes().map(<[u8]>::to_vec)
    }

    fn describe(&self) -> String {
        "host".into()
    }
}

/// Host memory in shared-memory files under `/dev/shm` ([`MemoryRegion::shared_host`],
/// [`MmapPool::shared`]), buffers and connector pools alike: for plugins that move such
/// memory in place (3FS wraps it as an iov instead of copying it through its own).
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedHostMemory;

impl TestMemory for SharedHostMemory {
    fn alloc(&self, len: u64) -> Result<MemoryRegion> {
        MemoryRegion::shared_host(len)
    }

    fn copy_in(&self, to: &mut TargetSlice, bytes: &[u8]) -> Result<()> {
        HostMemory.copy_in(to, bytes)
    }

    fn copy_out(&self, from: &SourceSlice) -> Result<Vec<u8>> {
        HostMemory.copy_out(from)
    }

    fn describe(&self) -> String {
        "host, in shared-memory files".into()
    }

    fn pool(&self, geometry: PoolGeometry) -> Result<MmapPool> {
        MmapPool::shared(geometry)
    }
}

/// The default memory of a variant.
pub(crate) fn host() -> Arc<dyn TestMemory> {
    Arc::new(HostMemory)
}
