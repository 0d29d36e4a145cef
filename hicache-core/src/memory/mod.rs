//! Memory that backends may read and write: registrations, slices of them, aligned buffers.
//!
//! A transfer never carries a raw pointer. It names a [`Slice`] of a region that was handed to
//! the backend with [`StorageBackend::register`](crate::raw::StorageBackend::register), so memory
//! the backend does not know is a typed error before any I/O, not a late runtime failure.
//!
//! Regions, their pins and the region table stay in this one file (about 700 lines), on
//! purpose: every `unsafe` that hands a pointer to I/O relies on the pin rules written here,
//! and a reader checks those rules in one place. Alignment and the aligned buffer live in
//! `aligned`.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use tokio::sync::Notify;

use crate::error::{Error, Result};

pub use crate::region_id::RegionId;

mod aligned;
mod anonymous;
mod shared;

pub use aligned::{AlignedBuf, align_up, check_aligned};
pub use anonymous::HostPages;
pub(crate) use shared::prefault;
pub use shared::{SHM_DIR, SharedFile};

/// Where a region's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemKind {
    /// Host DRAM, addressable by the CPU.
    Host,
    /// GPU memory of the given CUDA device; only GPU-direct plugins can use it.
    Device {
        /// CUDA device ordinal.
        device: u32,
    },
}

impl fmt::Display for MemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemKind::Host => f.write_str("host"),
            MemKind::Device { device } => write!(f, "device:{device}"),
        }
    }
}

/// Anything that owns memory a region may point into; kept alive as long as the region.
pub trait MemoryOwner: Send + Sync + 'static {}
impl<T: Send + Sync + 'static> MemoryOwner for T {}

/// How a transfer uses a range of memory: the data-race rule of registered memory.
///
/// Any number of [`Access::Read`] pins may overlap; an [`Access::Write`] pin overlaps no other
/// pin. A pin that would break the rule is refused with [`Error::MemoryBusy`] instead of
/// letting two transfers race on the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The bytes are read (the source of a storage write).
    Read,
    /// The bytes are written (the target of a storage read).
    Write,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Read => "read",
            Access::Write => "write",
        })
    }
}

/// The pinned ranges of one region.
///
/// A `Vec` kept sorted, not a tree: it keeps its capacity as pins come and go, so pinning
/// allocates nothing once the set has grown to the most pins held at once (a `BTreeMap`
/// allocates and frees nodes as it fills and empties: about one allocation per pinned page
/// in `hicache bench`). Inserting and removing move at most the set's entries, a few KiB
/// for the largest batches.
#[derive(Debug, Default)]
struct PinSet {
    /// ((start, sequence), (end, access)), sorted by key.
    ranges: Vec<((u64, u64), (u64, Access))>,
    next: u64,
    /// Longest range ever pinned: bounds how far back an overlapping range may start.
    longest: u64,
    /// Threads blocked in [`MemoryRegion::wait_idle_blocking`]. The last unpin notifies the
    /// condvar only when there are some: std's `Condvar::notify_all` makes a system call
    /// whether or not anyone waits, and a staging region goes idle once per page.
    idle_waiters: usize,
}

impl PinSet {
    /// The access of a pinned range that `start..end` under `access` would conflict with.
    fn conflict(&self, start: u64, end: u64, access: Access) -> Option<Access> {
        let lo = start.saturating_sub(self.longest);
        let from = self.ranges.partition_point(|(k, _)| *k < (lo, 0));
        self.ranges[from..]
            .iter()
            .take_while(|(k, _)| *k < (end, 0))
            .map(|&(_, (e, a))| (e, a))
            .find(|&(e, a)| e > start && (access == Access::Write || a == Access::Write))
            .map(|(_, a)| a)
    }

    fn insert(&mut self, key: (u64, u64), range: (u64, Access)) {
        let at = self.ranges.partition_point(|(k, _)| *k < key);
        self.ranges.insert(at, (key, range));
    }

    fn remove(&mut self, key: (u64, u64)) {
        if let Ok(at) = self.ranges.binary_search_by(|(k, _)| k.cmp(&key)) {
            self.ranges.remove(at);
        }
    }
}

struct RegionInner {
    /// Start of the memory; dereferenced only through pins.
    ptr: *mut u8,
    len: u64,
    kind: MemKind,
    pins: Mutex<PinSet>,
    idle: Condvar,
    released: Notify,
    /// The shared-memory file the bytes are, when made by `shared_host`.
    shared: Option<SharedFile>,
    _owner: Option<Arc<dyn MemoryOwner>>,
}

