//! Memory that backends may read and write: registrations, slices of them, aligned buffers.
//!
//! A transfer never carries a raw pointer. It names a [`Slice`] of a region that was handed to
//! the backend with [`StorageBackend::register`](crate::StorageBackend::register), so memory
//! the backend does not know is a typed error before any I/O, not a late runtime failure.

use std::alloc::Layout;
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::error::{Error, Result};

/// Identifies one registration inside one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u64);

impl fmt::Display for RegionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

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

/// A contiguous range of memory handed to a backend for transfers.
///
/// Cloning is cheap; the owner (if any) is kept alive by every clone.
#[derive(Clone)]
pub struct MemoryRegion {
    addr: usize,
    len: u64,
    kind: MemKind,
    _owner: Option<Arc<dyn MemoryOwner>>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("kind", &self.kind)
            .finish()
    }
}

impl MemoryRegion {
    /// A region over memory whose lifetime is tied to `owner`.
    ///
    /// # Safety
    /// `addr..addr+len` must be valid for reads and writes of the given kind for as long as
    /// `owner` lives, and nothing else may access bytes while a transfer on them is in flight.
    pub unsafe fn with_owner(
        addr: *mut u8,
        len: u64,
        kind: MemKind,
        owner: Arc<dyn MemoryOwner>,
    ) -> Self {
        MemoryRegion {
            addr: addr as usize,
            len,
            kind,
            _owner: Some(owner),
        }
    }

    /// A region over memory owned elsewhere (an engine's tensor, cudaMalloc'd memory).
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid for reads and writes until the region is deregistered
    /// from every backend it was registered with, and nothing else may access bytes while a
    /// transfer on them is in flight.
    pub unsafe fn from_raw(addr: *mut u8, len: u64, kind: MemKind) -> Self {
        MemoryRegion {
            addr: addr as usize,
            len,
            kind,
            _owner: None,
        }
    }

    /// A region covering a whole aligned buffer, keeping the buffer alive.
    pub fn from_aligned(buf: Arc<AlignedBuf>) -> Self {
        let addr = buf.as_ptr();
        let len = buf.len() as u64;
        // SAFETY: the Arc keeps the allocation alive for the region's lifetime; AlignedBuf
        // hands out no references, so bytes are only touched through regions and raw copies.
        unsafe { Self::with_owner(addr, len, MemKind::Host, buf) }
    }

    /// Start address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the bytes live.
    pub fn kind(&self) -> MemKind {
        self.kind
    }
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

/// A slice resolved against its registration: an address a backend can hand to the OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedSlice {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Where the bytes live.
    pub kind: MemKind,
}

impl ResolvedSlice {
    /// The bytes as a raw pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

/// The bookkeeping of registrations every backend needs: ids, lookup, bounds checks.
///
/// Backends embed one and call [`RegionTable::resolve`] on every slice of a batch before
/// issuing I/O; the errors it returns name the backend, region, offset and length.
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

    /// Removes a region; an unknown id is an error naming it.
    pub fn remove(&self, id: RegionId) -> Result<MemoryRegion> {
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .ok_or_else(|| Error::UnregisteredRegion {
                backend: self.backend.clone(),
                region: id,
            })
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

    /// Checks that `slice` lies inside a live registration and returns its address.
    pub fn resolve(&self, slice: &Slice) -> Result<ResolvedSlice> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let region = regions
            .get(&slice.region)
            .ok_or_else(|| Error::UnregisteredRegion {
                backend: self.backend.clone(),
                region: slice.region,
            })?;
        let end = slice.offset.checked_add(slice.len);
        if end.is_none_or(|end| end > region.len) {
            return Err(Error::SliceOutOfRange {
                backend: self.backend.clone(),
                region: slice.region,
                offset: slice.offset,
                len: slice.len,
                region_len: region.len,
            });
        }
        Ok(ResolvedSlice {
            addr: region.addr + slice.offset as usize,
            len: slice.len as usize,
            kind: region.kind,
        })
    }

    /// Resolves a slice and checks address and length against a direct-I/O alignment.
    pub fn resolve_aligned(&self, slice: &Slice, align: u64, what: &str) -> Result<ResolvedSlice> {
        let r = self.resolve(slice)?;
        check_aligned(&self.backend, what, r.addr as u64, r.len as u64, align)?;
        Ok(r)
    }
}

/// Fails with [`Error::Misaligned`] unless `addr` and `len` are multiples of `align`.
pub fn check_aligned(backend: &str, what: &str, addr: u64, len: u64, align: u64) -> Result<()> {
    if align > 1 && (addr % align != 0 || len % align != 0) {
        return Err(Error::Misaligned {
            backend: backend.to_string(),
            what: what.to_string(),
            align,
            addr,
            len,
        });
    }
    Ok(())
}

