//! Recycled object files: the files of replaced and removed objects, kept (up to a cap) in a
//! per-process dir and reused for new objects of the same size.
//!
//! Why: creating a file per object costs far more than the data transfer for small pages — on
//! ext4 an O_DIRECT write into a fresh file allocates blocks and converts unwritten extents
//! through the journal (thousands of files per second, not tens of thousands). Overwriting an
//! already allocated file in place is a pure data transfer. So a write takes a spare of the
//! right size, overwrites it, and publishes it with `renameat2(RENAME_NOREPLACE)` (a new key,
//! the common case: one call) or, when the key is stored already, `renameat2(RENAME_EXCHANGE)`:
//! the new object takes the final name atomically and the replaced object lands under the
//! spare's name, ready for the next write. Removal moves the object into the pool instead of
//! unlinking it.
//!
//! Safety: spares live outside the bucket dirs, so no reader finds them by name. A reader that
//! opened an object just before it was replaced could still be reading its inode; a spare is
//! therefore reused only once no read of this process that was in flight when it was pooled
//! can still run: at once if none was, else after a moment with no read in flight on the root
//! (a quiescent point, counted by [`ReadTracker`]). A reader in *another* process sharing the
//! dir is not tracked: there the connector's envelope checksum turns such a read into a miss,
//! which is why recycling is only enabled for enveloped pages (raw SGLang pages are never
//! recycled).
//!
//! Shared roots: several processes, containers and hosts may use one storage dir. Each
//! process has its own spare dir, `<root>/.hicache-spare/<host>-<boot id>-<pid>-<random>`
//! (host, boot and pid are there for people; the random part makes it unique), holding a
//! `lock` file the process keeps `flock`ed while it runs. Locks work across PID namespaces
//! and, on NFS, across hosts; a PID does not, so it is never used to judge liveness. A dir
//! is reclaimed at start only when its lock can be taken, which proves its owner is gone; a
//! dir whose lock cannot be tested (no lock file, or a filesystem without `flock`) is left
//! alone. The dir is built under a `.new-` name and renamed into place only once it is
//! locked, so nobody can see it unlocked. If the dir vanishes while the process runs (someone
//! cleaned the root), writes fall back to temporary files in the bucket dirs: they never all
//! fail.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::beneath::{self, RootDir};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The top-level dir of spare dirs under a storage dir.
pub(crate) const SPARE_DIR: &str = ".hicache-spare";

/// The lock file in each process's spare dir.
const LOCK_FILE: &CStr = c"lock";

/// Prefix of a spare dir still being built (not yet locked and renamed into place).
const BUILDING: &str = ".new-";

/// A staging dir without a lock this old was left by a process that died while building it
/// (building takes microseconds).
const STALE_BUILD: std::time::Duration = std::time::Duration::from_secs(600);

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
    /// The top dir of spare dirs, for removing ours at the end.
    top: OwnedFd,
    /// Our dir's name in `top`.
    name: CString,
    /// Our dir.
    dir: OwnedFd,
    /// The path of our dir, for messages.
    path: PathBuf,
    /// Our `lock` file, held with `flock(LOCK_EX)` while the pool lives.
    _lock: Flock<OwnedFd>,
    /// Set when our dir vanished: writes use temporary files from then on.
    lost: AtomicBool,
    /// Per size, spares oldest first.
    by_len: Mutex<HashMap<u64, VecDeque<Spare>>>,
    /// Bytes held in spares.
    bytes: AtomicU64,
    /// Reads in flight on this root.
    pub(crate) reads: ReadTracker,
    count: AtomicU64,
    next: AtomicU64,
    cap: u64,
    /// Cleared when the filesystem refuses `renameat2` flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
    pub(crate) exchange: AtomicBool,
}

/// What reclaiming found in the spare dirs of a storage dir.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SpareDirs {
    /// Dirs of running processes (their lock is held).
    pub(crate) live: Vec<String>,
    /// Dirs of processes that are gone (their lock was free); removed when reclaiming.
    pub(crate) dead: Vec<String>,
    /// Dirs whose owner cannot be proven gone (no lock file, or `flock` unsupported), kept.
    pub(crate) unknown: Vec<String>,
    /// Links found among them, never followed (removed when reclaiming).
    pub(crate) links: Vec<String>,
}

