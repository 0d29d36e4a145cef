//! Recycled object files: the files of replaced and removed objects, kept (up to a cap) in a
//! per-process dir and reused for new objects of the same size.
//!
//! Why: creating a file per object costs far more than the data transfer for small pages — on
//! ext4 an O_DIRECT write into a fresh file allocates blocks and converts unwritten extents
//! through the journal (thousands of files per second, not tens of thousands). Overwriting an
//! already allocated file in place is a pure data transfer. So a write takes a spare of the
//! right size, overwrites it, and publishes it with `renameat2(RENAME_EXCHANGE)`: the new object
//! takes the final name atomically and the replaced object lands under the spare's name, ready
//! for the next write. Removal moves the object into the pool instead of unlinking it.
//!
//! Safety: spares live outside the bucket dirs, so no reader finds them by name. A reader that
//! opened an object just before it was replaced could still be reading its inode; a spare is
//! therefore reused only once no read of this process that was in flight when it was pooled
//! can still run: at once if none was, else after a moment with no read in flight on the root
//! (a quiescent point, counted by [`ReadTracker`]). A reader in *another* process sharing the dir is not tracked: there the connector's
//! envelope checksum turns such a read into a miss, which is why recycling is only enabled for
//! enveloped pages (raw SGLang pages are never recycled). Each process has its own spare
//! dir (`<root>/.hicache-spare/<pid>-<nonce>`); dirs of processes that no longer run are
//! removed at start.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::io::PathBuf4k;

/// The top-level dir of spare dirs under a storage dir.
pub(crate) const SPARE_DIR: &str = ".hicache-spare";

/// Counts reads in flight and the moments when none is: packed as (generation << 32 | active)
/// so that "the count reached zero" and "the generation advanced" are one atomic step.
#[derive(Debug, Default)]
pub(crate) struct ReadTracker {
    state: AtomicU64,
}

impl ReadTracker {
    pub(crate) fn enter(&self) {
        self.state.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn exit(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let (generation, active) = (s >> 32, s & 0xffff_ffff);
                Some(if active <= 1 {
                    (generation + 1) << 32
                } else {
                    s - 1
                })
            });
    }

    /// The number of quiescent points so far.
    pub(crate) fn generation(&self) -> u64 {
        self.state.load(Ordering::Acquire) >> 32
    }

    /// The generation a spare pooled now must wait past: none when no read is in flight
    /// (every read that could hold the replaced inode has finished), else the current one.
    fn reusable_after(&self) -> Option<u64> {
        let s = self.state.load(Ordering::Acquire);
        (s & 0xffff_ffff != 0).then_some(s >> 32)
    }
}

/// A pooled spare: its id and the read generation it waits past (None: reusable now).
type Spare = (u64, Option<u64>);

#[derive(Debug)]
pub(crate) struct SparePool {
    dir: PathBuf,
    dir_bytes: Vec<u8>,
    /// Per size, spares oldest first.
    by_len: Mutex<HashMap<u64, VecDeque<Spare>>>,
    /// Bytes held in spares.
    bytes: AtomicU64,
    /// Reads in flight on this root.
    pub(crate) reads: ReadTracker,
    count: AtomicU64,
    next: AtomicU64,
    cap: u64,
    /// Cleared when the filesystem refuses RENAME_EXCHANGE.
    pub(crate) exchange: AtomicBool,
}

impl SparePool {
    /// Creates this process's spare dir under `root` (holding at most `cap` bytes of spares)
    /// and removes dirs of dead processes.
    pub(crate) fn new(root: &Path, cap: u64, dir_mode: u32) -> io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::DirBuilderExt;
        let top = root.join(SPARE_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(dir_mode)
            .create(&top)?;
        remove_dead(&top);
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = top.join(format!("{}-{nonce:x}", std::process::id()));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(dir_mode)
            .create(&dir)?;
        Ok(SparePool {
            dir_bytes: dir.as_os_str().as_bytes().to_vec(),
            dir,
            by_len: Mutex::new(HashMap::new()),
            reads: ReadTracker::default(),
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            next: AtomicU64::new(0),
            cap,
            exchange: AtomicBool::new(true),
        })
    }

    /// The path of spare `id`.
    pub(crate) fn path(&self, id: u64) -> io::Result<PathBuf4k> {
        PathBuf4k::spare(&self.dir_bytes, id)
    }

    /// A fresh, unused spare name.
    pub(crate) fn fresh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// A spare file of exactly `len` bytes that no read of this process can still be using.
    pub(crate) fn take(&self, len: u64) -> Option<u64> {
        let now = self.reads.generation();
        let mut map = self.by_len.lock().unwrap_or_else(|e| e.into_inner());
        let queue = map.get_mut(&len)?;
        match queue.front() {
            Some(&(id, wait)) if wait.is_none_or(|g| g < now) => {
                queue.pop_front();
                self.count.fetch_sub(1, Ordering::Relaxed);
                self.bytes.fetch_sub(len, Ordering::Relaxed);
                Some(id)
            }
            _ => None,
        }
    }

    /// Pools spare `id` of `len` bytes (call after it left the object namespace); false when
    /// the pool is full (the caller unlinks it).
    pub(crate) fn give(&self, id: u64, len: u64) -> bool {
        if self.bytes.fetch_add(len, Ordering::Relaxed) + len > self.cap {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let wait = self.reads.reusable_after();
        self.by_len
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(len)
            .or_default()
            .push_back((id, wait));
        true
    }

    /// Number of pooled spares.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for SparePool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes spare dirs whose process no longer runs.
fn remove_dead(top: &Path) {
    let Ok(entries) = std::fs::read_dir(top) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_advances_only_when_no_read_is_in_flight() {
        let t = ReadTracker::default();
        assert_eq!(t.generation(), 0);
        t.enter();
        t.enter();
        t.exit();
        assert_eq!(t.generation(), 0, "one read still in flight");
        t.exit();
        assert_eq!(t.generation(), 1);
        t.enter();
        t.exit();
        assert_eq!(t.generation(), 2);
    }

    #[test]
    fn spares_wait_for_a_quiescent_point() {
        let dir = tempfile::tempdir().unwrap();
        let pool = SparePool::new(dir.path(), 1000, 0o700).unwrap();
        pool.reads.enter();
        assert!(pool.give(1, 100));
        assert_eq!(
            pool.take(100),
            None,
            "a read that started before may hold it"
        );
        pool.reads.exit();
        assert_eq!(pool.take(100), Some(1));
        assert_eq!(pool.take(100), None);
        // Pooled while no read is in flight: reusable at once.
        assert!(pool.give(2, 100));
        assert_eq!(pool.take(100), Some(2));
    }
}
