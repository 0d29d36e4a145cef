//! Anonymous host memory for pools and buffers: mapped, in the pages asked for, and faulted
//! in before any transfer.

use std::sync::Arc;

use super::{MemKind, MemoryRegion, prefault};
use crate::error::{Error, Result};

/// An anonymous mapping that is unmapped when the last region referencing it goes.
struct Mapping {
    _map: memmap2::MmapMut,
}

/// The pages anonymous host memory asks for: the choice depends on how its bytes will move.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostPages {
    /// Base pages (4 KiB), as the kernel gives by default: for memory whose bytes the kernel
    /// copies (buffered I/O, and any I/O to a memory filesystem such as tmpfs).
    #[default]
    Base,
    /// Transparent huge pages (`MADV_HUGEPAGE` before the first fault), where the kernel
    /// gives them: for memory that direct I/O moves to and from a device.
    ///
    /// A direct-I/O transfer pins the pages it moves and hands each physically contiguous
    /// run to the device as one segment. In a pre-faulted mapping of 4 KiB pages most 1 MiB
    /// ranges were 256 runs; a 2 MiB page is one. On a virtio disk that made O_DIRECT
    /// transfers much faster (`hicache bench`, ext4, 64 pages of 8 MiB, medians of 3
    /// interleaved runs: writes 4.11 against 2.80 GB/s, reads 2.71 against 2.31). Where the
    /// kernel copies the bytes they did not help and could hurt: on tmpfs, where even O_DIRECT
    /// is a copy, hicache ran slower from huge pages (512 pages of 1 MiB, medians of 4
    /// interleaved runs: 6.75 / 7.14 GB/s written / read against 8.38 / 10.16), while the
    /// raw loop stayed level. So they are not the default.
    ///
    /// It is advice: where transparent huge pages are `never`, or none can be had, the
    /// memory keeps base pages and works the same. With `defrag = madvise` (a common
    /// default) the kernel may compact memory to fault huge pages in, a one-time cost at
    /// allocation, which pre-faulting keeps out of transfers.
    Huge,
}

impl MemoryRegion {
    /// `len` zeroed bytes of anonymous host memory in `pages`, page-aligned and pre-faulted.
    /// [`MmapPool`](crate::MmapPool) is one of these.
    pub fn anonymous_host(len: u64, pages: HostPages) -> Result<Self> {
        let bytes = usize::try_from(len).map_err(|_| Error::InvalidPool {
            reason: format!("{len} bytes of host memory do not fit the address space"),
        })?;
        let mut map = memmap2::MmapOptions::new()
            .len(bytes)
            .map_anon()
            .map_err(|e| Error::InvalidPool {
                reason: format!("mmap of {len} bytes failed: {e}"),
            })?;
        if pages == HostPages::Huge {
            advise_huge_pages(&map);
        }
        prefault(&mut map);
        let addr = map.as_mut_ptr();
        // SAFETY: the mapping is `len` bytes, lives as long as the region's owner (the map
        // itself), and no reference to it is kept: the map moves into the region and every
        // access goes through the region's pins.
        Ok(unsafe {
            MemoryRegion::with_owner(addr, len, MemKind::Host, Arc::new(Mapping { _map: map }))
        })
    }
}

/// Asks the kernel to back a fresh mapping with transparent huge pages (see
/// [`HostPages::Huge`]); a refusal leaves it with base pages.
fn advise_huge_pages(map: &memmap2::MmapMut) {
    #[cfg(all(target_os = "linux", not(miri)))]
    if let Err(e) = map.advise(memmap2::Advice::HugePage) {
        tracing::debug!(error = %e, "MADV_HUGEPAGE refused; the mapping keeps base pages");
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = map;
}

#[cfg(all(test, target_os = "linux", not(miri)))]
mod tests {
    use super::*;

    /// The `VmFlags` line of the mapping that holds `addr`, from `/proc/self/smaps`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.to_string();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn huge_pages_are_asked_for_only_when_chosen_and_memory_starts_zeroed() {
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
        for pages in [HostPages::Base, HostPages::Huge] {
            let region = MemoryRegion::anonymous_host(4 << 20, pages).unwrap();
            let flags = vm_flags(region.addr());
            let advised = flags.split_whitespace().any(|f| f == "hg");
            let want = thp && pages == HostPages::Huge;
            assert_eq!(advised, want, "{pages:?}: VmFlags{flags}");
            let src = region.source(0, 4 << 20, "test").unwrap();
            assert!(src.host_bytes().unwrap().iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn lengths_the_kernel_cannot_map_are_typed_errors_and_zero_is_empty() {
        for len in [u64::MAX, 1 << 60] {
            let err = MemoryRegion::anonymous_host(len, HostPages::Huge).unwrap_err();
            assert!(matches!(err, Error::InvalidPool { .. }), "{len}: {err}");
            assert!(err.to_string().contains(&len.to_string()), "{err}");
        }
        match MemoryRegion::anonymous_host(0, HostPages::Base) {
            Ok(region) => assert_eq!(region.len(), 0),
            Err(err) => assert!(matches!(err, Error::InvalidPool { .. }), "{err}"),
        }
    }
}
