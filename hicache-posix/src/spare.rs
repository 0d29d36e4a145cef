//! Recycled object files: the files of replaced and removed objects, kept (up to a cap) in
//! the bucket dirs under names no key can take, and reused for new objects of the same size.
//!
//! Why: creating a file per object costs far more than the data transfer for small pages — on
//! ext4 an O_DIRECT write into a fresh file allocates blocks and converts unwritten extents
//! through the journal (thousands of files per second, not tens of thousands). Overwriting an
//! already allocated file in place is a pure data transfer. So a write takes a spare of the
//! right size in the object's own bucket dir, overwrites it, and publishes it with
//! `renameat2(RENAME_NOREPLACE)` (a new key, the common case: one call) or, when the key is
//! stored already, `renameat2(RENAME_EXCHANGE)`: the new object takes the final name atomically
//! and the replaced object lands under the spare's name, ready for the next write. Removal
//! renames the object to a spare name instead of unlinking it.
//!
//! Why in the bucket dir: a rename between two dirs takes the filesystem's one rename mutex
//! (`s_vfs_rename_mutex`) and both dirs' locks, so every writer of a process queued on one
//! spare dir. Measured here with 16 threads renaming 65 536 files: 44–51 k renames/s from one
//! dir into 256 bucket dirs (the same from 16 dirs), 92–119 k/s within each bucket dir on ext4;
//! 175–224 k/s against 267–339 k/s on tmpfs. A profile of 64 KiB writes on ext4 had spent 17 %
//! of its CPU in `lock_two_directories`.
//!
//! Names: a spare is `.s<tag>-<id>` ([`Name::spare`]), where `tag` is 16 random hex digits of
//! the process's pool. Keys never start with `.`, so no reader finds a spare by name, and
//! listings skip it. A reader that opened an object just before it was replaced could still
//! be reading its inode; a spare is therefore reused only once no read of this process that
//! was in flight when it was pooled can still run: at once if none was, else after a moment
//! with no read in flight on the root (a quiescent point, counted by [`ReadTracker`]). A
//! reader in *another* process sharing the dir is not tracked: there the connector's envelope
//! checksum turns such a read into a miss, which is why recycling is only enabled for
//! enveloped pages (raw SGLang pages are never recycled).
//!
//! Shared roots: several processes, containers and hosts may use one storage dir. Each
//! process owns a dir `<root>/.hicache-spare/<host>-<boot id>-<pid>-<tag>` (host, boot and pid
//! are there for people; the tag makes it unique and names its spares) holding a `lock` file
//! the process keeps `flock`ed while it runs. Locks work across PID namespaces and, on NFS,
//! across hosts; a PID does not, so it is never used to judge liveness. A process's spares are
//! reclaimed at another's start only when its lock can be taken, which proves its owner is
//! gone: the spares with its tag are unlinked from every bucket dir, then its dir is removed.
//! A dir whose lock cannot be tested (no lock file, or a filesystem without `flock`), and
//! spares whose tag has no dir, are left alone. The dir is built under a `.new-` name and
//! renamed into place only once it is locked, so nobody can see it unlocked. At its end a
//! pool unlinks the spares it holds and its dir.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::beneath::{self, RootDir};
use crate::name::{Name, SPARE_TAG_LEN};
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

/// The spares of one size, per bucket dir, oldest first.
type ByBucket = HashMap<[u8; 2], VecDeque<Spare>>;

