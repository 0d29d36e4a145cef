//! The io_uring engine: each phase of an object operation ([`crate::protocol::op`]) is one
//! chain of linked SQEs on one ring, so a whole batch is in the kernel at once and one
//! thread drives it. The chain's results go back to [`crate::protocol::op::Op::advance`],
//! exactly as the thread pool's do; it ends the item or names the next phase, queued on the
//! same slot.
//!
//! | step | SQE (the open file sits in the slot's fixed-file entry) |
//! |---|---|
//! | `OpenStaged`, `OpenObject` | `OPENAT2` with `RESOLVE_BENEATH \| RESOLVE_NO_SYMLINKS`, `O_NOFOLLOW` |
//! | `Write` | `WRITEV`, or `WRITE_FIXED`; after a short write `WRITEV` of the rest |
//! | `Read` ⇒ `Guard` ⇒ | `READV` (or `READ_FIXED`) ⇒ `READ` past the end (`IO_HARDLINK`) |
//! | `DataSync`, `Close`, `SyncDir` | `FSYNC(DATASYNC)`, `CLOSE`, `FSYNC` of the bucket dir |
//! | `Publish`, `MoveToSpare` | `RENAMEAT` with `RENAME_NOREPLACE`, `RENAME_EXCHANGE` or none |
//! | `StatName`, `Unlink` | `STATX` (links not followed), `UNLINKAT` |
//!
//! Every path is one name relative to an open dir (see [`crate::beneath`]), so a link
//! planted under a root fails the chain and is reported as
//! [`hicache_core::Error::UnsafePath`]. Elsewhere than `⇒` a failing or short step cancels
//! the rest of its chain (`IO_LINK`; the kernel treats a short read or write in a link as a
//! failure), which is the step contract [`crate::protocol::op`] states; a file left open is
//! released from its fixed slot. Names and `statx` live in the slot's operation, so the hot
//! path allocates nothing per page. Registered memory regions become io_uring fixed buffers
//! where the kernel takes them, and an object whose bytes are one segment of such a region
//! (bounce slots, anchor markers) moves with `READ_FIXED`/`WRITE_FIXED`, which skips pinning
//! the pages on every transfer. Objects made of several regions (envelope header + pool
//! spans) use `READV`/`WRITEV`: a vectored fixed transfer must stay inside one registered
//! buffer.
//!
//! Here: the engine's handle and the driver's state; `drive` runs the driver's loop, `chain`
//! turns steps into SQEs and results back into the operation.

mod chain;
mod drive;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::flight::Completion;
use crate::plan::Plan;
use crate::protocol::Guard;
use crate::protocol::op::{MAX_STEPS, Op};
use crate::root::Root;
use io_uring::{IoUring, Probe, opcode, types};

/// Longest chain: the most steps in a phase.
const MAX_CHAIN: u32 = MAX_STEPS as u32;
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

/// Per in-flight object state, at a stable address for the kernel.
struct Slot {
    /// The item's operation (None while the slot is free).
    op: Option<Op>,
    how: types::OpenHow,
    /// Where a read's bytes past the object's expected end land.
    guard: Guard,
    /// The root the item lives under.
    root: usize,
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
                op: None,
                how: types::OpenHow::new(),
                guard,
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
            inflight: 0,
            completed: Vec::new(),
        }
    }
}
