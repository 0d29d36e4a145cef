//! The capacity cleaner: keeps each storage dir between its watermarks by evicting least
//! recently used pages, one cleaner per dir among every process and host that shares it.
//!
//! - **Election.** Each backend with the cleaner on runs one thread. Every pass it tries to
//!   take `flock(LOCK_EX | LOCK_NB)` on `<dir>/.hicache-cleaner` for each storage dir it
//!   does not hold yet; it cleans only the dirs it holds. The kernel drops the lock when its
//!   holder exits however it ends, and another process takes it on its next pass. Locks
//!   work across PID namespaces, and on NFS across hosts; no PID is ever used to judge who
//!   is alive. The file also records who holds it and what its last pass did, for `doctor`.
//! - **Use.** Reads are recorded ([`crate::uses`]) and each pass first sets the access time
//!   of the files read since the last one, so a page's last use is the later of its access
//!   and modification times, whichever process read or wrote it.
//! - **A pass.** Dirs at their limit ([`CleanerSettings::need`]) are found first; only then
//!   (or with a byte budget, which needs the count) every bucket dir of every storage dir
//!   is listed. Objects in scope group by page
//!   ([`page_group`](hicache_core::capacity::page_group)), least recently used page first;
//!   each group is removed whole (its `_k`/`_v` halves too, even in a dir that is not at
//!   its limit), until every dir this cleaner holds is back at its low watermark.
//! - **A pass cut short.** The order is by last use, so a pass stops at the first page used
//!   within `min_age`. A dir it left above its low watermark is owed: the next passes take it
//!   down to that watermark as those pages age, even under the high watermark.
//! - **What is never removed.** Anything but a regular file with an object's name in a
//!   bucket dir (temporary and spare files start with `.`; links, dirs and the root's own
//!   files are not looked at); a page used within `min_age`; a page whose read this
//!   process started since the interval before the last ([`UseLog::guard`]); a file that
//!   changed since it was listed (another write replaced it, or a read touched it). A read
//!   in another process that has opened the file still reads all of it: an unlinked file
//!   lives until it is closed.
//! - **Bounds.** At most `max_removals_per_s` files a second; `close` (dropping the
//!   backend) stops the thread at its next file or bucket dir and joins it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use hicache_core::capacity::{Candidate, CleanerSettings, DirSpace, Group, eviction_order};
use hicache_core::raw::ObjectKey;
use hicache_core::raw::routing::bucket_name;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::beneath;
use crate::root::Root;
use crate::uses::UseLog;

/// The cleaner's lock and record file in each storage dir.
pub const CLEANER_FILE: &str = ".hicache-cleaner";

/// [`CLEANER_FILE`] for system calls.
const CLEANER_NAME: &std::ffi::CStr = c".hicache-cleaner";

/// The most of a record file that is read.
const RECORD_MAX: usize = 64 << 10;

/// What one pass of a dir's cleaner did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanerPass {
    /// When it ended, seconds since 1970.
    pub ended_unix_s: u64,
    /// How long it ran, milliseconds.
    pub duration_ms: u64,
    /// Bytes the dir had to give back when the pass began (0: it was within its limits).
    pub need_bytes: u64,
    /// Pages evicted.
    pub pages: u64,
    /// Files removed (a page may have several).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Pages passed over because this process was reading them.
    pub in_use: u64,
    /// Pages passed over because a file changed since it was listed.
    pub changed: u64,
    /// Whether the pass stopped at pages used within `min_age` before its need was met.
    pub stopped_at_recent: bool,
    /// The first error met, if any.
    pub error: Option<String>,
}

/// The record a dir's cleaner keeps in [`CLEANER_FILE`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanerRecord {
    /// Who holds (or last held) the dir: host and process id, for people.
    pub owner: String,
    /// When it took the dir, seconds since 1970.
    pub since_unix_s: u64,
    /// Its last pass.
    pub last_pass: Option<CleanerPass>,
}