// SAFETY: the region's memory is reached only through pins, which enforce shared reads and
// exclusive writes across threads; the constructors' contracts (or ownership, for
// `from_aligned`) rule out any other access.
unsafe impl Send for RegionInner {}
// SAFETY: as above.
unsafe impl Sync for RegionInner {}

/// A contiguous range of memory handed to a backend for transfers.
///
/// Cloning is cheap and every clone is the same region: the owner (if any) and the pins are
/// shared. Transfers and copies reach the bytes only through pins ([`MemoryRegion::source`],
/// [`MemoryRegion::target`], or a backend's [`RegionTable`]), which keep the memory alive
/// while they live, enforce the [`Access`] rule, and make
/// [`RegionTable::remove`] refuse with [`Error::RegionBusy`] until the last one is dropped.
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<RegionInner>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &self.inner.ptr)
            .field("len", &self.inner.len)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl MemoryRegion {
    fn build(ptr: *mut u8, len: u64, kind: MemKind, owner: Option<Arc<dyn MemoryOwner>>) -> Self {
        MemoryRegion {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                kind,
                pins: Mutex::new(PinSet::default()),
                idle: Condvar::new(),
                released: Notify::new(),
                shared: None,
                _owner: owner,
            }),
        }
    }

    /// A region over memory whose lifetime is tied to `owner`.
    ///
    /// # Safety
    /// - `addr..addr+len` must be valid for reads and writes of the given kind for as long as
    ///   `owner` lives.
    /// - While the region (any clone of it, or any pin taken from it) lives, those bytes may
    ///   be accessed only through this region: no Rust reference to them, no other
    ///   `MemoryRegion` over them, and no other code writing them.
    pub unsafe fn with_owner(
        addr: *mut u8,
        len: u64,
        kind: MemKind,
        owner: Arc<dyn MemoryOwner>,
    ) -> Self {
        Self::build(addr, len, kind, Some(owner))
    }

    /// A region over memory owned elsewhere (an engine's tensor, cudaMalloc'd memory).
    ///
    /// # Safety
    /// - `addr..addr+len` must stay valid for reads and writes until every clone of the
    ///   region is dropped and every backend it was registered with has deregistered it
    ///   (deregistration fails with [`Error::RegionBusy`] while transfers still use it).
    /// - Meanwhile those bytes may be accessed only through this region: no Rust reference to
    ///   them, no other `MemoryRegion` over them, and no other code writing them.
    pub unsafe fn from_raw(addr: *mut u8, len: u64, kind: MemKind) -> Self {
        Self::build(addr, len, kind, None)
    }

    /// A region that takes ownership of an aligned buffer.
    pub fn from_aligned(mut buf: AlignedBuf) -> Self {
        let addr = buf.as_mut_ptr();
        let len = buf.len() as u64;
        // SAFETY: the region owns the buffer, so nothing else can reach its bytes, and the
        // allocation lives as long as the last clone or pin of the region.
        unsafe { Self::with_owner(addr, len, MemKind::Host, Arc::new(buf)) }
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.inner.ptr as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Where the bytes live.
    pub fn kind(&self) -> MemKind {
        self.inner.kind
    }

    /// Whether two handles are the same region.
    pub fn same_region(&self, other: &MemoryRegion) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Number of live pins (transfers and copies using the region).
    pub fn in_flight(&self) -> usize {
        self.lock_pins().ranges.len()
    }

    /// Pins `offset..offset+len` for reading. `what` names the caller in errors.
    pub fn source(&self, offset: u64, len: u64, what: &str) -> Result<SourceSlice> {
        self.pin(offset, len, Access::Read, || what.to_string())
            .map(|pinned| SourceSlice { pinned })
    }

    /// Pins `offset..offset+len` for writing. `what` names the caller in errors.
    pub fn target(&self, offset: u64, len: u64, what: &str) -> Result<TargetSlice> {
        self.pin(offset, len, Access::Write, || what.to_string())
            .map(|pinned| TargetSlice { pinned })
    }

    /// Waits (async) until no pin is held.
    pub async fn wait_idle(&self) {
        loop {
            let mut released = std::pin::pin!(self.inner.released.notified());
            released.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            released.await;
        }
    }

    /// Waits (blocking the thread) until no pin is held.
    pub fn wait_idle_blocking(&self) {
        let mut pins = self.lock_pins();
        if pins.ranges.is_empty() {
            return;
        }
        // Counted under the lock the last unpin takes, so it cannot miss this waiter.
        pins.idle_waiters += 1;
        while !pins.ranges.is_empty() {
            pins = self
                .inner
                .idle
                .wait(pins)
                .unwrap_or_else(|e| e.into_inner());
        }
        pins.idle_waiters -= 1;
    }

    /// Waits (async) until `offset..offset+len` could be pinned for `access` (no conflicting
    /// pin is held). Another caller may pin the range right after; the pin itself decides.
    pub async fn wait_available(&self, offset: u64, len: u64, access: Access) {
        let end = offset.saturating_add(len);
        loop {
            let mut released = std::pin::pin!(self.inner.released.notified());
            released.as_mut().enable();
            if self.lock_pins().conflict(offset, end, access).is_none() {
                return;
            }
            released.await;
        }
    }

    fn lock_pins(&self) -> std::sync::MutexGuard<'_, PinSet> {
        self.inner.pins.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pin(
        &self,
        offset: u64,
        len: u64,
        access: Access,
        what: impl Fn() -> String,
    ) -> Result<Pinned> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.inner.len)
            .ok_or_else(|| Error::InvalidBatch {
                reason: format!(
                    "{}: [offset {offset}, len {len}] is outside a region of {} bytes",
                    what(),
                    self.inner.len
                ),
            })?;
        let mut pins = self.lock_pins();
        if let Some(held) = pins.conflict(offset, end, access) {
            return Err(Error::MemoryBusy {
                what: what(),
                offset,
                len,
                region_len: self.inner.len,
                held: format!(
                    "asked to {access}, a transfer {} them; {} pin(s) on the region",
                    match held {
                        Access::Read => "reads",
                        Access::Write => "writes",
                    },
                    pins.ranges.len()
                ),
            });
        }
        let key = (offset, pins.next);
        pins.next += 1;
        pins.longest = pins.longest.max(len);
        pins.insert(key, (end, access));
        drop(pins);
        Ok(Pinned {
            region: self.clone(),
            key,
            // In bounds: offset + len <= region length, checked above.
            ptr: self.inner.ptr.wrapping_add(offset as usize),
            len: len as usize,
        })
    }
}

