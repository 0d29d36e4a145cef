//! Names known to be published, so `exists` answers them without a `stat` per key.
//!
//! An entry is added only after a `stat` found a regular file under the name, and only in a
//! bucket dir this process watches with inotify. Every change to a name there — removed,
//! renamed away, renamed over, created — queues an event in the kernel before the call that
//! made it returns, whoever made it. Each `exists` call first drains those events
//! ([`KnownNames::refresh`]) and drops the entries they name, so an answer from the index is
//! as fresh as a `stat` made at that moment. An overflowed event queue, a bucket dir that
//! went, or an index grown past its cap drops every entry concerned; a name not in the index
//! is always stat'ed.
//!
//! Only filesystems whose every change passes through this kernel can be watched this way:
//! local ones ([`watchable`]). On NFS, 3FS, CephFS and other shared filesystems another host's
//! removal would raise no event here, so roots there always `stat`.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// The most names the index holds; past it the index starts over (≈ 32 MiB at the cap).
const CAP: usize = 1 << 20;

/// A bucket dir of a root: (root index, bucket name).
type Bucket = (usize, [u8; 2]);

/// The names of a bucket, each as its keyed 128-bit hash ([`KnownNames::hash`]).
type Names = HashSet<u128, BuildHasherDefault<Prehashed>>;

/// Hashes a name's keyed hash by taking its low 64 bits. The set's usual hasher would run
/// SipHash, which guards against keys chosen to collide, again over bits that are already
/// keyed and uniform, on every key `exists` asks.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }

    // Only `u128`s are hashed here; anything else would still be spread, by FNV-1a's
    // xor-multiply step over its bytes (from a zero state, not FNV's offset basis).
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Whether a filesystem (its `statfs` type name, as [`crate::FsInfo`] gives it) sees every
/// change to its files through this kernel, so inotify reports them all.
pub(crate) fn watchable(fs_type: &str) -> bool {
    matches!(fs_type, "ext4" | "xfs" | "btrfs" | "tmpfs" | "ramfs")
}

#[derive(Default)]
struct State {
    /// Watched bucket dirs and their names known to exist.
    buckets: HashMap<Bucket, Watched>,
    by_watch: HashMap<WatchDescriptor, Bucket>,
    len: usize,
    /// Counts every change to the index's knowledge: an event applied, a watch begun, the
    /// index dropped.
    changes: u64,
}

struct Watched {
    /// The watched dir's (device, inode).
    dir: (u64, u64),
    wd: WatchDescriptor,
    names: Names,
    /// `State::changes` at the last change to this bucket: an insert made from a `stat`
    /// that began before it is refused (the change may be that name's removal).
    last: u64,
}

/// A bucket's last change when a batch of `stat`s began (see [`KnownNames::insert`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen(Option<u64>);

impl Seen {
    /// For a bucket that is not watched: its results are never recorded.
    pub(crate) const NONE: Seen = Seen(None);

    /// Whether the bucket was watched when this was taken.
    pub(crate) fn is_watched(self) -> bool {
        self.0.is_some()
    }
}

/// The index of one backend.
pub(crate) struct KnownNames {
    inotify: Inotify,
    /// Two keyed hashers: a name is kept as 128 bits of keyed hash, never as its bytes.
    keys: (
        std::collections::hash_map::RandomState,
        std::collections::hash_map::RandomState,
    ),
    state: Mutex<State>,
}

impl std::fmt::Debug for KnownNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownNames").finish_non_exhaustive()
    }
}