/// A storage dir's cleaner as this backend sees it.
#[derive(Clone, Debug, Serialize)]
pub struct CleanerDir {
    /// The storage dir.
    pub path: PathBuf,
    /// Whether this backend's cleaner holds it.
    pub elected: bool,
    /// This backend's last pass over it.
    pub last_pass: Option<CleanerPass>,
}

/// A storage dir's cleaner as anyone can see it from outside (see [`cleaner_of`]).
#[derive(Clone, Debug, Serialize)]
pub struct CleanerSeen {
    /// Whether a process holds the dir's cleaner lock now.
    pub running: bool,
    /// What the holder (or the last one) recorded, if the file is there and readable.
    pub record: Option<CleanerRecord>,
}

/// Whether a cleaner runs on `dir` now, and what it last recorded: takes the lock shared
/// for an instant (never waiting), so it holds off no cleaner for longer than that.
pub fn cleaner_of(dir: &Path) -> io::Result<CleanerSeen> {
    let root = std::fs::File::open(dir)?;
    let name = CLEANER_NAME;
    // O_NONBLOCK: a FIFO planted under the name must not hang the caller.
    let fd = match beneath::open(root.as_fd(), name, libc::O_RDONLY | libc::O_NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(CleanerSeen {
                running: false,
                record: None,
            });
        }
        Err(e) => return Err(e),
    };
    if !beneath::is_file(&nix::sys::stat::fstat(fd.as_fd())?) {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            dir.join(CLEANER_FILE).display()
        )));
    }
    let record = read_record(fd.as_fd());
    let running = loop {
        match Flock::lock(fd.try_clone()?, FlockArg::LockSharedNonblock) {
            Ok(_held) => break false,
            Err((_, Errno::EINTR)) => continue,
            Err((_, Errno::EWOULDBLOCK)) => break true,
            Err((_, e)) => return Err(e.into()),
        }
    };
    Ok(CleanerSeen { running, record })
}

/// A record file's contents, `None` when it holds none (empty, too long, not a record).
fn read_record(fd: BorrowedFd<'_>) -> Option<CleanerRecord> {
    let mut buf = vec![0u8; RECORD_MAX];
    let mut len = 0;
    while len < buf.len() {
        match nix::sys::uio::pread(fd, &mut buf[len..], len as libc::off_t) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
    serde_json::from_slice(&buf[..len]).ok()
}

/// Stop flag and wake-up of the cleaner thread, and what it last did.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<Wake>,
    wake: Condvar,
    dirs: Mutex<Vec<CleanerDir>>,
    /// Bytes this backend set out to write since the last pass began.
    written: AtomicU64,
    /// Bytes written after which the next pass starts at once (half the watermark band of
    /// the smallest dir this process cleans); 0 until a pass has set it: no early pass.
    trigger: AtomicU64,
}

#[derive(Debug, Default)]
struct Wake {
    stopped: bool,
    /// Writes reached the trigger: the next pass should not wait for its interval.
    nudged: bool,
}

