//! USRBIO as the file layer's data path: how 3FS moves an object's bytes.
//!
//! Every byte USRBIO moves must lie in an iov, shared memory the FUSE process maps. Two ways
//! to get there:
//!
//! - **In place**, for a host region in a shared-memory file ([`MemoryRegion::shared_file`],
//!   a pool made with `MmapPool::shared`): `register` publishes the file to the FUSE process
//!   and wraps the region as an iov (`hf3fs_iovwrap`), and transfers on it hand the pool's
//!   own bytes to the rings.
//! - **Through a bounce iov**, for any other host memory: a write copies the object's
//!   segments into a lane's iov first, a read copies out after. The bytes copied are
//!   counted, and [`DataPath::region_path`] reports the copy with that live count.
//!
//! Rings live in *lanes* (a read ring, a write ring and, once a bounce needs it, an iov of
//! `iov_bytes`), one per worker at most, taken for a transfer and given back after
//! (`prep_io` is not thread-safe: a lane is used by one thread at a time). The file is
//! registered with `hf3fs_reg_fd` for each transfer and deregistered before the layer can
//! close it, so a reused descriptor number never meets a stale registration.
//!
//! If waiting for I/O on a pool's iov fails with I/Os in flight, the FUSE process may still
//! write that memory: the path then moves nothing more, and the region is kept allocated
//! for good.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hicache_core::raw::{CopyCounter, CopyReport};
use hicache_core::{ByteSize, Error, MemKind, MemoryRegion, RegionPath, Result};
use hicache_posix::data_path::{DataPath, Direction, Transfer};

use crate::error::UsrbioError;
use crate::usrbio::{Io, Iov, Ring, Usrbio, WrappedIov};

/// Bytes per I/O handed to a ring: a window is split into I/Os of at most this many, so the
/// FUSE process can work on them in parallel.
const IO_BYTES: usize = 1 << 20;

/// A ring of each direction and, once needed, a bounce iov; used by one thread at a time.
struct Lane {
    iov: Option<Iov>,
    reads: Ring,
    writes: Ring,
    /// The current transfer's pieces, reused from transfer to transfer.
    pieces: Vec<Piece>,
}

/// A registered region in shared memory, wrapped as an iov.
struct InPlace {
    // Dropped first: unpublished before the memory can go.
    wrapped: WrappedIov,
    region: MemoryRegion,
}

/// Where a piece of a transfer is in memory.
enum Place {
    /// In a wrapped region, at `offset` of its iov.
    InPlace { region: Arc<InPlace>, offset: usize },
    /// Elsewhere in host memory: copied through the bounce iov.
    Bounce {
        addr: u64,
        /// Where in the bounce iov, in the piece's round.
        at: usize,
    },
}

/// At most one I/O's worth of a transfer.
struct Piece {
    file_offset: u64,
    len: usize,
    place: Place,
}

/// The shape of each lane: its bounce iov and rings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneShape {
    /// Bytes of the bounce iov.
    pub(crate) iov_bytes: usize,
    /// Slots of each ring.
    pub(crate) entries: u32,
    /// I/Os the FUSE process may gather into a batch (0: each at once).
    pub(crate) io_batch: u32,
    /// How long it waits for a batch to fill, ms.
    pub(crate) io_batch_timeout_ms: u32,
}