/// A pinned range: keeps its region alive and its bytes reserved until dropped.
struct Pinned {
    region: MemoryRegion,
    key: (u64, u64),
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is only dereferenced under the pin's access rule (reads shared, writes
// exclusive), and the memory it points into is owned by or promised to the region, which is
// Send + Sync by construction (see `RegionInner`).
unsafe impl Send for Pinned {}
// SAFETY: as above; `&Pinned` only reads.
unsafe impl Sync for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        let inner = &self.region.inner;
        let mut pins = inner.pins.lock().unwrap_or_else(|e| e.into_inner());
        pins.remove(self.key);
        let idle = pins.ranges.is_empty() && pins.idle_waiters > 0;
        drop(pins);
        if idle {
            inner.idle.notify_all();
        }
        inner.released.notify_waiters();
    }
}

impl fmt::Debug for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("kind", &self.region.kind())
            .finish()
    }
}

macro_rules! pinned_accessors {
    () => {
        /// Start address.
        pub fn addr(&self) -> usize {
            self.pinned.ptr as usize
        }

        /// Length in bytes.
        pub fn len(&self) -> usize {
            self.pinned.len
        }

        /// Whether the range is empty.
        pub fn is_empty(&self) -> bool {
            self.pinned.len == 0
        }

        /// Where the bytes live.
        pub fn kind(&self) -> MemKind {
            self.pinned.region.kind()
        }

        /// The region the range belongs to.
        pub fn region(&self) -> &MemoryRegion {
            &self.pinned.region
        }

        /// The range as a raw pointer, for syscalls and DMA engines; valid while `self` lives.
        pub fn as_ptr(&self) -> *const u8 {
            self.pinned.ptr.cast_const()
        }

        /// The range as an iovec for vectored syscalls; valid while `self` lives.
        pub fn iovec(&self) -> libc::iovec {
            libc::iovec {
                iov_base: self.pinned.ptr.cast(),
                iov_len: self.pinned.len,
            }
        }

        /// The bytes, when they are host memory.
        pub fn host_bytes(&self) -> Result<&[u8]> {
            self.check_host()?;
            // SAFETY: the pin keeps the memory alive and excludes every conflicting writer
            // (the region's contract routes all access through pins); host memory is CPU
            // addressable.
            Ok(unsafe { std::slice::from_raw_parts(self.as_ptr(), self.pinned.len) })
        }

        fn check_host(&self) -> Result<()> {
            match self.kind() {
                MemKind::Host => Ok(()),
                kind => Err(Error::Unsupported {
                    component: "memory".into(),
                    operation: format!("CPU access to {kind} memory"),
                }),
            }
        }
    };
}