impl Shared {
    /// Waits up to `d`, or until writes reach the trigger when `nudges` is set; true when
    /// the cleaner is to stop.
    fn wait(&self, d: Duration, nudges: bool) -> bool {
        let deadline = Instant::now() + d;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !state.stopped {
            if nudges && std::mem::take(&mut state.nudged) {
                return false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .wake
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    fn is_stopped(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stopped
    }
}

/// A backend's cleaner thread; dropping it stops and joins the thread.
#[derive(Debug)]
pub(crate) struct Cleaner {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Cleaner {
    /// Starts the thread over `roots` (their paths in `paths`).
    pub(crate) fn start(
        plugin: &'static str,
        roots: Arc<[Root]>,
        paths: Vec<PathBuf>,
        settings: CleanerSettings,
        uses: Arc<UseLog>,
    ) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            dirs: Mutex::new(
                paths
                    .iter()
                    .map(|p| CleanerDir {
                        path: p.clone(),
                        elected: false,
                        last_pass: None,
                    })
                    .collect(),
            ),
            ..Shared::default()
        });
        let worker = Worker {
            plugin,
            locks: roots.iter().map(|_| None).collect(),
            warned: vec![false; roots.len()],
            owed: vec![false; roots.len()],
            roots,
            paths,
            settings,
            uses,
            shared: shared.clone(),
            owner: owner_name(),
            taken: Vec::with_capacity(crate::uses::CAPACITY),
        };
        let thread = std::thread::Builder::new()
            .name("hicache-cleaner".into())
            .spawn(move || worker.run())?;
        Ok(Cleaner {
            shared,
            thread: Some(thread),
        })
    }

    /// Counts `bytes` about to be written; the write that takes the count past the trigger
    /// wakes the cleaner, so a fast writer is not ahead of it by a whole interval. An atomic
    /// load and add per write batch; the lock only on that crossing.
    pub(crate) fn note_written(&self, bytes: u64) {
        let trigger = self.shared.trigger.load(Ordering::Relaxed);
        let before = self.shared.written.fetch_add(bytes, Ordering::Relaxed);
        if trigger > 0 && before < trigger && before.saturating_add(bytes) >= trigger {
            self.shared
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .nudged = true;
            self.shared.wake.notify_all();
        }
    }

    /// Each storage dir as this cleaner last saw it.
    pub(crate) fn dirs(&self) -> Vec<CleanerDir> {
        self.shared
            .dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Cleaner {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stopped = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn owner_name() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "?".into());
    format!("{host} pid {}", std::process::id())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The listing of a pass.
struct Scan {
    candidates: Vec<Candidate>,
    /// Bytes of the objects in scope, per storage dir.
    bytes: Vec<u64>,
}

struct Worker {
    plugin: &'static str,
    roots: Arc<[Root]>,
    paths: Vec<PathBuf>,
    settings: CleanerSettings,
    uses: Arc<UseLog>,
    shared: Arc<Shared>,
    /// The lock of each storage dir this cleaner holds.
    locks: Vec<Option<(Flock<OwnedFd>, CleanerRecord)>>,
    /// Whether a dir's lock file could not be opened was logged already.
    warned: Vec<bool>,
    /// Dirs whose last pass stopped at pages used within `min_age` above their low
    /// watermark: later passes take them down to it as those pages age, even under the high
    /// watermark (a dir that crossed it comes back to the low one, not just under the high).
    owed: Vec<bool>,
    owner: String,
    taken: Vec<(usize, ObjectKey)>,
}

impl Worker {
    fn run(mut self) {
        loop {
            self.pass();
            if self.shared.wait(self.settings.interval, true) {
                break;
            }
        }
        // A last flush: reads since the last pass still count for the next cleaner.
        self.touch_reads();
    }

    fn pass(&mut self) {
        self.touch_reads();
        self.elect();
        let held: Vec<usize> = (0..self.roots.len())
            .filter(|&r| self.locks[r].is_some())
            .collect();
        // A dir another process cleans now owes this one nothing.
        for (owed, lock) in self.owed.iter_mut().zip(&self.locks) {
            *owed &= lock.is_some();
        }
        if held.is_empty() {
            // Another process cleans every dir: writes here cannot wake it.
            self.shared.trigger.store(0, Ordering::Relaxed);
            return;
        }
        let started = Instant::now();
        self.shared.written.store(0, Ordering::Relaxed);
        let mut scan = if self.settings.max_bytes.is_some() {
            match self.scan() {
                Some(s) => Some(s),
                None => return,
            }
        } else {
            None
        };
        let mut need = vec![0u64; self.roots.len()];
        let mut trigger = u64::MAX;
        let mut errors: Vec<Option<String>> = vec![None; self.roots.len()];
        for &r in &held {
            match crate::fsinfo::space(&self.paths[r]) {
                Ok((available, total)) => {
                    let capacity = self.settings.max_bytes.unwrap_or(total);
                    trigger = trigger.min(self.settings.early_pass_after(capacity));
                    let objects = scan.as_ref().map_or(0, |s| s.bytes[r]);
                    let space = DirSpace {
                        total,
                        available,
                        objects,
                    };
                    need[r] = self.settings.need(space);
                    if need[r] == 0 && self.owed[r] {
                        need[r] = self.settings.above_low(space);
                    }
                }
                Err(e) => errors[r] = Some(format!("statvfs: {e}")),
            }
        }
        self.shared.trigger.store(
            if trigger == u64::MAX { 0 } else { trigger },
            Ordering::Relaxed,
        );
        let asked = need.clone();
        let mut passes: Vec<CleanerPass> = held
            .iter()
            .map(|&r| CleanerPass {
                need_bytes: asked[r],
                error: errors[r].take(),
                ..CleanerPass::default()
            })
            .collect();
        if held.iter().any(|&r| need[r] > 0) {
            if scan.is_none() {
                scan = self.scan();
            }
            if let Some(scan) = scan {
                let order = eviction_order(scan.candidates);
                self.evict(order, &held, &mut need, &mut passes);
            }
        }
        for (i, &r) in held.iter().enumerate() {
            self.owed[r] = need[r] > 0 && passes[i].stopped_at_recent;
        }
        let took = started.elapsed();
        let ms = took.as_millis() as u64;
        for (i, &r) in held.iter().enumerate() {
            passes[i].ended_unix_s = unix_now();
            passes[i].duration_ms = ms;
            hicache_core::meters::cleaner_pass(
                &self.paths[r],
                &hicache_core::meters::CleanerPassMeters {
                    need_bytes: asked[r],
                    pages: passes[i].pages,
                    files: passes[i].files,
                    bytes: passes[i].bytes,
                    took,
                    failed: passes[i].error.is_some(),
                },
            );
            if asked[r] > 0 {
                tracing::info!(
                    dir = %self.paths[r].display(),
                    need = asked[r],
                    pages = passes[i].pages,
                    files = passes[i].files,
                    bytes = passes[i].bytes,
                    in_use = passes[i].in_use,
                    stopped_at_recent = passes[i].stopped_at_recent,
                    ms,
                    "cleaner pass"
                );
            }
            self.finish(r, passes[i].clone());
        }
    }

    /// Sets the access time of the files read since the last pass.
    fn touch_reads(&mut self) {
        let dropped = self.uses.take(&mut self.taken);
        if dropped > 0 {
            tracing::debug!(
                dropped,
                "reads not recorded for the cleaner (interval full)"
            );
        }
        let now = nix::sys::time::TimeSpec::UTIME_NOW;
        let keep = nix::sys::time::TimeSpec::UTIME_OMIT;
        for (dir, key) in &self.taken {
            let Some(root) = self.roots.get(*dir) else {
                continue;
            };
            let Ok(bucket) = root.dir.bucket(bucket_name((key.hash() & 0xff) as u8)) else {
                continue;
            };
            // A missing file (a miss, or removed meanwhile) or someone else's file (EPERM)
            // is simply not touched.
            let _ = nix::sys::stat::utimensat(
                bucket.as_fd(),
                key.as_str(),
                &now,
                &keep,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            );
        }
    }

    /// Takes the lock of every dir whose cleaner is free; lets go of one whose lock file was
    /// removed or replaced (its holder would no longer be the only one).
    fn elect(&mut self) {
        let name = CLEANER_NAME;
        for r in 0..self.roots.len() {
            let root = self.roots[r].dir.fd();
            if let Some((lock, _)) = &self.locks[r] {
                let ours = nix::sys::stat::fstat(lock.as_fd()).ok().map(|s| s.st_ino);
                let named = beneath::stat(root, name).ok().map(|s| s.st_ino);
                if ours.is_some() && ours == named {
                    continue;
                }
                tracing::warn!(dir = %self.paths[r].display(), "the cleaner's lock file was replaced; electing again");
                self.locks[r] = None;
            }
            let opened = beneath::open(
                root,
                name,
                libc::O_RDWR | libc::O_CREAT | libc::O_NONBLOCK,
                self.roots[r].file_mode,
            )
            .and_then(|fd| match nix::sys::stat::fstat(fd.as_fd()) {
                Ok(st) if beneath::is_file(&st) => Ok(fd),
                Ok(_) => Err(io::Error::other("not a regular file")),
                Err(e) => Err(e.into()),
            });
            let fd = match opened {
                Ok(fd) => fd,
                Err(e) => {
                    if !std::mem::replace(&mut self.warned[r], true) {
                        tracing::warn!(dir = %self.paths[r].display(), error = %e, "cannot open the cleaner's lock file; this process will not clean the dir");
                    }
                    continue;
                }
            };
            match crate::spare::try_lock(fd) {
                Ok(Some(lock)) => {
                    let last = read_record(lock.as_fd()).and_then(|r| r.last_pass);
                    let record = CleanerRecord {
                        owner: self.owner.clone(),
                        since_unix_s: unix_now(),
                        last_pass: last,
                    };
                    write_record(lock.as_fd(), &record);
                    tracing::info!(dir = %self.paths[r].display(), "{}: this process runs the dir's cleaner", self.plugin);
                    self.locks[r] = Some((lock, record));
                    self.set_elected(r, true);
                }
                Ok(None) => self.set_elected(r, false),
                Err(e) => {
                    if !std::mem::replace(&mut self.warned[r], true) {
                        tracing::warn!(dir = %self.paths[r].display(), error = %e, "cannot lock the cleaner's file (no flock here?); this process will not clean the dir");
                    }
                }
            }
        }
    }

    fn set_elected(&self, r: usize, elected: bool) {
        let mut dirs = self.shared.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = dirs.get_mut(r) {
            d.elected = elected;
        }
    }

    fn finish(&mut self, r: usize, pass: CleanerPass) {
        if let Some((lock, record)) = &mut self.locks[r] {
            record.last_pass = Some(pass.clone());
            write_record(lock.as_fd(), record);
        }
        let mut dirs = self.shared.dirs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = dirs.get_mut(r) {
            d.last_pass = Some(pass);
        }
    }

    /// Every object in scope in every storage dir; `None` when the cleaner stopped meanwhile.
    fn scan(&self) -> Option<Scan> {
        let mut scan = Scan {
            candidates: Vec::new(),
            bytes: vec![0; self.roots.len()],
        };
        for (r, root) in self.roots.iter().enumerate() {
            for b in 0..=u8::MAX {
                if self.shared.is_stopped() {
                    return None;
                }
                let bucket = CString::new(bucket_name(b).to_vec()).expect("two hex digits");
                let Ok(dir) = beneath::open_dir(root.dir.fd(), &bucket) else {
                    continue;
                };
                let Ok(names) = beneath::list(dir.as_fd()) else {
                    continue;
                };
                for name in names {
                    let Some(c) = self.candidate(r, b, dir.as_fd(), &name) else {
                        continue;
                    };
                    scan.bytes[r] = scan.bytes[r].saturating_add(c.bytes);
                    scan.candidates.push(c);
                }
            }
        }
        Some(scan)
    }

    /// `name` in bucket `b` of dir `r` as an object the cleaner may evict.
    fn candidate(
        &self,
        r: usize,
        b: u8,
        dir: BorrowedFd<'_>,
        name: &std::ffi::CStr,
    ) -> Option<Candidate> {
        let text = name.to_str().ok()?;
        if text.starts_with('.') || !self.settings.scope.covers(text) {
            return None;
        }
        ObjectKey::new(text).ok()?;
        let st = beneath::stat(dir, name).ok()?;
        if !beneath::is_file(&st) {
            return None;
        }
        Some(Candidate {
            dir: r,
            name: text.to_string(),
            bytes: st.st_size as u64,
            last_used: last_used(&st),
            token: token(b, &st),
        })
    }

    /// Removes groups in `order` until every held dir's `need` is met.
    fn evict(
        &mut self,
        order: Vec<Group>,
        held: &[usize],
        need: &mut [u64],
        passes: &mut [CleanerPass],
    ) {
        let now = SystemTime::now();
        let started = Instant::now();
        let mut removed_files = 0u64;
        let pass_of = |r: usize| held.iter().position(|&h| h == r);
        for group in order {
            if self.shared.is_stopped() || held.iter().all(|&r| need[r] == 0) {
                return;
            }
            // The page's first dir at its limit is the one its eviction is counted for.
            let Some(counted) = group
                .objects
                .iter()
                .find(|o| need[o.dir] > 0)
                .and_then(|o| pass_of(o.dir))
            else {
                continue;
            };
            if now.duration_since(group.last_used).unwrap_or_default() < self.settings.min_age {
                // The order is by last use: every page left is as recent.
                for &r in held {
                    if need[r] > 0
                        && let Some(p) = pass_of(r)
                    {
                        passes[p].stopped_at_recent = true;
                    }
                }
                return;
            }
            let outcome = self.uses.guard(|in_use| {
                if group
                    .objects
                    .iter()
                    .any(|o| ObjectKey::new(&o.name).is_ok_and(|k| in_use(k.hash())))
                {
                    return Removal::InUse;
                }
                remove_group(&self.roots, &group)
            });
            match outcome {
                Removal::InUse => passes[counted].in_use += 1,
                Removal::Changed => passes[counted].changed += 1,
                Removal::Done(files, error) => {
                    passes[counted].pages += 1;
                    for o in group.objects.iter().take(files) {
                        need[o.dir] = need[o.dir].saturating_sub(o.bytes);
                        if let Some(p) = pass_of(o.dir) {
                            passes[p].files += 1;
                            passes[p].bytes += o.bytes;
                        }
                    }
                    if let Some(e) = error
                        && passes[counted].error.is_none()
                    {
                        passes[counted].error = Some(e);
                    }
                    removed_files += files as u64;
                    // Pace: no more than `max_removals_per_s` files a second.
                    let due = Duration::from_secs_f64(
                        removed_files as f64 / f64::from(self.settings.max_removals_per_s),
                    );
                    if let Some(ahead) = due.checked_sub(started.elapsed())
                        && self.shared.wait(ahead, false)
                    {
                        return;
                    }
                }
            }
        }
    }
}

enum Removal {
    /// This process is reading one of the page's objects.
    InUse,
    /// A file changed since it was listed; nothing was removed.
    Changed,
    /// Files removed (the group's first `n`), and the error that stopped the rest, if any.
    Done(usize, Option<String>),
}

/// Removes every object of `group`, after checking that none changed since it was listed.
fn remove_group(roots: &[Root], group: &Group) -> Removal {
    let mut dirs = Vec::with_capacity(group.objects.len());
    for o in &group.objects {
        let bucket = bucket_name((o.token >> 56) as u8);
        let (Ok(dir), Ok(name)) = (
            roots[o.dir].dir.bucket(bucket),
            CString::new(o.name.as_bytes()),
        ) else {
            return Removal::Changed;
        };
        match beneath::stat(dir.as_fd(), &name) {
            Ok(st)
                if token((o.token >> 56) as u8, &st) == o.token
                    && last_used(&st) == o.last_used => {}
            _ => return Removal::Changed,
        }
        dirs.push((dir, name));
    }
    for (i, (dir, name)) in dirs.iter().enumerate() {
        match beneath::unlink(dir.as_fd(), name) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Removal::Done(i, Some(format!("unlink {}: {e}", name.to_string_lossy())));
            }
        }
    }
    Removal::Done(dirs.len(), None)
}

/// The later of a file's access and modification times.
fn last_used(st: &nix::sys::stat::FileStat) -> SystemTime {
    let at = crate::listing::time(st.st_atime, st.st_atime_nsec);
    let mt = crate::listing::time(st.st_mtime, st.st_mtime_nsec);
    at.max(mt).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Where a file was listed and which file it was: its bucket in the top 8 bits, its inode
/// number's low 56 bits below.
fn token(bucket: u8, st: &nix::sys::stat::FileStat) -> u64 {
    (u64::from(bucket) << 56) | (st.st_ino & ((1 << 56) - 1))
}

/// Writes `record` over the lock file's contents (best effort: a record is for people).
fn write_record(fd: BorrowedFd<'_>, record: &CleanerRecord) {
    let Ok(mut text) = serde_json::to_vec(record) else {
        return;
    };
    text.push(b'\n');
    if nix::sys::uio::pwrite(fd, &text, 0).is_ok() {
        let _ = nix::unistd::ftruncate(fd, text.len() as libc::off_t);
    }
}
