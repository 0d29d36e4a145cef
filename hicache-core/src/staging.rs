//! Aligned staging memory registered with a backend: envelope headers, bounce slots, anchor
//! markers. Chunks are handed out one per batch chunk, so several threads can run batches at
//! once without sharing a slot (SGLang's per-direction buffers assume exactly one thread per
//! direction), and memory is allocated lazily, up to a bound.
//!
//! A chunk is handed out only while no transfer pins it. Backends end their I/O before a
//! dropped batch future finishes dropping, so a returned chunk is normally idle at once; one
//! that a transfer still pins (a backend whose I/O outlives the future, such as an HTTP body
//! still being sent) stays in the free list but is skipped until its pins drop.

use std::sync::Mutex;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::DynBackend;
use crate::error::{Error, Result};
use crate::memory::{AlignedBuf, MemoryRegion, RegionId};

/// One registered buffer of `slots × slot_len` bytes.
#[derive(Debug)]
pub(crate) struct Chunk {
    /// The chunk's memory; the connector reaches its bytes only through pins.
    pub(crate) memory: MemoryRegion,
    /// Its registration with the backend.
    pub(crate) region: RegionId,
}

/// A bounded, lazily filled pool of chunks for one direction.
#[derive(Debug)]
pub(crate) struct StagingPool {
    backend: DynBackend,
    slot_len: u64,
    slots: usize,
    align: usize,
    max_chunks: usize,
    free: Mutex<Vec<Chunk>>,
    /// Chunks allocated so far (leased, free, or still pinned by a finished lease).
    allocated: Mutex<usize>,
    permits: std::sync::Arc<Semaphore>,
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
            max_chunks: max_chunks.max(1),
            free: Mutex::new(Vec::new()),
            allocated: Mutex::new(0),
            permits: std::sync::Arc::new(Semaphore::new(max_chunks.max(1))),
        }
    }

    pub(crate) fn slot_len(&self) -> u64 {
        self.slot_len
    }

    /// Waits until no transfer pins any free chunk.
    pub(crate) async fn wait_idle(&self) {
        let chunks: Vec<MemoryRegion> = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|c| c.memory.clone())
            .collect();
        for c in chunks {
            c.wait_idle().await;
        }
    }

    /// Waits for an idle chunk (allocating and registering one if under the bound).
    pub(crate) async fn lease(&self) -> Result<Lease<'_>> {
        let permit = self.permits.clone().acquire_owned().await.map_err(|_| {
            Error::backend(crate::error::Component::Connector, "staging pool closed")
        })?;
        loop {
            match self.take_idle_or_allocate()? {
                Ok(chunk) => {
                    return Ok(Lease {
                        pool: self,
                        chunk: Some(chunk),
                        _permit: permit,
                    });
                }
                // Every chunk is pinned by transfers that outlived their calls and no more
                // may be allocated: wait for one of them.
                Err(busy) => busy.wait_idle().await,
            }
        }
    }

    /// An idle free chunk, a new one, or (when the bound forbids one) a busy chunk to wait on.
    fn take_idle_or_allocate(&self) -> Result<Result<Chunk, MemoryRegion>> {
        let busy = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = free.iter().position(|c| c.memory.in_flight() == 0) {
                return Ok(Ok(free.swap_remove(i)));
            }
            free.first().map(|c| c.memory.clone())
        };
        {
            // Leased chunks are bounded by the permits; chunks still pinned after their lease
            // ended may add up to as many again before callers wait for them.
            let mut allocated = self.allocated.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(busy) = busy
                && *allocated >= 2 * self.max_chunks
            {
                return Ok(Err(busy));
            }
            *allocated += 1;
        }
        let len = (self.slot_len as usize)
            .checked_mul(self.slots)
            .ok_or_else(|| Error::InvalidPool {
                reason: format!(
                    "a staging chunk of {} slots of {} bytes overflows",
                    self.slots, self.slot_len
                ),
            });
        let made = len
            .and_then(|len| AlignedBuf::zeroed(len, self.align))
            .and_then(|buf| {
                let memory = MemoryRegion::from_aligned(buf);
                let region = self.backend.register(memory.clone())?;
                Ok(Chunk { memory, region })
            });
        if made.is_err() {
            *self.allocated.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        }
        made.map(Ok)
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
            // A transfer that outlived its call may still pin the chunk: wait for it, so the
            // registration is released rather than refused as busy.
            c.memory.wait_idle_blocking();
            if let Err(e) = self.backend.deregister(c.region) {
                tracing::debug!(error = %e, "deregistering a staging chunk failed");
            }
        }
    }
}
