//! What a caller tunes and gets back: options, host slots, outcomes, statistics, the pool
//! report.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::envelope::PageFormat;
use crate::key::{NamingScheme, StorageIdentity};
use crate::region_path::RegionPath;

use super::*;

/// SGLang's largest batch; also the default number of slots per staging chunk.
pub const STORAGE_BATCH_SIZE: usize = 128;

/// Connector tuning and the engine identity.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HiCacheOptions {
    /// Who stores (model, ranks); with the pool this forms the namespace.
    pub identity: StorageIdentity,
    /// Most bytes of one staging chunk (bounce slots, headers).
    pub staging_chunk_bytes: u64,
    /// Most slots (objects) per staging chunk and pages per backend call.
    pub max_slots_per_chunk: usize,
    /// Most staging chunks per direction (bounds staging memory and concurrency).
    pub max_staging_chunks: usize,
}

impl Default for HiCacheOptions {
    fn default() -> Self {
        HiCacheOptions {
            identity: StorageIdentity::default(),
            staging_chunk_bytes: 64 << 20,
            max_slots_per_chunk: STORAGE_BATCH_SIZE,
            max_staging_chunks: 4,
        }
    }
}

impl HiCacheOptions {
    /// Options for `identity` with default tuning.
    pub fn new(identity: StorageIdentity) -> Self {
        HiCacheOptions {
            identity,
            ..Self::default()
        }
    }

    /// Sets the staging chunk size in bytes.
    pub fn with_staging_chunk_bytes(mut self, bytes: u64) -> Self {
        self.staging_chunk_bytes = bytes;
        self
    }

    /// Sets the slots per chunk.
    pub fn with_max_slots_per_chunk(mut self, slots: usize) -> Self {
        self.max_slots_per_chunk = slots.max(1);
        self
    }
}

/// What `register_pool` decided, for logs, `hicache doctor` and callers.
#[derive(Clone, Debug, Serialize)]
pub struct PoolReport {
    /// The transfer mode.
    pub mode: TransferMode,
    /// Why.
    pub reason: String,
    /// Bytes of one page.
    pub page_bytes: u64,
    /// Spans per page in the host pool.
    pub spans_per_page: u64,
    /// Objects per page in storage.
    pub objects_per_page: u64,
    /// Bytes stored per page (headers and padding included).
    pub stored_bytes_per_page: u64,
    /// Alignment applied to transfers.
    pub io_alignment: u64,
    /// Object naming.
    pub naming: NamingScheme,
    /// Object framing.
    pub page_format: PageFormat,
    /// Short namespace digest (part of object names under hicache naming).
    pub namespace: String,
    /// Whether this rank writes (MLA: only TP rank 0 does).
    pub writer: bool,
    /// Staging bytes per chunk: envelope headers in zero-copy mode (0 with raw pages), whole
    /// pages in bounce mode, marker objects for an anchor pool.
    pub staging_chunk_bytes: u64,
    /// In zero-copy mode, how the backend moves the pool's bytes: in place, or copied
    /// through its own buffers (3FS with a pool outside shared memory), with a live count.
    /// `None` when the pool is not registered with the backend (bounce and anchor modes,
    /// where the connector copies pages through staging itself).
    pub pool_path: Option<RegionPath>,
    /// How a page's payload is checked when it is read back.
    pub payload_check: PayloadCheck,
}

/// How a page's payload is checked when it is read back (every page's length always is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PayloadCheck {
    /// Envelope: checksummed on the host when written, verified when read.
    Checksum,
    /// Envelope without a checksum: the pool is GPU memory, whose pages move between the GPU
    /// and storage by DMA and never pass through host memory where a checksum could be
    /// computed. Namespace, key and lengths are still checked; a flipped payload byte is not
    /// caught.
    DeviceUnchecked,
    /// Raw pages: no envelope, only the object's length is checked.
    LengthOnly,
}

impl std::fmt::Display for PayloadCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PayloadCheck::Checksum => "checksum verified on read",
            PayloadCheck::DeviceUnchecked => {
                "no checksum: GPU pages move by DMA and never touch host memory (envelope identity and lengths checked)"
            }
            PayloadCheck::LengthOnly => "raw pages: length only",
        })
    }
}

/// Host pages named by page index or, like SGLang, by token index.
#[derive(Clone, Copy, Debug)]
pub enum HostSlots<'a> {
    /// One page index per key.
    Pages(&'a [u64]),
    /// `page_tokens` contiguous token indices per key, the first page-aligned.
    Tokens(&'a [u64]),
}

/// Result of writing one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SetOutcome {
    /// The page is stored.
    Written,
    /// Nothing was written: this rank is not the writer of a rank-replicated (MLA) pool.
    SkippedNotWriter,
}

/// Counters of the connector.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) pages_written: AtomicU64,
    pub(super) pages_hit: AtomicU64,
    pub(super) pages_not_found: AtomicU64,
    pub(super) pages_invalid: AtomicU64,
    pub(super) page_errors: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) bytes_read: AtomicU64,
}

/// A snapshot of the connector's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Pages stored.
    pub pages_written: u64,
    /// Pages read and verified.
    pub pages_hit: u64,
    /// Reads that found no object.
    pub pages_not_found: u64,
    /// Reads that found an invalid object (torn, corrupt, foreign).
    pub pages_invalid: u64,
    /// Pages that failed with an error.
    pub page_errors: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Payload bytes read.
    pub bytes_read: u64,
}