/// A range of registered memory pinned for reading: the source of a storage write.
#[derive(Debug)]
pub struct SourceSlice {
    pinned: Pinned,
}

impl SourceSlice {
    pinned_accessors!();

    /// Turns a host range into an owner for zero-copy buffers (`bytes::Bytes::from_owner`):
    /// the pin lives as long as the buffer.
    pub fn into_host_bytes(self) -> Result<HostBytes> {
        self.check_host()?;
        Ok(HostBytes(self))
    }
}

/// Pinned host bytes that can be shared as `&[u8]` for as long as they live.
#[derive(Debug)]
pub struct HostBytes(SourceSlice);

impl AsRef<[u8]> for HostBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: checked to be host memory when built; pinned for reading.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), self.0.len()) }
    }
}

/// A range of registered memory pinned for writing: the target of a storage read.
#[derive(Debug)]
pub struct TargetSlice {
    pinned: Pinned,
}

impl TargetSlice {
    pinned_accessors!();

    /// The range as a raw mutable pointer, for syscalls and DMA engines.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.pinned.ptr
    }

    /// The bytes, mutably, when they are host memory.
    pub fn host_bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.check_host()?;
        // SAFETY: the write pin excludes every other pin on these bytes, the memory is alive
        // while the pin lives, and `&mut self` makes this the only reference.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.pinned.len) })
    }

    /// Copies `src` into the range at `at`.
    pub fn copy_from(&mut self, at: usize, src: &[u8]) -> Result<()> {
        let len = self.pinned.len;
        let dst = self.host_bytes_mut()?;
        let end = at
            .checked_add(src.len())
            .filter(|&e| e <= len)
            .ok_or_else(|| Error::InvalidBatch {
                reason: format!(
                    "copy of {} bytes at offset {at} exceeds a pinned range of {len} bytes",
                    src.len()
                ),
            })?;
        dst[at..end].copy_from_slice(src);
        Ok(())
    }
}

/// Copies `data` into `targets`, in order: the last step of a read that pinned its targets
/// before it looked for the object. `data` must be exactly as long as the targets together
/// (else [`Error::InvalidBatch`] naming `backend`).
pub fn scatter_into(backend: &str, targets: &mut [TargetSlice], data: &[u8]) -> Result<()> {
    let total: usize = targets.iter().map(TargetSlice::len).sum();
    if total != data.len() {
        return Err(Error::InvalidBatch {
            reason: format!(
                "backend {backend}: {} bytes to scatter into segments of {total} bytes",
                data.len()
            ),
        });
    }
    let mut at = 0;
    for t in targets {
        let n = t.len();
        t.copy_from(0, &data[at..at + n])?;
        at += n;
    }
    Ok(())
}

/// A byte range of a registered region: how a transfer names memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slice {
    /// The registration.
    pub region: RegionId,
    /// Offset inside the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Slice {
    /// A slice of `len` bytes at `offset` of `region`.
    pub const fn new(region: RegionId, offset: u64, len: u64) -> Self {
        Slice {
            region,
            offset,
            len,
        }
    }
}

/// The bookkeeping of registrations every backend needs: ids, lookup, bounds checks, pins.
///
/// Backends embed one and pin every slice of a batch with [`RegionTable::source`] (memory a
/// storage write reads) or [`RegionTable::target`] (memory a storage read fills) before
/// issuing I/O, and keep the pins until the I/O has ended — also when the caller's future
/// was dropped. The errors name the backend, region, offset and length.
#[derive(Debug)]
pub struct RegionTable {
    backend: String,
    next: AtomicU64,
    regions: RwLock<HashMap<RegionId, MemoryRegion>>,
}

impl RegionTable {
    /// An empty table for the named backend.
    pub fn new(backend: impl Into<String>) -> Self {
        RegionTable {
            backend: backend.into(),
            next: AtomicU64::new(1),
            regions: RwLock::new(HashMap::new()),
        }
    }

