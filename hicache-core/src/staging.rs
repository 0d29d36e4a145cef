//! Aligned staging memory registered with a backend: envelope headers, bounce slots, anchor
//! markers. Chunks are handed out one per batch chunk, so several threads can run batches at
//! once without sharing a slot (SGLang's per-direction buffers assume exactly one thread per
//! direction), and memory is allocated lazily, up to a bound.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::DynBackend;
use crate::error::{Error, Result};
use crate::memory::{AlignedBuf, MemoryRegion, RegionId};

/// One registered buffer of `slots × slot_len` bytes.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) buf: Arc<AlignedBuf>,
    pub(crate) region: RegionId,
}

/// A bounded, lazily filled pool of chunks for one direction.
#[derive(Debug)]
pub(crate) struct StagingPool {
    backend: DynBackend,
    slot_len: u64,
    slots: usize,
    align: usize,
    free: Mutex<Vec<Chunk>>,
    permits: Arc<Semaphore>,
}

/// A chunk lent to one batch chunk; returned to the pool on drop.
pub(crate) struct Lease<'a> {
    pool: &'a StagingPool,
    chunk: Option<Chunk>,
    _permit: OwnedSemaphorePermit,
}

impl Lease<'_> {
    pub(crate) fn chunk(&self) -> &Chunk {
        self.chunk.as_ref().expect("chunk is present until drop")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.chunk.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(c);
        }
    }
}

impl StagingPool {
    pub(crate) fn new(
        backend: DynBackend,
        slot_len: u64,
        slots: usize,
        align: u64,
        max_chunks: usize,
    ) -> Self {
        StagingPool {
            backend,
            slot_len,
            slots: slots.max(1),
            align: align.max(4096) as usize,
            free: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max_chunks.max(1))),
        }
    }

    pub(crate) fn slot_len(&self) -> u64 {
        self.slot_len
    }

    /// Waits for a free chunk (allocating and registering one if under the bound).
    pub(crate) async fn lease(&self) -> Result<Lease<'_>> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::backend("connector", "staging pool closed"))?;
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let chunk = match reused {
            Some(c) => c,
            None => {
                let len = (self.slot_len as usize) * self.slots;
                let buf = Arc::new(AlignedBuf::zeroed(len, self.align)?);
                let region = self
                    .backend
                    .register(MemoryRegion::from_aligned(buf.clone()))?;
                Chunk { buf, region }
            }
        };
        Ok(Lease {
            pool: self,
            chunk: Some(chunk),
            _permit: permit,
        })
    }
}

impl Drop for StagingPool {
    fn drop(&mut self) {
        for c in self
            .free
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            if let Err(e) = self.backend.deregister(c.region) {
                tracing::debug!(error = %e, "deregistering a staging chunk failed");
            }
        }
    }
}
