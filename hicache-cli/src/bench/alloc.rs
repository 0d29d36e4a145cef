//! Heap allocations counted while a phase runs, for the "no allocation per page" target:
//! the `hicache` binary installs [`CountingAllocator`] as its global allocator; elsewhere (a
//! test, a library user) nothing is counted and the report says so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting every allocation (one relaxed atomic add each).
#[derive(Debug, Default)]
pub struct CountingAllocator;

// SAFETY: every call is passed to the system allocator unchanged; counting touches only an
// atomic.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator, which is the system's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

impl CountingAllocator {
    /// Marks the allocator as installed; the binary calls this first thing in `main`.
    pub fn installed(&self) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

/// Allocations so far (reallocations count), or None when the counting allocator is not the
/// global one.
pub(crate) fn allocations() -> Option<u64> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| ALLOCATIONS.load(Ordering::Relaxed))
}

/// Peak resident memory of this process, bytes (`VmHWM` in `/proc/self/status`).
pub(crate) fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_counted_unless_installed_and_peak_rss_is_read() {
        // The test binary's allocator is the system's.
        assert_eq!(allocations(), None);
        assert!(peak_rss().is_some_and(|b| b > 0));
    }
}