/// USRBIO as a data path (see the module docs).
pub(crate) struct UsrbioPath {
    plugin: &'static str,
    usrbio: Arc<Usrbio>,
    mount: PathBuf,
    shape: LaneShape,
    idle: Mutex<Vec<Lane>>,
    /// Regions moved in place, by base address.
    in_place: RwLock<BTreeMap<usize, Arc<InPlace>>>,
    /// Why a shared region could not be wrapped, by base address.
    refused: Mutex<BTreeMap<usize, String>>,
    /// Bytes copied through bounce iovs.
    copied: CopyCounter,
    /// I/O on a region's memory was abandoned in flight: nothing moves any more.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for UsrbioPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsrbioPath")
            .field("usrbio", &self.usrbio)
            .field("mount", &self.mount)
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

fn io_error(e: UsrbioError) -> io::Error {
    match e.errno() {
        Some(n) => io::Error::new(io::Error::from_raw_os_error(n).kind(), e.to_string()),
        None => io::Error::other(e.to_string()),
    }
}

/// Bytes moved in order up to the first short or failed I/O, and that failure.
fn settle(
    lens: impl Iterator<Item = usize>,
    results: Vec<Result<u64, UsrbioError>>,
) -> (u64, Option<UsrbioError>) {
    let mut moved = 0u64;
    for (len, r) in lens.zip(results) {
        match r {
            Ok(m) => {
                moved += m.min(len as u64);
                if m < len as u64 {
                    return (moved, None);
                }
            }
            Err(e) => return (moved, Some(e)),
        }
    }
    (moved, None)
}

impl UsrbioPath {
    pub(crate) fn new(
        plugin: &'static str,
        usrbio: Arc<Usrbio>,
        mount: PathBuf,
        shape: LaneShape,
    ) -> Self {
        UsrbioPath {
            plugin,
            usrbio,
            mount,
            shape,
            idle: Mutex::new(Vec::new()),
            in_place: RwLock::new(BTreeMap::new()),
            refused: Mutex::new(BTreeMap::new()),
            copied: CopyCounter::new(),
            poisoned: AtomicBool::new(false),
        }
    }

    fn take_lane(&self) -> io::Result<Lane> {
        if let Some(lane) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(lane);
        }
        let lane = (|| {
            Ok::<_, UsrbioError>(Lane {
                iov: None,
                reads: self.ring(true)?,
                writes: self.ring(false)?,
                pieces: Vec::new(),
            })
        })();
        lane.map_err(io_error)
    }

    fn ring(&self, for_read: bool) -> Result<Ring, UsrbioError> {
        let s = self.shape;
        self.usrbio.create_batching_ring(
            &self.mount,
            s.entries,
            for_read,
            s.io_batch,
            s.io_batch_timeout_ms,
        )
    }

