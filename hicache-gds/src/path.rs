//! cuFile as the file layer's data path: how GDS and GDS_MT move an object's bytes.
//!
//! The POSIX file layer ([`hicache_posix::data_path`]) opens, publishes and removes files;
//! this path moves the bytes between registered memory (host or device) and the open file:
//! GDS_MT with `cuFileRead`/`cuFileWrite` on each worker thread, GDS with the batch API, the
//! transfers of up to `batch_limit` objects submitted together.
//!
//! Every region the backend registers is registered with `cuFileBufRegister` once, and its
//! memory is kept alive here until it is deregistered. A file is registered with
//! `cuFileHandleRegister` for each transfer on it and deregistered right after: the file
//! layer opens a file per operation (a published object is never rewritten in place), so a
//! handle could not be reused by a later operation anyway.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use hicache_core::{Error, MemKind, MemoryRegion, Result};
use hicache_posix::data_path::{DataPath, Direction, Transfer};

use crate::cufile::{CuFile, FileHandle, Op, Request};
use crate::error::GdsError;
use crate::probe::Mode;

/// How the path submits transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Submit {
    /// One `cuFileRead`/`cuFileWrite` per segment, on the calling thread (GDS_MT).
    Sync,
    /// The batch API: requests of at most `max_request` bytes, at most `limit` per batch
    /// (GDS).
    Batch {
        /// Requests per batch.
        limit: u32,
        /// Bytes per request.
        max_request: usize,
    },
}

/// cuFile as a data path (see the module docs).
pub(crate) struct CuFilePath {
    plugin: &'static str,
    cufile: Arc<CuFile>,
    mode: Mode,
    submit: Submit,
    /// Registered regions by base address (several may share one), each kept alive.
    buffers: RwLock<BTreeMap<u64, Vec<MemoryRegion>>>,
    /// Set when a batch was abandoned with requests that may still be in flight: no
    /// transfer runs any more, and registered memory is never released.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for CuFilePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuFilePath")
            .field("plugin", &self.plugin)
            .field("cufile", &self.cufile)
            .field("submit", &self.submit)
            .finish_non_exhaustive()
    }
}

fn io_error(e: GdsError) -> io::Error {
    match e {
        GdsError::Os { call, source } => io::Error::new(source.kind(), format!("{call}: {source}")),
        other => io::Error::other(other.to_string()),
    }
}

impl CuFilePath {
    /// Opens cuFile's driver for the backend's lifetime (closed on drop).
    pub(crate) fn open(
        plugin: &'static str,
        cufile: Arc<CuFile>,
        submit: Submit,
    ) -> Result<Self, GdsError> {
        cufile.open_driver()?;
        Ok(CuFilePath {
            plugin,
            mode: crate::probe::mode(),
            cufile,
            submit,
            buffers: RwLock::new(BTreeMap::new()),
            poisoned: AtomicBool::new(false),
        })
    }