    /// Adds a region and returns its id.
    pub fn insert(&self, region: MemoryRegion) -> RegionId {
        let id = RegionId(self.next.fetch_add(1, Ordering::Relaxed));
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, region);
        id
    }

    /// The plugin name its errors are reported under.
    pub(crate) fn backend_name(&self) -> &str {
        &self.backend
    }

    /// Removes a region. An unknown id is [`Error::UnregisteredRegion`]; a region that
    /// transfers still use is [`Error::RegionBusy`] and stays registered.
    pub fn remove(&self, id: RegionId) -> Result<MemoryRegion> {
        use std::collections::hash_map::Entry;
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let Entry::Occupied(entry) = regions.entry(id) else {
            return Err(Error::UnregisteredRegion {
                component: self.backend.clone().into(),
                region: id,
            });
        };
        // The backend's own pins are taken under this table's read lock (see `pin`), so none
        // can appear while the write lock is held. Pins the region's owner takes directly
        // (the connector checksumming a page) also count: the memory is still in use.
        let in_flight = entry.get().in_flight();
        if in_flight > 0 {
            return Err(Error::RegionBusy {
                component: self.backend.clone().into(),
                region: id,
                in_flight,
            });
        }
        Ok(entry.remove())
    }

    /// The region behind an id.
    pub fn get(&self, id: RegionId) -> Option<MemoryRegion> {
        self.regions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.regions.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pins `slice` for reading (the source of a storage write).
    pub fn source(&self, slice: &Slice) -> Result<SourceSlice> {
        self.pin(slice, Access::Read)
            .map(|pinned| SourceSlice { pinned })
    }

    /// Pins `slice` for writing (the target of a storage read).
    pub fn target(&self, slice: &Slice) -> Result<TargetSlice> {
        self.pin(slice, Access::Write)
            .map(|pinned| TargetSlice { pinned })
    }

    /// [`RegionTable::source`], also checking address and length against a direct-I/O
    /// alignment.
    pub fn source_aligned(&self, slice: &Slice, align: u64, what: &str) -> Result<SourceSlice> {
        let s = self.source(slice)?;
        check_aligned(&self.backend, what, s.addr() as u64, s.len() as u64, align)?;
        Ok(s)
    }

    /// [`RegionTable::target`], also checking address and length against a direct-I/O
    /// alignment.
    pub fn target_aligned(&self, slice: &Slice, align: u64, what: &str) -> Result<TargetSlice> {
        let t = self.target(slice)?;
        check_aligned(&self.backend, what, t.addr() as u64, t.len() as u64, align)?;
        Ok(t)
    }

    /// Copies the bytes of `segments`, in order, into one buffer (host memory only).
    pub fn gather(&self, segments: &[Slice]) -> Result<Vec<u8>> {
        let pinned = segments
            .iter()
            .map(|s| self.source(s))
            .collect::<Result<Vec<_>>>()?;
        let total = pinned.iter().map(SourceSlice::len).sum();
        let mut out = Vec::with_capacity(total);
        for p in &pinned {
            out.extend_from_slice(p.host_bytes()?);
        }
        Ok(out)
    }

    /// Copies `data` into `segments`, in order (host memory only). `data` must be exactly as
    /// long as the segments together.
    pub fn scatter(&self, segments: &[Slice], data: &[u8]) -> Result<()> {
        let mut pinned = segments
            .iter()
            .map(|s| self.target(s))
            .collect::<Result<Vec<_>>>()?;
        scatter_into(&self.backend, &mut pinned, data)
    }

    fn pin(&self, slice: &Slice, access: Access) -> Result<Pinned> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let region = regions
            .get(&slice.region)
            .ok_or_else(|| Error::UnregisteredRegion {
                component: self.backend.clone().into(),
                region: slice.region,
            })?;
        let end = slice.offset.checked_add(slice.len);
        if end.is_none_or(|end| end > region.len()) {
            return Err(Error::SliceOutOfRange {
                component: self.backend.clone().into(),
                region: slice.region,
                offset: slice.offset,
                len: slice.len,
                region_len: region.len(),
            });
        }
        region.pin(slice.offset, slice.len, access, || {
            format!("backend {}, region {}", self.backend, slice.region)
        })
    }
}

#[cfg(test)]
mod tests;