#[derive(Debug)]
pub(crate) struct SparePool {
    /// The storage dir, for the bucket dirs holding our spares.
    root: OwnedFd,
    /// The top dir of spare dirs, for removing ours at the end.
    top: OwnedFd,
    /// Our dir's name in `top`.
    name: CString,
    /// The tag in our spares' names.
    tag: [u8; SPARE_TAG_LEN],
    /// Our `lock` file, held with `flock(LOCK_EX)` while the pool lives.
    _lock: Flock<OwnedFd>,
    /// Per size, per bucket dir, spares oldest first.
    by_len: Mutex<HashMap<u64, ByBucket>>,
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
    /// Creates this process's spare dir under `root` (its pool holding at most `cap` bytes of
    /// spares) and reclaims the spares and dirs of processes that are provably gone.
    pub(crate) fn new(root: &RootDir, cap: u64, dir_mode: u32) -> io::Result<Self> {
        let top_name = CString::new(SPARE_DIR).expect("no NUL");
        let top = beneath::make_dir(root.fd(), &top_name, dir_mode)?;
        let found = scan(top.as_fd(), Some(root.fd()));
        if !found.dead.is_empty() {
            tracing::info!(root = %root.path().display(), dirs = ?found.dead, "reclaimed the spares of processes that are gone");
        }
        let tag = random_tag();
        let tag_text = String::from_utf8_lossy(&tag).into_owned();
        let building = CString::new(format!("{BUILDING}{tag_text}")).expect("no NUL");
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
        let name = CString::new(format!("{}-{tag_text}", owner_label())).expect("no NUL");
        if let Err(e) = beneath::rename(top.as_fd(), &building, top.as_fd(), &name) {
            let _ = remove_flat(top.as_fd(), &building);
            return Err(e);
        }
        Ok(SparePool {
            root: root.fd().try_clone_to_owned()?,
            top,
            name,
            tag,
            _lock: lock,
            by_len: Mutex::new(HashMap::new()),
            reads: ReadTracker::default(),
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            next: AtomicU64::new(0),
            cap,
            exchange: AtomicBool::new(true),
        })
    }

    /// The name of our spare `id`, in whichever bucket dir it lies.
    pub(crate) fn name(&self, id: u64) -> Name {
        Name::spare(&self.tag, id)
    }

    /// A fresh, unused spare id.
    pub(crate) fn fresh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// A spare file of exactly `len` bytes that no read of this process can still be using,
    /// and the bucket dir it lies in: one in `bucket` if there is one (its publish is a
    /// rename within that dir), else one in another bucket dir (a rename between dirs still
    /// costs less than creating a file).
    pub(crate) fn take(&self, bucket: [u8; 2], len: u64) -> Option<([u8; 2], u64)> {
        let now = self.reads.generation();
        let mut map = self.by_len.lock().unwrap_or_else(|e| e.into_inner());
        let buckets = map.get_mut(&len)?;
        let ready = |q: &VecDeque<Spare>| {
            q.front()
                .is_some_and(|&(_, wait)| wait.is_none_or(|g| g < now))
        };
        let from = if buckets.get(&bucket).is_some_and(ready) {
            bucket
        } else {
            *buckets.iter().find(|(_, q)| ready(q))?.0
        };
        let (id, _) = buckets.get_mut(&from)?.pop_front()?;
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(len, Ordering::Relaxed);
        Some((from, id))
    }

    /// Pools spare `id` of `len` bytes in bucket dir `bucket` (call after it left the object
    /// namespace); false when the pool is full (the caller unlinks it).
    pub(crate) fn give(&self, bucket: [u8; 2], id: u64, len: u64) -> bool {
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
            .entry(bucket)
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
        // Our spares first, then our dir; the lock is released when its fd closes after.
        let map = std::mem::take(self.by_len.get_mut().unwrap_or_else(|e| e.into_inner()));
        let mut buckets: HashMap<[u8; 2], Option<OwnedFd>> = HashMap::new();
        for (bucket, queue) in map.into_values().flatten() {
            let dir = buckets
                .entry(bucket)
                .or_insert_with(|| open_bucket(self.root.as_fd(), &bucket));
            if let Some(dir) = dir {
                for (id, _) in queue {
                    let _ = beneath::unlink(dir.as_fd(), self.name(id).as_cstr());
                }
            }
        }
        let _ = remove_flat(self.top.as_fd(), &self.name);
    }
}

/// Bucket dir `bucket` of the storage dir `root`, if it is there (never created, never
/// followed).
fn open_bucket(root: BorrowedFd<'_>, bucket: &[u8]) -> Option<OwnedFd> {
    let name = CString::new(bucket).ok()?;
    beneath::open_dir(root, &name).ok()
}

/// Unlinks the spares tagged `tag` from every bucket dir of `root`.
fn sweep(root: BorrowedFd<'_>, tag: &[u8]) {
    for b in 0..=255u8 {
        let name = format!("{b:02x}");
        let Some(dir) = open_bucket(root, name.as_bytes()) else {
            continue;
        };
        let Ok(names) = beneath::list(dir.as_fd()) else {
            continue;
        };
        for name in names {
            if crate::name::spare_tag(name.to_bytes()) == Some(tag) {
                let _ = beneath::unlink(dir.as_fd(), &name);
            }
        }
    }
}