impl KnownNames {
    /// An empty index, or None when inotify is unavailable (every `exists` then stats).
    pub(crate) fn new() -> Option<Self> {
        match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) => Some(KnownNames {
                inotify,
                keys: Default::default(),
                state: Mutex::new(State::default()),
            }),
            Err(e) => {
                tracing::debug!(error = %e, "inotify unavailable; exists stats every key");
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hash(&self, name: &[u8]) -> u128 {
        (u128::from(self.keys.0.hash_one(name)) << 64) | u128::from(self.keys.1.hash_one(name))
    }

    /// Applies every event queued since the last refresh. Call it before answering from the
    /// index.
    pub(crate) fn refresh(&self) {
        let mut state = self.lock();
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "inotify read failed; the index starts over");
                    forget_all(&mut state);
                    return;
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events were lost: nothing in the index can be trusted.
                    forget_all(&mut state);
                    continue;
                }
                let Some(&bucket) = state.by_watch.get(&ev.wd) else {
                    continue;
                };
                let gone = AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED
                    | AddWatchFlags::IN_UNMOUNT;
                if ev.mask.intersects(gone) {
                    // The dir itself went (or moved): stop trusting anything about it.
                    self.unwatch(&mut state, bucket);
                    continue;
                }
                let hash = ev.name.as_ref().map(|n| self.hash(n.as_encoded_bytes()));
                let state = &mut *state;
                state.changes += 1;
                if let Some(w) = state.buckets.get_mut(&bucket) {
                    w.last = state.changes;
                    if let Some(h) = hash
                        && w.names.remove(&h)
                    {
                        state.len -= 1;
                    }
                }
            }
        }
    }

    /// Watches bucket `bucket` of root `root` through `dir`, its current handle. Call it
    /// before `stat`s in a bucket not watched yet, and after `stat`s, before recording what
    /// they found: a bucket already watched through the same dir stays as it is (one `fstat`
    /// tells); one watched through another dir (the bucket dir was removed
    /// and recreated, which raises no event while a handle holds the old one) is dropped and
    /// watched anew, which refuses inserts from `stat`s begun before. A bucket that cannot be
    /// watched, or whose handle is a removed dir, is never answered from the index.
    pub(crate) fn watch(&self, bucket: Bucket, dir: BorrowedFd<'_>) {
        let Ok(st) = nix::sys::stat::fstat(dir) else {
            return;
        };
        let id = (st.st_dev, st.st_ino);
        let removed = st.st_nlink == 0;
        let mut state = self.lock();
        match state.buckets.get(&bucket) {
            Some(w) if w.dir == id && !removed => return,
            Some(_) => self.unwatch(&mut state, bucket),
            None => {}
        }
        if removed {
            return;
        }
        // The handle's own inode, not a path someone could swap meanwhile.
        let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let mask = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR;
        match self.inotify.add_watch(path.as_str(), mask) {
            Ok(wd) => {
                if let Some(&other) = state.by_watch.get(&wd)
                    && other != bucket
                {
                    // One dir under two buckets: trust neither.
                    self.unwatch(&mut state, other);
                    return;
                }
                state.by_watch.insert(wd, bucket);
                state.changes += 1;
                let last = state.changes;
                state.buckets.insert(
                    bucket,
                    Watched {
                        dir: id,
                        wd,
                        names: Names::default(),
                        last,
                    },
                );
            }
            Err(e) => tracing::debug!(error = %e, "bucket dir not watched; exists stats there"),
        }
    }

    /// Stops trusting anything about `bucket`.
    fn unwatch(&self, state: &mut State, bucket: Bucket) {
        state.changes += 1;
        if let Some(w) = state.buckets.remove(&bucket) {
            state.len -= w.names.len();
            state.by_watch.remove(&w.wd);
            let _ = self.inotify.rm_watch(w.wd);
        }
    }

    /// The last change of `bucket` now; take it before the `stat`s whose results
    /// [`KnownNames::insert`] records.
    pub(crate) fn seen(&self, bucket: Bucket) -> Seen {
        Seen(self.lock().buckets.get(&bucket).map(|w| w.last))
    }

    /// Whether `name` in `bucket` is known to exist.
    pub(crate) fn contains(&self, bucket: Bucket, name: &[u8]) -> bool {
        let h = self.hash(name);
        self.lock()
            .buckets
            .get(&bucket)
            .is_some_and(|w| w.names.contains(&h))
    }

    /// Records that a `stat` begun when `bucket`'s last change was `seen` found a regular
    /// file under `name`; refused when the bucket changed since (an event applied may have
    /// been this name's removal, which the entry would then outlive; a new watch may watch
    /// another dir than the one stat'ed).
    pub(crate) fn insert(&self, bucket: Bucket, seen: Seen, name: &[u8]) {
        let h = self.hash(name);
        let mut state = self.lock();
        if state.len >= CAP {
            forget_all(&mut state);
        }
        let state = &mut *state;
        if let Some(w) = state.buckets.get_mut(&bucket)
            && seen.0 == Some(w.last)
            && w.names.insert(h)
        {
            state.len += 1;
        }
    }

    /// Names held (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }
}

fn forget_all(state: &mut State) {
    state.changes += 1;
    for w in state.buckets.values_mut() {
        w.names.clear();
        // Anything in flight was begun before this: refuse it.
        w.last = state.changes;
    }
    state.len = 0;
}

#[cfg(test)]
mod tests;
