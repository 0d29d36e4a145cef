//! Alignment: checks, rounding, and the aligned heap buffer direct I/O stages through.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Fails with [`Error::Misaligned`] unless `addr` and `len` are multiples of `align`.
pub fn check_aligned(backend: &str, what: &str, addr: u64, len: u64, align: u64) -> Result<()> {
    if align > 1 && (!addr.is_multiple_of(align) || !len.is_multiple_of(align)) {
        return Err(Error::Misaligned {
            component: backend.to_string().into(),
            what: what.to_string(),
            align,
            addr,
            len,
        });
    }
    Ok(())
}

/// Rounds `n` up to a multiple of `align` (a power of two or any positive number).
///
/// For lengths and offsets of memory and files: the result must fit in a `u64` (it overflows
/// otherwise). Values read from disk go through checked arithmetic instead.
pub const fn align_up(n: u64, align: u64) -> u64 {
    if align <= 1 {
        n
    } else {
        n.div_ceil(align) * align
    }
}

/// An owned, zeroed, aligned heap buffer: the one type for direct-I/O staging memory.
///
/// It behaves like a `Box<[u8]>` with an alignment: `&self` reads, `&mut self` writes. To
/// hand it to a backend, move it into a region with [`MemoryRegion::from_aligned`](super::MemoryRegion::from_aligned); from
/// then on its bytes are reached only through the region's pins.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes; writes need `&mut self`.
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
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start address, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
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

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds len() initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }

    /// Copies `src` into the buffer at `offset`; an out-of-range copy is an error.
    pub fn copy_from(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let range = self.range(offset, src.len())?;
        self.as_mut_slice()[range].copy_from_slice(src);
        Ok(())
    }

    /// Copies bytes at `offset` out into `dst`; an out-of-range copy is an error.
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let range = self.range(offset, dst.len())?;
        dst.copy_from_slice(&self.as_slice()[range]);
        Ok(())
    }

    fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(offset..end),
            _ => Err(Error::InvalidBatch {
                reason: format!(
                    "copy of {len} bytes at offset {offset} exceeds aligned buffer of {} bytes",
                    self.len()
                ),
            }),
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout in `zeroed`.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
