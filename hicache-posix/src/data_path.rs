//! The one step of the file layer another plugin may replace: how an object's bytes move
//! between registered memory and its open file.
//!
//! Everything else a POSIX backend does — routing, names, the open/publish/remove protocol,
//! envelopes' atomic publish, shared-root rules, root safety — stays as it is when a
//! [`DataPath`] is plugged in with
//! [`PosixBackend::with_data_path`](crate::PosixBackend::with_data_path). The GDS plugins plug in cuFile this way; a future
//! file plugin that only moves bytes differently would too.
//!
//! A backend with a data path runs its operations on the thread pool: each `Write` and
//! `Read` step of an operation (the file layer's object protocol) becomes one [`Transfer`]
//! handed to the path, the other steps (open, close, flush, rename, the read's guard block that proves
//! the file's length) stay system calls on the host. A path whose
//! [`batch_limit`](DataPath::batch_limit) is above 1 gets the transfers of up to that many
//! operations at once ([`DataPath::transfer_batch`]): each worker drives that many
//! operations in step, and their transfers meet in one call.

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;

use hicache_core::{MemKind, MemoryRegion, RegionPath, Result};

/// Which way a transfer moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From memory into the file.
    Write,
    /// From the file into memory.
    Read,
}

/// One transfer: consecutive bytes of an open file to or from a list of memory segments.
///
/// Only the file layer makes these, and it promises what an implementation relies on:
/// every segment lies inside a region this backend registered (and handed to
/// [`DataPath::register`]) which stays registered, alive and reserved for this transfer
/// until the call returns; the descriptor is open for the call. Addresses are the region's
/// own (a device pointer for [`MemKind::Device`]).
pub struct Transfer<'a> {
    pub(crate) file: BorrowedFd<'a>,
    pub(crate) segments: &'a [libc::iovec],
    pub(crate) offset: u64,
    pub(crate) direction: Direction,
}

impl fmt::Debug for Transfer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transfer")
            .field("file", &self.file)
            .field("segments", &self.segments.len())
            .field("offset", &self.offset)
            .field("direction", &self.direction)
            .finish()
    }
}

impl<'a> Transfer<'a> {
    /// The open file.
    pub fn file(&self) -> BorrowedFd<'a> {
        self.file
    }

    /// The file offset of the first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Which way the bytes move.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// The memory segments in file order, as (address, length).
    pub fn segments(&self) -> impl ExactSizeIterator<Item = (u64, usize)> + 'a {
        self.segments.iter().map(|v| (v.iov_base as u64, v.iov_len))
    }

    /// Bytes the transfer asks for.
    pub fn len(&self) -> u64 {
        self.segments.iter().map(|v| v.iov_len as u64).sum()
    }

    /// Whether it asks for no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How bytes move between registered memory and open files.
///
/// # Behavior
///
/// - `transfer` returns the bytes moved, consecutive from the offset: fewer than asked only
///   when a read reaches the end of the file (or the storage accepted fewer, for a write);
///   the file layer judges what a short count means. An error is an `io::Error`; its text
///   should name the call that failed.
/// - Transfers may run on several threads at once, each on its own file.
/// - `register` is called once per region before any transfer touches it, `deregister` once
///   after the last; a region of a kind `accepts` refuses is never registered.
pub trait DataPath: Send + Sync + fmt::Debug + 'static {
    /// Whether this path moves memory of this kind.
    fn accepts(&self, kind: MemKind) -> bool;

    /// Prepares a region for transfers (cuFile registers the buffer).
    fn register(&self, region: &MemoryRegion) -> Result<()>;

    /// Releases what `register` prepared; no transfer uses the region any more.
    fn deregister(&self, region: &MemoryRegion) -> Result<()>;

    /// The call a failed transfer in `direction` is reported as (`cuFileRead`): the error
    /// names the operation by it.
    fn call(&self, direction: Direction) -> &'static str;

    /// Moves one transfer's bytes.
    fn transfer(&self, transfer: &Transfer<'_>) -> io::Result<u64>;

    /// How many transfers one [`transfer_batch`](DataPath::transfer_batch) call may get (1:
    /// the path takes them one at a time).
    fn batch_limit(&self) -> usize {
        1
    }

    /// Moves several transfers (at most [`batch_limit`](DataPath::batch_limit)), one result
    /// each in order. By default one after another.
    fn transfer_batch(&self, batch: &[Transfer<'_>]) -> Vec<io::Result<u64>> {
        batch.iter().map(|t| self.transfer(t)).collect()
    }

    /// How transfers reach the registered `region`: in place, or copied through the path's
    /// own buffers (with a live count of the bytes). The default says nothing.
    fn region_path(&self, region: &MemoryRegion) -> RegionPath {
        let _ = region;
        RegionPath::Unstated
    }

    /// Whether device memory moves without a host copy (DMA between the GPU and storage).
    fn gpu_direct(&self) -> bool {
        false
    }

    /// The path, for humans (`hicache doctor`, the engine description).
    fn describe(&self) -> String;
}