impl SparePool {
    /// Creates this process's spare dir under `root` (holding at most `cap` bytes of spares)
    /// and reclaims the dirs of processes that are provably gone.
    pub(crate) fn new(root: &RootDir, cap: u64, dir_mode: u32) -> io::Result<Self> {
        let top_name = CString::new(SPARE_DIR).expect("no NUL");
        let top = beneath::make_dir(root.fd(), &top_name, dir_mode)?;
        let found = scan(top.as_fd(), true);
        if !found.dead.is_empty() {
            tracing::info!(root = %root.path().display(), dirs = ?found.dead, "reclaimed spare dirs of processes that are gone");
        }
        let tag = random_tag();
        let building = CString::new(format!("{BUILDING}{tag}")).expect("no NUL");
        let dir = beneath::make_dir(top.as_fd(), &building, dir_mode)?;
        let lock = beneath::open(
            dir.as_fd(),
            LOCK_FILE,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
        .and_then(|fd| {
            try_lock(fd)?
                .ok_or_else(|| io::Error::other("a fresh lock file is locked by someone else"))
        });
        let lock = match lock {
            Ok(l) => l,
            Err(e) => {
                let _ = remove_flat(top.as_fd(), &building);
                return Err(e);
            }
        };
        let name = CString::new(format!("{}-{tag}", owner_label())).expect("no NUL");
        if let Err(e) = beneath::rename(top.as_fd(), &building, top.as_fd(), &name) {
            let _ = remove_flat(top.as_fd(), &building);
            return Err(e);
        }
        Ok(SparePool {
            path: root
                .path()
                .join(SPARE_DIR)
                .join(String::from_utf8_lossy(name.as_bytes()).as_ref()),
            top,
            name,
            dir,
            _lock: lock,
            lost: AtomicBool::new(false),
            by_len: Mutex::new(HashMap::new()),
            reads: ReadTracker::default(),
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            next: AtomicU64::new(0),
            cap,
            exchange: AtomicBool::new(true),
        })
    }

    /// Our spare dir's handle.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Our spare dir's path, for messages.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Whether our dir vanished (writes then use temporary files).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Whether our dir was removed from the tree (someone cleaned the root); from then on
    /// the pool is lost and writes use temporary files.
    pub(crate) fn lost_if_removed(&self) -> bool {
        if !self.is_lost() && beneath::is_removed(self.fd()) {
            tracing::warn!(dir = %self.path.display(), "this process's spare dir was removed; writes use temporary files from now on");
            self.lost.store(true, Ordering::Relaxed);
        }
        self.is_lost()
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
        // Our files first, then the dir; the lock is released when its fd closes after.
        let _ = remove_flat(self.top.as_fd(), &self.name);
    }
}

/// `<host>-<first 8 of the boot id>-<pid>`, for people reading the dir names.
fn owner_label() -> String {
    let host: String = nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
        .take(40)
        .collect();
    let boot: String = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect();
    let host = if host.is_empty() { "host".into() } else { host };
    let boot = if boot.is_empty() {
        "noboot".into()
    } else {
        boot
    };
    format!("{host}-{boot}-{}", std::process::id())
}

/// 64 unpredictable bits in hex (RandomState is seeded from the OS's random source).
fn random_tag() -> String {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:016x}",
        std::collections::hash_map::RandomState::new().hash_one(nanos)
    )
}

/// `flock(LOCK_EX | LOCK_NB)`: the lock (held until dropped) when taken, None when someone
/// holds it.
fn try_lock(mut fd: OwnedFd) -> io::Result<Option<Flock<OwnedFd>>> {
    loop {
        match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(Some(held)),
            Err((back, Errno::EINTR)) => fd = back,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(e.into()),
        }
    }
}

/// Looks at every spare dir under `top` (an open `.hicache-spare`); with `reclaim`, removes
/// those whose owner is provably gone, and links planted among them.
pub(crate) fn scan(top: BorrowedFd<'_>, reclaim: bool) -> SpareDirs {
    let mut found = SpareDirs::default();
    let Ok(names) = beneath::list(top) else {
        return found;
    };
    for name in names {
        let shown = name.to_string_lossy().into_owned();
        match beneath::stat(top, &name) {
            Ok(st) if beneath::is_link(&st) => {
                if reclaim {
                    let _ = beneath::unlink(top, &name);
                }
                found.links.push(shown);
                continue;
            }
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
            _ => continue,
        }
        let Ok(dir) = beneath::open_dir(top, &name) else {
            found.unknown.push(shown);
            continue;
        };
        let lock = match beneath::open(dir.as_fd(), LOCK_FILE, libc::O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(_) => {
                // No lock: an abandoned build (old enough) is provably dead; anything else
                // (another tool's dir, an older hicache) is left alone.
                let abandoned = shown.starts_with(BUILDING)
                    && nix::sys::stat::fstat(&dir).is_ok_and(|st| {
                        let age = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs() as i64)
                            .unwrap_or(0)
                            - st.st_mtime;
                        age > STALE_BUILD.as_secs() as i64
                    });
                if abandoned {
                    if reclaim {
                        let _ = remove_flat(top, &name);
                    }
                    found.dead.push(shown);
                } else if !shown.starts_with(BUILDING) {
                    found.unknown.push(shown);
                }
                continue;
            }
        };
        match try_lock(lock) {
            Ok(Some(_held)) => {
                if reclaim {
                    // We hold the dead owner's lock while removing its files.
                    let _ = remove_flat(top, &name);
                }
                found.dead.push(shown);
            }
            Ok(None) => {
                if !shown.starts_with(BUILDING) {
                    found.live.push(shown)
                }
            }
            Err(e) => {
                tracing::debug!(dir = %shown, error = %e, "cannot test a spare dir's lock; keeping it");
                found.unknown.push(shown);
            }
        }
    }
    found
}