    fn give_back(&self, lane: Lane) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lane);
    }

    /// Splits `t` into pieces of at most one I/O each, in file order: in place where a
    /// segment lies in a wrapped region, else through the bounce iov.
    fn pieces(&self, t: &Transfer<'_>, out: &mut Vec<Piece>) {
        let map = self.in_place.read().unwrap_or_else(|e| e.into_inner());
        let bounce_most = IO_BYTES.min(self.shape.iov_bytes);
        out.clear();
        let mut at = t.offset();
        for (addr, len) in t.segments() {
            let wrapped = usize::try_from(addr).ok().and_then(|a| {
                let (_, r) = map.range(..=a).next_back()?;
                let end = r.region.addr() as u64 + r.region.len();
                (addr.checked_add(len as u64)? <= end).then(|| r.clone())
            });
            let most = if wrapped.is_some() {
                IO_BYTES
            } else {
                bounce_most
            };
            for step in (0..len).step_by(most) {
                let n = most.min(len - step);
                let place = match &wrapped {
                    Some(r) => Place::InPlace {
                        region: r.clone(),
                        offset: addr as usize - r.wrapped.base() + step,
                    },
                    None => Place::Bounce {
                        addr: addr + step as u64,
                        at: 0,
                    },
                };
                out.push(Piece {
                    file_offset: at + step as u64,
                    len: n,
                    place,
                });
            }
            at += len as u64;
        }
    }

    /// Moves one transfer: its in-place pieces straight between the file and the wrapped
    /// region, the others through `lane`'s bounce iov, up to `iov_bytes` of those a round.
    fn move_transfer(&self, lane: &mut Lane, t: &Transfer<'_>) -> Result<u64, UsrbioError> {
        let mut pieces = std::mem::take(&mut lane.pieces);
        self.pieces(t, &mut pieces);
        let moved = self.move_pieces(lane, t, &mut pieces);
        pieces.clear();
        lane.pieces = pieces;
        moved
    }

    fn move_pieces(
        &self,
        lane: &mut Lane,
        t: &Transfer<'_>,
        pieces: &mut [Piece],
    ) -> Result<u64, UsrbioError> {
        if lane.iov.is_none()
            && pieces
                .iter()
                .any(|p| matches!(p.place, Place::Bounce { .. }))
        {
            lane.iov = Some(self.usrbio.create_iov(&self.mount, self.shape.iov_bytes)?);
        }
        let fd = self.usrbio.register_fd(t.file())?;
        let direction = t.direction();
        let Lane {
            iov, reads, writes, ..
        } = lane;
        let ring = match direction {
            Direction::Read => reads,
            Direction::Write => writes,
        };
        let mut done = 0u64;
        let mut next = 0;
        while next < pieces.len() {
            // One round: pieces in order while the bounced ones fit the iov.
            let mut used = 0usize;
            let mut end = next;
            while end < pieces.len() {
                let len = pieces[end].len;
                if let Place::Bounce { at, .. } = &mut pieces[end].place {
                    if used + len > self.shape.iov_bytes {
                        break;
                    }
                    *at = used;
                    used += len;
                }
                end += 1;
            }
            let round = &pieces[next..end];
            if direction == Direction::Write && used > 0 {
                let Some(bounce) = iov.as_mut() else { break };
                let bytes = bounce.bytes_mut();
                for p in round {
                    if let Place::Bounce { addr, at } = p.place {
                        // SAFETY: the file layer's promise (`Transfer`): the segments lie in
                        // registered host memory reserved for this transfer.
                        let src = unsafe {
                            std::slice::from_raw_parts(addr as usize as *const u8, p.len)
                        };
                        bytes[at..at + p.len].copy_from_slice(src);
                    }
                }
                self.copied.add(used as u64);
            }
            let ios: Vec<(&Iov, Io<'_>)> = round
                .iter()
                .filter_map(|p| {
                    let (on, iov_offset) = match &p.place {
                        Place::InPlace { region, offset } => (region.wrapped.iov(), *offset),
                        Place::Bounce { at, .. } => (iov.as_ref()?, *at),
                    };
                    Some((
                        on,
                        Io {
                            file: &fd,
                            iov_offset,
                            len: p.len,
                            file_offset: p.file_offset,
                        },
                    ))
                })
                .collect();
            // SAFETY: in-place pieces lie in wrapped regions and are reserved for this
            // transfer until it returns (the file layer's promise, `Transfer`); the bounce
            // iov is this lane's, which this thread holds.
            let results = unsafe { ring.run_in_place(&ios) };
            let results = match results {
                Ok(r) => r,
                Err(e) => {
                    if round
                        .iter()
                        .any(|p| matches!(p.place, Place::InPlace { .. }))
                    {
                        self.poison(round);
                    }
                    return Err(e);
                }
            };
            let (moved, failure) = settle(ios.iter().map(|(_, io)| io.len), results);
            if direction == Direction::Read && used > 0 {
                let Some(bounce) = iov.as_ref() else { break };
                let bytes = bounce.bytes();
                let mut left = moved;
                let mut copied = 0u64;
                for p in round {
                    let got = usize::try_from(left).unwrap_or(usize::MAX).min(p.len);
                    if got == 0 {
                        break;
                    }
                    if let Place::Bounce { addr, at } = p.place {
                        // SAFETY: as for writes, for the segments a read fills.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(addr as usize as *mut u8, got)
                        };
                        dst.copy_from_slice(&bytes[at..at + got]);
                        copied += got as u64;
                    }
                    left -= got as u64;
                }
                self.copied.add(copied);
            }
            done += moved;
            let asked: u64 = round.iter().map(|p| p.len as u64).sum();
            match failure {
                Some(e) if done == 0 => return Err(e),
                Some(_) => break,
                None if moved < asked => break,
                None => {}
            }
            next = end;
        }
        Ok(done)
    }

    /// I/O on wrapped regions was abandoned in flight: nothing moves any more, and those
    /// regions are never freed.
    fn poison(&self, round: &[Piece]) {
        self.poisoned.store(true, Ordering::Release);
        tracing::error!(
            plugin = self.plugin,
            "USRBIO I/O abandoned in flight on a registered region; the backend stops moving data and keeps that memory allocated for good"
        );
        for p in round {
            if let Place::InPlace { region, .. } = &p.place {
                std::mem::forget(region.clone());
            }
        }
    }

    fn check_poisoned(&self) -> io::Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(io::Error::other(format!(
                "{}: USRBIO I/O on a registered region was abandoned in flight; this backend moves no more data (reopen it)",
                self.plugin
            )));
        }
        Ok(())
    }
}