/// The tag at the end of a spare dir's name `<label>-<tag>`, if it has one.
fn dir_tag(name: &str) -> Option<&[u8]> {
    let (_, tag) = name.rsplit_once('-')?;
    (tag.len() == SPARE_TAG_LEN && crate::name::is_lower_hex(tag.as_bytes()))
        .then_some(tag.as_bytes())
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
fn random_tag() -> [u8; SPARE_TAG_LEN] {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let bits = std::collections::hash_map::RandomState::new().hash_one(nanos);
    let mut tag = [0u8; SPARE_TAG_LEN];
    for (i, c) in tag.iter_mut().enumerate() {
        *c = b"0123456789abcdef"[((bits >> (60 - 4 * i)) & 0xf) as usize];
    }
    tag
}

/// `flock(LOCK_EX | LOCK_NB)`: the lock (held until dropped) when taken, None when someone
/// holds it.
pub(crate) fn try_lock(mut fd: OwnedFd) -> io::Result<Option<Flock<OwnedFd>>> {
    loop {
        match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(Some(held)),
            Err((back, Errno::EINTR)) => fd = back,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(e.into()),
        }
    }
}

/// Looks at every spare dir under `top` (an open `.hicache-spare`). With `reclaim` (the
/// storage dir), removes those whose owner is provably gone, after unlinking their spares from
/// the bucket dirs, and links planted among them.
pub(crate) fn scan(top: BorrowedFd<'_>, reclaim: Option<BorrowedFd<'_>>) -> SpareDirs {
    let mut found = SpareDirs::default();
    let Ok(names) = beneath::list(top) else {
        return found;
    };
    for name in names {
        let shown = name.to_string_lossy().into_owned();
        match beneath::stat(top, &name) {
            Ok(st) if beneath::is_link(&st) => {
                if reclaim.is_some() {
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
        // O_NONBLOCK: a FIFO planted as the lock must not hang the scan; only a regular
        // file is a lock (anything else leaves the dir to its unknown owner).
        let opened = beneath::open(dir.as_fd(), LOCK_FILE, libc::O_RDONLY | libc::O_NONBLOCK, 0);
        let lock = match opened {
            Ok(fd) if !nix::sys::stat::fstat(&fd).is_ok_and(|st| beneath::is_file(&st)) => {
                found.unknown.push(shown);
                continue;
            }
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
                    if reclaim.is_some() {
                        // A dir still being built was never locked, so it owns no spare.
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
                if let Some(root) = reclaim {
                    // We hold the dead owner's lock while removing its spares, then its dir
                    // (last, so a reclaim cut short is taken up by the next start).
                    if let Some(tag) = dir_tag(&shown) {
                        sweep(root, tag);
                    }
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
        assert!(pool.give(*b"ab", 1, 100));
        assert_eq!(
            pool.take(*b"ab", 100),
            None,
            "a read that started before may hold it"
        );
        pool.reads.exit();
        assert_eq!(pool.take(*b"ab", 99), None, "a spare serves its own size");
        assert_eq!(pool.take(*b"ab", 100), Some((*b"ab", 1)));
        assert_eq!(pool.take(*b"ab", 100), None);
        // Pooled while no read is in flight: reusable at once. A spare in the asking bucket
        // dir comes first; without one, one from another dir.
        assert!(pool.give(*b"cd", 2, 100));
        assert!(pool.give(*b"ef", 3, 100));
        assert_eq!(pool.take(*b"ef", 100), Some((*b"ef", 3)));
        assert_eq!(pool.take(*b"ab", 100), Some((*b"cd", 2)));
        assert_eq!(pool.take(*b"ab", 100), None);
    }

    #[test]
    fn spare_names_carry_the_pool_tag() {
        let tag = *b"0123456789abcdef";
        let name = Name::spare(&tag, 0x1f);
        assert_eq!(name.as_bytes(), b".s0123456789abcdef-1f");
        assert_eq!(crate::name::spare_tag(name.as_bytes()), Some(&tag[..]));
        for other in [
            &b".s0123456789abcdef-"[..],
            b".s0123456789abcde-1",
            b".s0123456789abcdeg-1",
            b".t0123456789abcdef-1",
            b"s0123456789abcdef-1",
            b".s0123456789abcdef-12345678901234567",
            b".s0123456789abcdef-1x",
        ] {
            assert_eq!(crate::name::spare_tag(other), None, "{other:?}");
        }
        assert_eq!(dir_tag("host-1234abcd-77-0123456789abcdef"), Some(&tag[..]));
        assert_eq!(dir_tag("123-abc"), None);
        assert_eq!(
            dir_tag("host-1234abcd-77-0123456789ABCDEF"),
            None,
            "tags are lowercase"
        );
    }

    fn top(dir: &std::path::Path) -> std::path::PathBuf {
        dir.join(SPARE_DIR)
    }

    #[test]
    fn live_dirs_are_kept_and_dead_ones_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        let live = SparePool::new(&root, 1000, 0o700).unwrap();
        let live_name = live.name.to_str().unwrap().to_owned();
        std::fs::create_dir(dir.path().join("ab")).unwrap();
        std::fs::create_dir(dir.path().join("cd")).unwrap();
        // A live writer's spare, pooled.
        let live_spare = dir
            .path()
            .join("ab")
            .join(std::str::from_utf8(live.name(7).as_bytes()).unwrap());
        std::fs::write(&live_spare, b"live spare").unwrap();
        assert!(live.give(*b"ab", 7, 10));
        // A dead process's dir: its lock file exists and nobody holds it; its spares lie in
        // the bucket dirs under its tag.
        let dead_tag = "00000000000000aa";
        let dead = top(dir.path()).join(format!("otherhost-12345678-1-{dead_tag}"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("lock"), b"").unwrap();
        std::fs::write(dead.join("7"), b"old-layout spare").unwrap();
        let dead_spares = [
            dir.path().join("ab").join(format!(".s{dead_tag}-7")),
            dir.path().join("cd").join(format!(".s{dead_tag}-8")),
        ];
        for f in &dead_spares {
            std::fs::write(f, b"old spare").unwrap();
        }
        // Spares whose owner cannot be judged (no dir with their tag), a temp file and a
        // page: kept.
        let orphan = dir.path().join("cd").join(".s00000000000000bb-1");
        let page = dir.path().join("cd").join("page");
        for f in [&orphan, &page] {
            std::fs::write(f, b"keep").unwrap();
        }
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
        assert!(live_spare.exists(), "and so do its spares");
        assert!(!dead.exists(), "a dead writer's dir is reclaimed");
        for f in &dead_spares {
            assert!(!f.exists(), "and its spares: {}", f.display());
        }
        assert!(orphan.exists() && page.exists());
        assert!(!same_pid.exists());
        assert!(unknown.exists());
        let found = scan(second.top.as_fd(), None);
        assert_eq!(found.live.len(), 2, "{found:?}");
        assert_eq!(found.unknown, vec!["123-abc".to_string()]);
        drop(live);
        assert!(
            !dir.path().join(SPARE_DIR).join(&live_name).exists(),
            "a pool removes its dir"
        );
        assert!(!live_spare.exists(), "and the spares it holds");
        let found = scan(second.top.as_fd(), None);
        assert_eq!(found.live.len(), 1);
    }

    /// A FIFO or a dir planted as another owner's lock neither hangs the scan nor makes its
    /// dir look dead: the dir is left to its unknown owner.
    #[test]
    fn a_lock_that_is_not_a_file_leaves_the_dir_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = RootDir::open(dir.path(), 0o700).unwrap();
        std::fs::create_dir(top(dir.path())).unwrap();
        let fifo_owner = top(dir.path()).join("h-b-1-00000000000000aa");
        let dir_owner = top(dir.path()).join("h-b-2-00000000000000bb");
        for d in [&fifo_owner, &dir_owner] {
            std::fs::create_dir(d).unwrap();
        }
        let fifo = fifo_owner.join("lock");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::create_dir(dir_owner.join("lock")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_owned();
        let scan = std::thread::spawn(move || {
            let root = RootDir::open(&path, 0o700).unwrap();
            let pool = SparePool::new(&root, 1000, 0o700).unwrap();
            let found = scan(pool.top.as_fd(), None);
            let _ = tx.send(found.unknown);
        });
        let Ok(mut unknown) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
            // A writer comes, so a scan stuck opening the FIFO goes: the test fails, not hangs.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
            let _ = scan.join();
            panic!("the scan hung on a FIFO planted as a lock");
        };
        scan.join().unwrap();
        unknown.sort();
        assert_eq!(
            unknown,
            ["h-b-1-00000000000000aa", "h-b-2-00000000000000bb"]
        );
        assert!(fifo_owner.is_dir() && dir_owner.is_dir());
        drop(root);
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
}