/// Removes the files (and links) in `top/name`, then the dir; nothing is followed, nested
/// dirs are left (so the dir stays).
fn remove_flat(top: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let dir = beneath::open_dir(top, name)?;
    for entry in beneath::list(dir.as_fd())? {
        let _ = beneath::unlink(dir.as_fd(), &entry);
    }
    beneath::rmdir(top, name)
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
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        let pool = SparePool::new(&root, 1000, 0o700).unwrap();
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

    fn top(dir: &std::path::Path) -> std::path::PathBuf {
        dir.join(SPARE_DIR)
    }

    #[test]
    fn live_dirs_are_kept_and_dead_ones_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        let live = SparePool::new(&root, 1000, 0o700).unwrap();
        let live_name = live.path().file_name().unwrap().to_owned();
        // A dead process's dir: its lock file exists and nobody holds it.
        let dead = top(dir.path()).join("otherhost-12345678-1-00");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("lock"), b"").unwrap();
        std::fs::write(dead.join("7"), b"old spare").unwrap();
        // A dir nobody can prove dead (no lock file): kept.
        let unknown = top(dir.path()).join("123-abc");
        std::fs::create_dir(&unknown).unwrap();
        // The same PID as ours, as another PID namespace would have: judged by its lock only.
        let same_pid = top(dir.path()).join(format!("x-y-{}-01", std::process::id()));
        std::fs::create_dir(&same_pid).unwrap();
        std::fs::write(same_pid.join("lock"), b"").unwrap();
        let second = SparePool::new(&root, 1000, 0o700).unwrap();
        assert!(
            dir.path().join(SPARE_DIR).join(&live_name).is_dir(),
            "a live writer's dir survives"
        );
        assert!(!dead.exists(), "a dead writer's dir is reclaimed");
        assert!(!same_pid.exists());
        assert!(unknown.exists());
        let found = scan(second.top.as_fd(), false);
        assert_eq!(found.live.len(), 2, "{found:?}");
        assert_eq!(found.unknown, vec!["123-abc".to_string()]);
        drop(live);
        assert!(
            !dir.path().join(SPARE_DIR).join(&live_name).exists(),
            "a pool removes its dir"
        );
        let found = scan(second.top.as_fd(), false);
        assert_eq!(found.live.len(), 1);
    }

    #[test]
    fn links_under_the_spare_dir_are_never_followed() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("lock"), b"").unwrap();
        std::fs::write(outside.path().join("precious"), b"keep").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        std::fs::create_dir(top(dir.path())).unwrap();
        symlink(outside.path(), top(dir.path()).join("h-b-1-00")).unwrap();
        let pool = SparePool::new(&root, 1000, 0o700).unwrap();
        assert!(!top(dir.path()).join("h-b-1-00").exists());
        assert_eq!(
            std::fs::read(outside.path().join("precious")).unwrap(),
            b"keep"
        );
        drop(pool);
        // A link in place of the whole spare dir is refused.
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        symlink(outside.path(), top(dir.path())).unwrap();
        let e = SparePool::new(&root, 1000, 0o700).unwrap_err();
        assert!(beneath::is_link_error(&e), "{e}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_vanished_dir_leaves_the_pool_lost() {
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        let pool = SparePool::new(&root, 1000, 0o700).unwrap();
        assert!(!pool.lost_if_removed());
        std::fs::remove_dir_all(top(dir.path())).unwrap();
        // Writes then stage in temp files (`io::tests::a_removed_tree_is_recreated_…`).
        assert!(pool.lost_if_removed());
        assert!(pool.is_lost());
    }
}
