//! The io_uring engine: every object operation is a few linked chains of SQEs on one ring
//! (one chain per phase, the next queued when the last completes), so a whole batch is in
//! the kernel at once and one thread drives it. [`crate::protocol`] reads every result, as
//! for the threads engine.
//!
//! | operation | chains (fixed-file slot per object) |
//! |---|---|
//! | write | `OPENAT2(spare or temp) → WRITEV → [FSYNC data] → CLOSE → RENAMEAT2(→ name, NOREPLACE) → [FSYNC bucket dir]`; a stored key then `RENAMEAT2(EXCHANGE) → [FSYNC bucket dir]`, a filesystem without the flags `RENAMEAT → [FSYNC bucket dir]` |
//! | read | `OPENAT2(name) → READV (or READ_FIXED) ⇒ READ(guard, past the end) ⇒ CLOSE` |
//! | exists | `STATX(name)` |
//! | remove | `STATX(name)`, then `RENAMEAT(name → spare)` for a regular file or `UNLINKAT(name)`; without a spare dir `UNLINKAT(name)` |
//!
//! Every path is one name relative to the bucket dir's open handle (see [`crate::beneath`]):
//! `OPENAT2` resolves with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` and `O_NOFOLLOW`, `STATX`
//! does not follow links, so a link planted under a root fails the chain and is reported as
//! [`hicache_core::Error::UnsafePath`]. A chain that fails because its bucket dir was removed
//! meanwhile is started again once on the recreated dir.
//!
//! `⇒` is a hard link: the chain goes on when the step fails or ends short (the read's length
//! is judged by [`crate::protocol`], the file must still close). Elsewhere a failing or short
//! step cancels the rest of its chain (the kernel treats a short read or
//! write in a link as a failure); the completion handler then closes a file left open, removes
//! a temporary file, and reports the item — a short transfer is never counted as success.
//! Paths live in a slab allocated once, so the hot path allocates nothing per page.
//! Registered memory regions become io_uring fixed buffers where the kernel takes them, and an
//! object whose bytes are one segment of such a region (bounce slots, anchor markers) moves with
//! `READ_FIXED`/`WRITE_FIXED`, which skips pinning the pages on every transfer. Objects made of
//! several regions (envelope header + pool spans) use `READV`/`WRITEV`: a vectored fixed
//! transfer must stay inside one registered buffer.
//!
//! Here: the engine's handle and the driver's state; `drive` runs the driver's loop, `chain`
//! builds each chain and reads its completions back, `publish` the phases of a write's
//! publish.

mod chain;
mod drive;
mod publish;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::flight::Completion;
use crate::io::Root;
use crate::name::Name;
use crate::plan::Plan;
use crate::protocol::Guard;
use io_uring::{IoUring, Probe, opcode, types};
use std::os::fd::OwnedFd;

/// Longest chain (write with `sync = full`).
const MAX_CHAIN: u32 = 6;
/// Fixed-buffer table size.
const BUFFER_SLOTS: u32 = 64;
/// The kernel's limit for one registered buffer.
const MAX_FIXED_BUFFER: u64 = 1 << 30;

struct Job {
    plan: Arc<Plan>,
    done: Arc<Completion>,
}

enum Msg {
    Job(Job),
    Register {
        region: u64,
        addr: usize,
        len: u64,
    },
    Unregister {
        region: u64,
        done: std::sync::mpsc::Sender<()>,
    },
}

/// The io_uring engine handle; the ring lives on its own thread.
pub(crate) struct UringEngine {
    tx: Mutex<Option<Sender<Msg>>>,
    thread: Option<JoinHandle<()>>,
    depth: u32,
    fixed: Arc<AtomicU64>,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("queue_depth", &self.depth)
            .finish()
    }
}

/// Checks that the kernel offers io_uring with every opcode the engine uses.
pub(crate) fn check_support(depth: u32) -> io::Result<IoUring> {
    let ring = IoUring::new(depth)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [
        (opcode::OpenAt2::CODE, "OPENAT2"),
        (opcode::Readv::CODE, "READV"),
        (opcode::Writev::CODE, "WRITEV"),
        (opcode::ReadFixed::CODE, "READ_FIXED"),
        (opcode::WriteFixed::CODE, "WRITE_FIXED"),
        (opcode::Close::CODE, "CLOSE"),
        (opcode::Statx::CODE, "STATX"),
        (opcode::RenameAt::CODE, "RENAMEAT"),
        (opcode::UnlinkAt::CODE, "UNLINKAT"),
        (opcode::Fsync::CODE, "FSYNC"),
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring lacks IORING_OP_{name}"),
            ));
        }
    }
    ring.submitter()
        .register_files_sparse((depth / MAX_CHAIN).max(1))?;
    Ok(ring)
}

impl UringEngine {
    /// `align`: the largest direct-I/O alignment of the roots (it sizes each slot's read
    /// guard).
    pub(crate) fn new(depth: u32, roots: Arc<[Root]>, align: u64) -> io::Result<Self> {
        let ring = check_support(depth)?;
        let slots = (depth / MAX_CHAIN).max(1) as usize;
        let guards = (0..slots)
            .map(|_| Guard::new(align))
            .collect::<io::Result<Vec<_>>>()?;
        let (tx, rx) = channel();
        let fixed = Arc::new(AtomicU64::new(0));
        let counter = fixed.clone();
        let thread = std::thread::Builder::new()
            .name("hicache-uring".into())
            .spawn(move || Driver::new(ring, roots, guards, counter).run(rx))?;
        Ok(UringEngine {
            tx: Mutex::new(Some(tx)),
            thread: Some(thread),
            depth,
            fixed,
        })
    }