/// Rounds `n` up to a multiple of `align` (a power of two or any positive number).
pub const fn align_up(n: u64, align: u64) -> u64 {
    if align <= 1 {
        n
    } else {
        n.div_ceil(align) * align
    }
}

/// An owned, zeroed, aligned heap buffer: the one type for direct-I/O staging memory.
///
/// It hands out no references; bytes move in and out through [`AlignedBuf::copy_from`] and
/// [`AlignedBuf::copy_to`] or through a [`MemoryRegion`], so a buffer shared with a backend
/// never aliases a Rust reference.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively and exposes it only through raw copies
// whose callers uphold the no-concurrent-access rule documented on MemoryRegion.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; &AlignedBuf gives no access to the bytes without raw-pointer copies.
unsafe impl Sync for AlignedBuf {}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("addr", &self.ptr)
            .field("len", &self.layout.size())
            .field("align", &self.layout.align())
            .finish()
    }
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    pub fn zeroed(len: usize, align: usize) -> Result<Self> {
        let layout =
            Layout::from_size_align(len.max(1), align.max(1)).map_err(|e| Error::InvalidPool {
                reason: format!("cannot allocate {len} bytes aligned to {align}: {e}"),
            })?;
        // SAFETY: layout has non-zero size (len.max(1)).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::InvalidPool {
            reason: format!("out of memory allocating {len} bytes aligned to {align}"),
        })?;
        Ok(AlignedBuf { ptr, layout })
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    /// Alignment of the start address.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// # Panics
    /// Never: an out-of-range copy is an error.
    pub fn copy_from(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        // SAFETY: range checked above; the buffer is exclusively ours and src cannot overlap
        // it because we never hand out references into it.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Copies bytes at `offset` out into `dst`.
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        // SAFETY: range checked above; dst is a distinct &mut borrow, so no overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(Error::InvalidBatch {
                reason: format!(
                    "copy of {len} bytes at offset {offset} exceeds aligned buffer of {} bytes",
                    self.len()
                ),
            });
        }
        Ok(())
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout in `zeroed`.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_checks_registration_and_bounds() {
        let table = RegionTable::new("TEST");
        let buf = Arc::new(AlignedBuf::zeroed(8192, 4096).unwrap());
        let id = table.insert(MemoryRegion::from_aligned(buf.clone()));
        let ok = table.resolve(&Slice::new(id, 4096, 4096)).unwrap();
        assert_eq!(ok.addr, buf.as_ptr() as usize + 4096);

        let err = table.resolve(&Slice::new(id, 4096, 4097)).unwrap_err();
        assert!(matches!(
            err,
            Error::SliceOutOfRange {
                offset: 4096,
                len: 4097,
                region_len: 8192,
                ..
            }
        ));
        let err = table.resolve(&Slice::new(id, u64::MAX, 2)).unwrap_err();
        assert!(matches!(err, Error::SliceOutOfRange { .. }));
        let err = table.resolve(&Slice::new(RegionId(99), 0, 1)).unwrap_err();
        assert!(matches!(
            err,
            Error::UnregisteredRegion {
                region: RegionId(99),
                ..
            }
        ));

        table.remove(id).unwrap();
        assert!(matches!(
            table.resolve(&Slice::new(id, 0, 1)),
            Err(Error::UnregisteredRegion { .. })
        ));
        assert!(table.remove(id).is_err());
    }

    #[test]
    fn alignment_checks() {
        let table = RegionTable::new("TEST");
        let buf = Arc::new(AlignedBuf::zeroed(8192, 4096).unwrap());
        let id = table.insert(MemoryRegion::from_aligned(buf));
        assert!(
            table
                .resolve_aligned(&Slice::new(id, 0, 4096), 4096, "s")
                .is_ok()
        );
        let err = table
            .resolve_aligned(&Slice::new(id, 1, 4096), 4096, "segment 0 of key k")
            .unwrap_err();
        assert!(err.to_string().contains("segment 0 of key k"), "{err}");
        assert!(
            table
                .resolve_aligned(&Slice::new(id, 0, 100), 4096, "s")
                .is_err()
        );
        assert!(
            table
                .resolve_aligned(&Slice::new(id, 1, 100), 1, "s")
                .is_ok()
        );
        assert_eq!(align_up(1, 4096), 4096);
        assert_eq!(align_up(4096, 4096), 4096);
        assert_eq!(align_up(5, 1), 5);
    }

    #[test]
    fn aligned_buf_copies_are_bounds_checked() {
        let buf = AlignedBuf::zeroed(100, 4096).unwrap();
        assert_eq!(buf.as_ptr() as usize % 4096, 0);
        buf.copy_from(90, &[7; 10]).unwrap();
        let mut out = [0u8; 10];
        buf.copy_to(90, &mut out).unwrap();
        assert_eq!(out, [7; 10]);
        assert!(buf.copy_from(95, &[1; 10]).is_err());
        assert!(buf.copy_to(usize::MAX, &mut out).is_err());
    }
}