impl DataPath for UsrbioPath {
    fn accepts(&self, kind: MemKind) -> bool {
        kind == MemKind::Host
    }

    fn register(&self, region: &MemoryRegion) -> Result<()> {
        let Some(file) = region.shared_file() else {
            // Bounced: host memory needs no registration with USRBIO.
            return Ok(());
        };
        let len = usize::try_from(region.len()).unwrap_or(usize::MAX);
        // SAFETY: a region made by `shared_host` is exactly its file's shared mapping from
        // the start, kept mapped by the clone held beside the iov.
        let wrapped = unsafe {
            self.usrbio
                .wrap_iov(&self.mount, file.path(), region.addr() as *mut u8, len)
        };
        match wrapped {
            Ok(wrapped) => {
                tracing::debug!(plugin = self.plugin, link = %wrapped.link().display(), "registered region moves in place");
                self.in_place
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(
                        region.addr(),
                        Arc::new(InPlace {
                            wrapped,
                            region: region.clone(),
                        }),
                    );
            }
            Err(e) => {
                tracing::warn!(plugin = self.plugin, error = %e, "a shared-memory region cannot be wrapped as an iov; it is copied through bounce iovs");
                self.refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(region.addr(), e.to_string());
            }
        }
        Ok(())
    }

    fn deregister(&self, region: &MemoryRegion) -> Result<()> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&region.addr());
        let mut map = self.in_place.write().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = map.get(&region.addr()) else {
            return Ok(());
        };
        if !entry.region.same_region(region) {
            return Ok(());
        }
        let entry = map.remove(&region.addr());
        drop(map);
        if self.poisoned.load(Ordering::Acquire) {
            // I/O abandoned in flight may still reach this memory: it is never freed.
            std::mem::forget(entry);
            return Err(Error::backend(
                self.plugin,
                "USRBIO I/O was abandoned in flight: the region's memory is kept allocated for good",
            ));
        }
        drop(entry);
        Ok(())
    }

    fn call(&self, direction: Direction) -> &'static str {
        match direction {
            Direction::Read => "hf3fs read",
            Direction::Write => "hf3fs write",
        }
    }

    fn transfer(&self, transfer: &Transfer<'_>) -> io::Result<u64> {
        self.check_poisoned()?;
        let mut lane = self.take_lane()?;
        let moved = self.move_transfer(&mut lane, transfer);
        if matches!(moved, Err(UsrbioError::Abandoned { .. })) {
            // Its I/O may still be in flight: never reused, never destroyed (`Ring::run`
            // already keeps the iov and ring from being destroyed on drop).
            drop(lane);
        } else {
            self.give_back(lane);
        }
        moved.map_err(io_error)
    }

    fn region_path(&self, region: &MemoryRegion) -> RegionPath {
        let map = self.in_place.read().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get(&region.addr())
            && entry.region.same_region(region)
        {
            return RegionPath::in_place(format!(
                "USRBIO on the region's shared memory, published as {}",
                entry.wrapped.link().display()
            ));
        }
        let why = match self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&region.addr())
        {
            Some(e) => format!("its shared memory could not be wrapped as an iov: {e}"),
            None => "the memory is not in a shared-memory file; a pool made with MmapPool::shared moves in place".to_string(),
        };
        RegionPath::Copied(CopyReport {
            through: format!(
                "{} USRBIO bounce iovs",
                ByteSize(self.shape.iov_bytes as u64)
            ),
            why,
            bytes: self.copied.clone(),
        })
    }

    fn describe(&self) -> String {
        format!(
            "USRBIO rings on {} (pools in shared memory in place, other memory through {} bounce iovs; {}{})",
            self.mount.display(),
            ByteSize(self.shape.iov_bytes as u64),
            self.usrbio.path().display(),
            if self.usrbio.is_stand_in() {
                ", the test stand-in"
            } else {
                ""
            }
        )
    }
}

impl Drop for UsrbioPath {
    fn drop(&mut self) {
        let map = std::mem::take(self.in_place.get_mut().unwrap_or_else(|e| e.into_inner()));
        if *self.poisoned.get_mut() {
            // I/O abandoned in flight may still reach these regions: never freed.
            std::mem::forget(map);
        }
    }
}