    fn send(&self, msg: Msg) -> bool {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().is_some_and(|tx| tx.send(msg).is_ok())
    }

    /// Offers a registered region as a fixed buffer (best effort: the kernel may refuse, e.g.
    /// over RLIMIT_MEMLOCK, and transfers then use plain vectored I/O).
    pub(crate) fn register_buffer(&self, region: u64, addr: usize, len: u64) {
        self.send(Msg::Register { region, addr, len });
    }

    /// Removes a region's fixed buffer; returns once the ring no longer holds it.
    pub(crate) fn unregister_buffer(&self, region: u64) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.send(Msg::Unregister { region, done }) {
            let _ = wait.recv();
        }
    }

    /// Transfers run on fixed buffers so far.
    pub(crate) fn fixed_transfers(&self) -> u64 {
        self.fixed.load(Ordering::Relaxed)
    }

    pub(crate) fn queue_depth(&self) -> u32 {
        self.depth
    }

    /// Runs every item of `plan`; completes when all are done. Dropping the future skips
    /// the items not submitted yet and waits for the chains in the kernel (see
    /// [`crate::flight`]).
    pub(crate) async fn run(&self, plan: Arc<Plan>) {
        if plan.len() == 0 {
            return;
        }
        let done = Arc::new(Completion::default());
        let job = Job {
            plan: plan.clone(),
            done: done.clone(),
        };
        if !self.send(Msg::Job(job)) {
            // The ring thread is gone: nothing will run.
            return;
        }
        done.wait(&plan).await;
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a slot's operation stands: each phase is one chain; a finished chain either ends
/// the operation or starts the next phase on the same slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The operation's first chain (for a write: stage, write, publish).
    Main,
    /// Write: exchange the staged spare with the stored object under the key.
    Exchange,
    /// Write: publish the staged file with a plain rename.
    Rename,
    /// Remove: what is under the name?
    RemoveStat,
    /// Remove: move the regular file into the spare dir.
    RemoveToSpare,
    /// Remove: unlink the name.
    Unlink,
}

/// Per in-flight object state, at a stable address for the kernel.
struct Slot {
    name: Name,
    /// The staged file's name: a spare (in the root's spare dir) or a temp (in the bucket).
    tmp: Name,
    how: types::OpenHow,
    /// The bucket dir the chain works in, open until the chain ends.
    bucket: Option<Arc<OwnedFd>>,
    /// Whether the item was started again after its bucket dir (or spare) went.
    retried: bool,
    /// Whether the bucket dir was recreated during a publish.
    renewed: bool,
    phase: Phase,
    /// The spare id `tmp` names, when the operation stages or recycles through the spare dir.
    spare: Option<u64>,
    /// Whether the write's first chain published with `RENAME_NOREPLACE` (decided when it
    /// started: the filesystem may refuse the flag meanwhile).
    noreplace: bool,
    /// Whether a read in flight is counted in the root's read tracker (see `crate::spare`).
    reading: bool,
    /// The root the item lives under.
    root: usize,
    stx: libc::statx,
    /// Where a read's bytes past the object's expected end land.
    guard: Guard,
    job: usize,
    item: usize,
    pending: u32,
    steps: u32,
    res: [i32; MAX_CHAIN as usize],
}

struct ActiveJob {
    job: Job,
    remaining: usize,
}

struct Driver {
    ring: IoUring,
    /// Region id → fixed-buffer index, address, length.
    buffers: HashMap<u64, (u16, usize, u64)>,
    free_buffers: Vec<u16>,
    fixed: Arc<AtomicU64>,
    roots: Arc<[Root]>,
    slots: Box<[Slot]>,
    free: Vec<usize>,
    jobs: Vec<Option<ActiveJob>>,
    queue: VecDeque<(usize, usize)>,
    /// Queued items that run a second time (their bucket dir was recreated).
    retry: std::collections::HashSet<(usize, usize)>,
    inflight: usize,
    /// Completions of one reap, (user data, result); kept for the next.
    completed: Vec<(u64, i32)>,
}

impl Driver {
    fn new(ring: IoUring, roots: Arc<[Root]>, guards: Vec<Guard>, fixed: Arc<AtomicU64>) -> Self {
        let n = guards.len();
        let free_buffers = match ring.submitter().register_buffers_sparse(BUFFER_SLOTS) {
            Ok(()) => (0..BUFFER_SLOTS as u16).rev().collect(),
            Err(e) => {
                tracing::debug!(error = %e, "io_uring fixed buffers unavailable");
                Vec::new()
            }
        };
        let slots = guards
            .into_iter()
            .map(|guard| Slot {
                name: Name::new(),
                tmp: Name::new(),
                how: types::OpenHow::new(),
                bucket: None,
                retried: false,
                // SAFETY: statx is plain old data; all-zero is a valid value.
                stx: unsafe { std::mem::zeroed() },
                guard,
                renewed: false,
                phase: Phase::Main,
                spare: None,
                noreplace: false,
                reading: false,
                root: 0,
                job: 0,
                item: 0,
                pending: 0,
                steps: 0,
                res: [0; MAX_CHAIN as usize],
            })
            .collect();
        Driver {
            ring,
            buffers: HashMap::new(),
            free_buffers,
            fixed,
            roots,
            slots,
            free: (0..n).rev().collect(),
            jobs: Vec::new(),
            queue: VecDeque::new(),
            retry: std::collections::HashSet::new(),
            inflight: 0,
            completed: Vec::new(),
        }
    }
}
