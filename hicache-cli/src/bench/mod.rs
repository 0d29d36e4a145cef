//! `hicache bench`: write, read back into another region, verify every byte, time each phase;
//! and the baselines it is compared with.
//!
//! - `shape`: page shapes of well-known models;
//! - `run`: the benchmark through a connector;
//! - `baselines`: the raw O_DIRECT loop (in place, or publishing each page by name) and the
//!   bare `object_store` client;
//! - `report`: the figures and their arithmetic;
//! - `alloc`: heap allocations and peak memory while it runs.

mod alloc;
mod baselines;
mod report;
mod run;
mod shape;

pub use alloc::CountingAllocator;
#[cfg(feature = "obj")]
pub use baselines::raw_object_store;
pub use baselines::{RawLoop, raw_baseline};
pub use report::{BenchReport, PhaseStats};
pub use run::{BenchOptions, run};
pub use shape::ModelShape;

use std::path::Path;

use hicache::HostPages;

/// The pages the benchmark's memory asks for (`HostPages`): huge pages where direct I/O
/// carries the bytes to a device, base pages where the kernel copies them, which is also
/// direct I/O on a memory filesystem.
///
/// Measured on a virtio disk (ext4, 64 pages of 8 MiB, 3 interleaved runs, medians, write /
/// read GB/s): hicache 4.11 / 2.71 from huge pages against 2.80 / 2.31 from base pages. On
/// tmpfs with O_DIRECT (512 pages of 1 MiB, 4 interleaved runs) huge pages made hicache
/// slower, 6.75 / 7.14 against 8.38 / 10.16, and left the raw loop level (10.62 / 11.68
/// against 11.07 / 11.88).
pub fn pool_pages(direct_io: bool, memory_fs: bool) -> HostPages {
    if direct_io && !memory_fs {
        HostPages::Huge
    } else {
        HostPages::Base
    }
}

/// Whether `dir` is on a memory filesystem (tmpfs, ramfs): no device, every transfer a
/// copy. A dir that cannot be asked counts as not.
pub fn memory_fs(dir: &Path) -> bool {
    use nix::sys::statfs::{FsType, TMPFS_MAGIC, statfs};
    // nix names no ramfs magic; this is linux/magic.h's RAMFS_MAGIC.
    const RAMFS_MAGIC: FsType = FsType(0x8584_58f6);
    statfs(dir).is_ok_and(|s| {
        let kind = s.filesystem_type();
        kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
    })
}

/// The bytes of page `p` in the benchmark (cheap to generate, distinct per page).
fn page_pattern(len: u64, p: u64) -> Vec<u8> {
    let mut x = p.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len as usize);
    while out.len() < len as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_only_where_direct_io_reaches_a_device() {
        assert_eq!(pool_pages(true, false), HostPages::Huge);
        assert_eq!(pool_pages(true, true), HostPages::Base);
        assert_eq!(pool_pages(false, false), HostPages::Base);
        assert_eq!(pool_pages(false, true), HostPages::Base);
    }

    #[test]
    fn a_memory_filesystem_is_recognised_and_a_missing_dir_is_not_one() {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            assert!(memory_fs(shm), "/dev/shm is tmpfs on Linux");
        }
        assert!(!memory_fs(Path::new("/nonexistent/hicache")));
        assert!(!memory_fs(Path::new("")));
    }
}
