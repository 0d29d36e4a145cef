//! Cases against the `StorageBackend` trait itself.
//!
//! The cases live in one submodule per theme and are re-exported here; the helpers below
//! are shared with the connector cases.

mod concurrency;
mod objects;
mod slices;
mod store;

pub use concurrency::*;
pub use objects::*;
pub use slices::*;
pub use store::*;

use std::sync::Arc;

use hicache_core::raw::{DynBackend, ObjectKey, ReadItem, RegionId, Slice, WriteItem};
use hicache_core::{Error, MemoryRegion, ReadOutcome};

use crate::check::{CaseError, CaseResult, only};
use crate::memory::TestMemory;
use crate::trial::TrialEnv;

/// A registered aligned buffer with helpers to fill and read it, in the variant's memory.
pub(crate) struct Buf {
    pub(crate) memory: MemoryRegion,
    pub(crate) id: RegionId,
    kind: Arc<dyn TestMemory>,
}

/// The block size transfers use: the backend's alignment, at least 4096.
pub(crate) fn block(env: &TrialEnv) -> u64 {
    env.capability().io_alignment.max(4096)
}

/// `len` bytes of the trial's memory, registered with `backend`.
pub(crate) fn buffer(env: &TrialEnv, backend: &DynBackend, len: u64) -> Result<Buf, Error> {
    buffer_in(env.memory(), backend, len)
}

/// `len` bytes of `kind`, registered with `backend` (for tasks that outlive the borrow of
/// the trial).
pub(crate) fn buffer_in(
    kind: Arc<dyn TestMemory>,
    backend: &DynBackend,
    len: u64,
) -> Result<Buf, Error> {
    let memory = kind.alloc(len)?;
    let id = backend.register(memory.clone())?;
    Ok(Buf { memory, id, kind })
}

impl Buf {
    /// Fills the buffer at `offset`. A failure means a transfer still holds these bytes
    /// after its call returned: a broken plugin, reported as a failed case.
    pub(crate) fn fill(&self, offset: u64, bytes: &[u8]) -> Result<(), CaseError> {
        self.memory
            .target(offset, bytes.len() as u64, "test buffer")
            .and_then(|mut t| self.kind.copy_in(&mut t, bytes))
            .map_err(|e| CaseError::Failed(format!("cannot fill the test buffer: {e}")))
    }

    /// The buffer's bytes at `offset`; fails like [`Buf::fill`].
    pub(crate) fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, CaseError> {
        self.memory
            .source(offset, len, "test buffer")
            .and_then(|s| self.kind.copy_out(&s))
            .map_err(|e| CaseError::Failed(format!("cannot read the test buffer: {e}")))
    }

    pub(crate) fn slice(&self, offset: u64, len: u64) -> Slice {
        Slice::new(self.id, offset, len)
    }
}

pub(crate) fn key(env: &TrialEnv, name: &str) -> ObjectKey {
    ObjectKey::new(format!("{}-{name}", env.namespace())).expect("valid object key")
}

async fn put(b: &DynBackend, k: &ObjectKey, segs: &[Slice]) -> CaseResult {
    let r = b
        .write(&[WriteItem {
            key: k,
            segments: segs,
        }])
        .await;
    match &only("write", r)? {
        Ok(()) => Ok(()),
        Err(e) => Err(crate::CaseError::Failed(format!(
            "write of {k} failed: {e}"
        ))),
    }
}

async fn get(
    b: &DynBackend,
    k: &ObjectKey,
    segs: &[Slice],
) -> Result<ReadOutcome, crate::CaseError> {
    let r = b
        .read(&[ReadItem {
            key: k,
            segments: segs,
        }])
        .await;
    only("read", r)?.map_err(|e| crate::CaseError::Failed(format!("read of {k} failed: {e}")))
}

/// Writes then reads one object made of `segs`; both results, for rejection checks.
async fn write_then_read(
    b: &DynBackend,
    k: &ObjectKey,
    segs: &[Slice],
) -> Result<(hicache_core::Result<()>, hicache_core::Result<ReadOutcome>), CaseError> {
    let w = b
        .write(&[WriteItem {
            key: k,
            segments: segs,
        }])
        .await;
    let r = b
        .read(&[ReadItem {
            key: k,
            segments: segs,
        }])
        .await;
    Ok((only("write", w)?, only("read", r)?))
}
