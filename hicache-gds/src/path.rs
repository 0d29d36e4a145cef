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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
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
        let fd = registrable(t.file())?;
        let handle = self.cufile.register_file(fd.as_fd()).map_err(io_error)?;
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
        let fds: Vec<Option<Registrable<'_>>> = batch
            .iter()
            .enumerate()
            .map(|(i, t)| match registrable(t.file()) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    results[i] = Some(Err(e));
                    None
                }
            })
            .collect();
        let handles: Vec<Option<FileHandle<'_>>> = fds
            .iter()
            .enumerate()
            .map(
                |(i, fd)| match fd.as_ref().map(|fd| self.cufile.register_file(fd.as_fd())) {
                    Some(Ok(h)) => Some(h),
                    Some(Err(e)) => {
                        results[i] = Some(Err(io_error(e)));
                        None
                    }
                    None => None,
                },
            )
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
        drop(fds);
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

/// A descriptor cuFile will register for an open file: the file layer's own, or the same
/// file opened again.
enum Registrable<'a> {
    Same(BorrowedFd<'a>),
    Reopened(OwnedFd),
}

impl Registrable<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Registrable::Same(fd) => *fd,
            Registrable::Reopened(fd) => fd.as_fd(),
        }
    }
}

/// cuFile 1.15.1 refuses to register a descriptor whose flags hold `O_NONBLOCK` or
/// `O_NOFOLLOW` (`CU_FILE_INVALID_FILE_OPEN_FLAG`, measured on the H200). The file layer
/// opens objects for reading, and recycled spares for writing, with `O_NONBLOCK` (so a FIFO
/// planted under the root cannot hang the open) and, on kernels without `openat2`, with
/// `O_NOFOLLOW`. Once the descriptor is
/// known to be a regular file, `O_NONBLOCK` means nothing for it and is cleared;
/// `O_NOFOLLOW` cannot be cleared, so the file is opened again through
/// `/proc/self/fd/<fd>`, which names the very file already open, never a path in the tree.
fn registrable(file: BorrowedFd<'_>) -> io::Result<Registrable<'_>> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_retain(fcntl(file, FcntlArg::F_GETFL)?);
    let refused = OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW;
    if !flags.intersects(refused) {
        return Ok(Registrable::Same(file));
    }
    let st = nix::sys::stat::fstat(file)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    if !flags.contains(OFlag::O_NOFOLLOW) {
        fcntl(file, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
        return Ok(Registrable::Same(file));
    }
    let keep = OFlag::O_ACCMODE | OFlag::O_DIRECT;
    let again = nix::fcntl::open(
        format!("/proc/self/fd/{}", file.as_raw_fd()).as_str(),
        (flags & keep) | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    Ok(Registrable::Reopened(again))
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

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

    use nix::fcntl::{FcntlArg, OFlag, fcntl};

    use super::{Registrable, registrable};

    fn flags(fd: std::os::fd::BorrowedFd<'_>) -> OFlag {
        OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL).unwrap())
    }

    #[test]
    fn descriptors_lose_the_flags_cufile_refuses_and_stay_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        std::fs::write(&path, b"x").unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        // Plain: the descriptor itself.
        let plain = std::fs::File::open(&path).unwrap();
        assert!(matches!(
            registrable(plain.as_fd()).unwrap(),
            Registrable::Same(_)
        ));
        // O_NONBLOCK: cleared on the same descriptor.
        let nonblock = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        match registrable(nonblock.as_fd()).unwrap() {
            Registrable::Same(fd) => assert_eq!(fd.as_raw_fd(), nonblock.as_raw_fd()),
            Registrable::Reopened(_) => panic!("O_NONBLOCK is cleared in place"),
        }
        assert!(!flags(nonblock.as_fd()).contains(OFlag::O_NONBLOCK));
        // O_NOFOLLOW: the same file opened again, same access mode, neither flag.
        let nofollow = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let again = registrable(nofollow.as_fd()).unwrap();
        let Registrable::Reopened(fd) = &again else {
            panic!("O_NOFOLLOW needs a new descriptor")
        };
        let f = flags(fd.as_fd());
        assert!(
            !f.intersects(OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK),
            "{f:?}"
        );
        assert_eq!(f & OFlag::O_ACCMODE, OFlag::O_RDWR);
        let st = nix::sys::stat::fstat(fd.as_fd()).unwrap();
        assert_eq!(st.st_ino, ino);
    }

    #[test]
    fn what_is_not_a_regular_file_is_refused_before_its_flags_change() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let e = registrable(f.as_fd()).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(flags(f.as_fd()).contains(OFlag::O_NONBLOCK));
    }
}
