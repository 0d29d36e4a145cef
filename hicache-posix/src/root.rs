//! A storage dir as the I/O code sees it, and what a failed call reports.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::beneath::RootDir;

/// A storage dir as the I/O code sees it.
#[derive(Debug)]
pub(crate) struct Root {
    /// The open dir and its bucket dirs.
    pub(crate) dir: RootDir,
    /// Open with O_DIRECT.
    pub(crate) direct: bool,
    /// Recycled object files (None: every write creates a file, every removal unlinks).
    pub(crate) spares: Option<crate::spare::SparePool>,
    /// Permission bits of created page files.
    pub(crate) file_mode: u32,
    /// Flushes that completed under this root (`PosixBackend::flushes`).
    pub(crate) flushed: FlushCounter,
}

/// Counts flushes as they complete, so tests can prove `sync` reaches the disk calls.
#[derive(Debug, Default)]
pub(crate) struct FlushCounter {
    files: AtomicU64,
    dirs: AtomicU64,
}

impl FlushCounter {
    /// An `fdatasync` of a page file returned success.
    pub(crate) fn file(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }

    /// An `fsync` of a bucket dir returned success.
    pub(crate) fn dir(&self) {
        self.dirs.fetch_add(1, Ordering::Relaxed);
    }

    /// (file flushes, dir flushes) so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.files.load(Ordering::Relaxed),
            self.dirs.load(Ordering::Relaxed),
        )
    }
}

/// What failed, for the error message.
#[derive(Debug)]
pub(crate) struct IoFailure {
    pub(crate) op: &'static str,
    pub(crate) path: PathBuf,
    pub(crate) error: io::Error,
}