    fn check_poisoned(&self) -> io::Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "a cuFile batch was abandoned with requests in flight; this backend moves no more data (open a new one)",
            ));
        }
        Ok(())
    }

    /// The registered region holding `addr..addr + len`: its base, and `addr`'s offset in it.
    fn locate(&self, addr: u64, len: usize) -> io::Result<(*mut c_void, u64)> {
        let buffers = self.buffers.read().unwrap_or_else(|e| e.into_inner());
        let end = addr.checked_add(len as u64);
        let found = buffers
            .range(..=addr)
            .rev()
            .find(|(base, regions)| {
                regions
                    .iter()
                    .any(|r| end.is_some_and(|end| end <= **base + r.len()))
            })
            .map(|(&base, _)| base);
        match found {
            Some(base) => Ok((base as usize as *mut c_void, addr - base)),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {addr:#x} are not inside a region registered with cuFile"),
            )),
        }
    }

    /// One transfer with `cuFileRead`/`cuFileWrite`, segment after segment.
    fn transfer_sync(&self, t: &Transfer<'_>) -> io::Result<u64> {
        let handle = self.cufile.register_file(t.file()).map_err(io_error)?;
        let mut done = 0u64;
        for (addr, len) in t.segments() {
            let (base, buf_offset) = self.locate(addr, len)?;
            let at = t.offset() + done;
            // SAFETY: the file layer's promise (`Transfer`): the segment lies in a region
            // registered here (kept alive in `buffers`), reserved for this transfer until
            // it returns; `locate` checked it lies in that registration.
            let moved = unsafe {
                match t.direction() {
                    Direction::Read => self.cufile.read(&handle, base, len, at, buf_offset),
                    Direction::Write => self.cufile.write(&handle, base, len, at, buf_offset),
                }
            }
            .map_err(io_error)?;
            done += moved as u64;
            if moved < len {
                break;
            }
        }
        Ok(done)
    }

    /// Transfers with the batch API: every transfer's segments as requests of at most
    /// `max_request` bytes, submitted `limit` at a time; each transfer's result is the bytes
    /// its requests moved in order, up to the first short one.
    fn transfer_batched(
        &self,
        batch: &[Transfer<'_>],
        limit: u32,
        max_request: usize,
    ) -> Vec<io::Result<u64>> {
        let mut results: Vec<Option<io::Result<u64>>> = (0..batch.len()).map(|_| None).collect();
        let handles: Vec<Option<FileHandle<'_>>> = batch
            .iter()
            .enumerate()
            .map(|(i, t)| match self.cufile.register_file(t.file()) {
                Ok(h) => Some(h),
                Err(e) => {
                    results[i] = Some(Err(io_error(e)));
                    None
                }
            })
            .collect();
        // Requests in transfer order, each with its transfer's index.
        let mut requests = Vec::new();
        let mut owners = Vec::new();
        for (i, (t, handle)) in batch.iter().zip(&handles).enumerate() {
            let Some(handle) = handle else { continue };
            match requests_of(self, t, handle, max_request) {
                Ok(mine) => {
                    owners.extend(std::iter::repeat_n(i, mine.len()));
                    requests.extend(mine);
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let outcomes = self.run_requests(&requests, limit);
        // Fold each transfer's requests: bytes in order up to the first short one; an error
        // before any byte is the transfer's error.
        let mut done = vec![0u64; batch.len()];
        let mut stopped = vec![false; batch.len()];
        for ((request, owner), outcome) in requests.iter().zip(owners).zip(outcomes) {
            if stopped[owner] {
                continue;
            }
            match outcome {
                Ok(n) => {
                    done[owner] += n as u64;
                    stopped[owner] = n < request.size;
                }
                Err(e) => {
                    stopped[owner] = true;
                    if done[owner] == 0 {
                        results[owner] = Some(Err(e));
                    }
                }
            }
        }
        drop(requests);
        drop(handles);
        results
            .into_iter()
            .zip(done)
            .map(|(r, n)| r.unwrap_or(Ok(n)))
            .collect()
    }

    /// Runs `requests` in batches of `limit`; one outcome per request.
    fn run_requests(&self, requests: &[Request<'_>], limit: u32) -> Vec<io::Result<usize>> {
        if requests.is_empty() {
            return Vec::new();
        }
        let context = match self.cufile.batch(limit) {
            Ok(c) => c,
            Err(e) => {
                let text = e.to_string();
                return requests
                    .iter()
                    .map(|_| Err(io::Error::other(text.clone())))
                    .collect();
            }
        };
        let mut outcomes = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(limit as usize) {
            // SAFETY: each request's buffer lies in a region registered here, reserved for
            // its transfer until this call returns (the file layer's promise); `run` returns
            // only when every request has ended, or says `Abandoned`, handled below.
            match unsafe { context.run(chunk) } {
                Ok(done) => outcomes.extend(done.into_iter().map(|r| r.map_err(io_error))),
                Err(e @ GdsError::Abandoned { .. }) => {
                    // cuFile may still write into these buffers: nothing registered here is
                    // ever released, and no transfer runs any more.
                    self.poisoned.store(true, Ordering::Release);
                    tracing::error!(plugin = self.plugin, error = %e, "cuFile batch abandoned with requests in flight; the backend stops moving data and keeps its registered memory alive for good");
                    let text = e.to_string();
                    outcomes.extend(chunk.iter().map(|_| Err(io::Error::other(text.clone()))));
                }
                Err(e) => {
                    let text = e.to_string();
                    outcomes.extend(chunk.iter().map(|_| Err(io::Error::other(text.clone()))));
                }
            }
        }
        outcomes
    }
}

/// The requests of one transfer: each segment split into pieces of at most `max_request`.
fn requests_of<'r>(
    path: &CuFilePath,
    t: &Transfer<'_>,
    handle: &'r FileHandle<'r>,
    max_request: usize,
) -> io::Result<Vec<Request<'r>>> {
    let op = match t.direction() {
        Direction::Read => Op::Read,
        Direction::Write => Op::Write,
    };
    let mut out = Vec::new();
    let mut at = t.offset();
    for (addr, len) in t.segments() {
        let (base, offset) = path.locate(addr, len)?;
        let mut piece = 0usize;
        while piece < len {
            let size = (len - piece).min(max_request.max(1));
            out.push(Request {
                file: handle,
                op,
                base,
                size,
                file_offset: at,
                buf_offset: offset + piece as u64,
            });
            at += size as u64;
            piece += size;
        }
    }
    Ok(out)
}

impl DataPath for CuFilePath {
    fn accepts(&self, kind: MemKind) -> bool {
        matches!(kind, MemKind::Host | MemKind::Device { .. })
    }

    fn register(&self, region: &MemoryRegion) -> Result<()> {
        let len = usize::try_from(region.len()).map_err(|_| Error::Unsupported {
            component: self.plugin.into(),
            operation: format!("registering {} bytes", region.len()),
        })?;
        // SAFETY: the region's memory stays alive while `buffers` holds its clone, which it
        // does until `deregister` has let go of the cuFile registration.
        unsafe { registrations::take(&self.cufile, region.addr(), len) }
            .map_err(|e| e.into_error(self.plugin))?;
        self.buffers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(region.addr() as u64)
            .or_default()
            .push(region.clone());
        Ok(())
    }

    fn deregister(&self, region: &MemoryRegion) -> Result<()> {
        let base = region.addr() as u64;
        let kept = {
            let mut buffers = self.buffers.write().unwrap_or_else(|e| e.into_inner());
            let Some(regions) = buffers.get_mut(&base) else {
                return Ok(());
            };
            let Some(at) = regions.iter().position(|r| r.same_region(region)) else {
                return Ok(());
            };
            let kept = regions.swap_remove(at);
            if regions.is_empty() {
                buffers.remove(&base);
            }
            kept
        };
        if self.poisoned.load(Ordering::Acquire) {
            // Requests abandoned in flight may still reach this memory: it is never freed.
            std::mem::forget(kept);
            return Err(Error::backend(
                self.plugin,
                "a cuFile batch was abandoned with requests in flight: the region's memory is kept allocated for good",
            ));
        }
        // SAFETY: taken in `register`; the backend deregisters only once no plan pins the
        // region, so no transfer of this backend on it is in flight.
        unsafe { registrations::give(&self.cufile, region.addr()) }
            .map_err(|e| e.into_error(self.plugin))
    }

    fn call(&self, direction: Direction) -> &'static str {
        match (self.submit, direction) {
            (Submit::Sync, Direction::Read) => "cuFileRead",
            (Submit::Sync, Direction::Write) => "cuFileWrite",
            (Submit::Batch { .. }, Direction::Read) => "cuFile batch read",
            (Submit::Batch { .. }, Direction::Write) => "cuFile batch write",
        }
    }

    fn transfer(&self, transfer: &Transfer<'_>) -> io::Result<u64> {
        self.check_poisoned()?;
        match self.submit {
            Submit::Sync => self.transfer_sync(transfer),
            Submit::Batch { limit, max_request } => self
                .transfer_batched(std::slice::from_ref(transfer), limit, max_request)
                .pop()
                .unwrap_or_else(|| Err(io::Error::other("the batch returned no result"))),
        }
    }

    fn batch_limit(&self) -> usize {
        match self.submit {
            Submit::Sync => 1,
            Submit::Batch { limit, .. } => limit as usize,
        }
    }

    fn transfer_batch(&self, batch: &[Transfer<'_>]) -> Vec<io::Result<u64>> {
        if let Err(e) = self.check_poisoned() {
            return batch
                .iter()
                .map(|_| Err(io::Error::new(e.kind(), e.to_string())))
                .collect();
        }
        match self.submit {
            Submit::Sync => batch.iter().map(|t| self.transfer_sync(t)).collect(),
            Submit::Batch { limit, max_request } => {
                self.transfer_batched(batch, limit, max_request)
            }
        }
    }

    fn gpu_direct(&self) -> bool {
        self.mode == Mode::P2p && !self.cufile.is_stand_in()
    }

    fn describe(&self) -> String {
        let how = match self.submit {
            Submit::Sync => "cuFileRead/cuFileWrite".to_string(),
            Submit::Batch { limit, max_request } => format!(
                "cuFile batches (up to {limit} requests of at most {} KiB)",
                max_request / 1024
            ),
        };
        let mode = match (self.cufile.is_stand_in(), self.mode) {
            (true, _) => "the test stand-in",
            (false, Mode::P2p) => "P2P mode",
            (false, Mode::Compat) => "compat mode",
        };
        format!("{how}, {mode}, {}", self.cufile.path().display())
    }
}

impl Drop for CuFilePath {
    fn drop(&mut self) {
        let buffers = std::mem::take(self.buffers.get_mut().unwrap_or_else(|e| e.into_inner()));
        let poisoned = self.poisoned.load(Ordering::Acquire);
        for (base, regions) in buffers {
            for region in regions {
                if poisoned {
                    std::mem::forget(region);
                    continue;
                }
                // SAFETY: taken in `register`; the backend is gone, so nothing of it is in
                // flight.
                if let Err(e) = unsafe { registrations::give(&self.cufile, base as usize) } {
                    tracing::warn!(plugin = self.plugin, error = %e, "cuFileBufDeregister failed at shutdown");
                }
            }
        }
        if !poisoned && let Err(e) = self.cufile.close_driver() {
            tracing::warn!(plugin = self.plugin, error = %e, "cuFileDriverClose failed");
        }
    }
}

/// cuFile's buffer registrations are per process (a second `cuFileBufRegister` of the same
/// memory fails with `CU_FILE_MEMORY_ALREADY_REGISTERED`), while hicache lets several
/// backends register the same memory (two connectors over one pool, a backend reopened
/// before the old one is gone). So registrations are counted here by base address: the
/// first taker registers, the last giver deregisters.
mod registrations {
    use std::collections::BTreeMap;
    use std::ffi::c_void;
    use std::sync::Mutex;

    use crate::cufile::CuFile;
    use crate::error::GdsError;

    /// `CU_FILE_MEMORY_ALREADY_REGISTERED`.
    const ALREADY_REGISTERED: i32 = 5023;

    /// Base address → (takers, whether hicache registered it).
    static TAKEN: Mutex<BTreeMap<usize, (usize, bool)>> = Mutex::new(BTreeMap::new());

    /// Registers `len` bytes at `base` unless this process holds a registration at `base`
    /// already. Memory that cuFile already knows through a registration made elsewhere
    /// (overlapping ranges, another library user) is used as it is and never deregistered
    /// here.
    ///
    /// # Safety
    /// As [`CuFile::register_buffer`], until the matching [`give`].
    pub(super) unsafe fn take(cufile: &CuFile, base: usize, len: usize) -> Result<(), GdsError> {
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((count, _)) = taken.get_mut(&base) {
            *count += 1;
            return Ok(());
        }
        // SAFETY: the caller's contract.
        let ours = match unsafe { cufile.register_buffer(base as *const c_void, len) } {
            Ok(()) => true,
            Err(e) if e.code() == Some(ALREADY_REGISTERED) => {
                tracing::debug!(
                    base,
                    len,
                    "memory already registered with cuFile elsewhere; using that registration"
                );
                false
            }
            Err(e) => return Err(e),
        };
        taken.insert(base, (1, ours));
        Ok(())
    }

    /// Lets go of one [`take`] at `base`; the last one deregisters what hicache registered.
    ///
    /// # Safety
    /// No transfer of this taker on the memory is in flight.
    pub(super) unsafe fn give(cufile: &CuFile, base: usize) -> Result<(), GdsError> {
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        let Some((count, ours)) = taken.get_mut(&base) else {
            return Ok(());
        };
        *count -= 1;
        if *count > 0 {
            return Ok(());
        }
        let ours = *ours;
        taken.remove(&base);
        if ours {
            // SAFETY: registered by `take`; the last taker is done with it.
            unsafe { cufile.deregister_buffer(base as *const c_void) }?;
        }
        Ok(())
    }
}
