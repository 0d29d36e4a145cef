//! The io_uring engine: every object operation is one linked chain of SQEs on one ring, so a
//! whole batch is in the kernel at once and one thread drives it.
//!
//! | operation | chain (fixed-file slot per object) |
//! |---|---|
//! | write | `OPENAT2(temp) → WRITEV → [FSYNC data] → CLOSE → RENAMEAT(temp → name) → [FSYNC bucket dir]` |
//! | read | `STATX(name) → OPENAT2(name) → READV → CLOSE` |
//! | exists | `STATX(name)` |
//! | remove | `UNLINKAT(name)` |
//!
//! Every path is one name relative to the bucket dir's open handle (see [`crate::beneath`]):
//! `OPENAT2` resolves with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` and `O_NOFOLLOW`, `STATX`
//! does not follow links, so a link planted under a root fails the chain and is reported as
//! [`hicache_core::Error::UnsafePath`]. A chain that fails because its bucket dir was removed
//! meanwhile is started again once on the recreated dir.
//!
//! A failing or short step cancels the rest of its chain (the kernel treats a short read or
//! write in a link as a failure); the completion handler then closes a file left open, removes
//! a temporary file, and reports the item — a short transfer is never counted as success.
//! Paths live in a slab allocated once, so the hot path allocates nothing per page.
//! Registered memory regions become io_uring fixed buffers where the kernel takes them, and an
//! object whose bytes are one segment of such a region (bounce slots, anchor markers) moves with
//! `READ_FIXED`/`WRITE_FIXED`, which skips pinning the pages on every transfer. Objects made of
//! several regions (envelope header + pool spans) use `READV`/`WRITEV`: a vectored fixed
//! transfer must stay inside one registered buffer.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::NAME;
use crate::config::SyncMode;
use crate::flight::Completion;
use crate::io::Root;
use crate::name::Name;
use crate::plan::{self, OpKind, Outcome, Plan};
use hicache_core::{Error, MissReason, ReadOutcome, Result};
use io_uring::{IoUring, Probe, opcode, squeue, types};
use std::os::fd::{AsRawFd, OwnedFd};

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
    pub(crate) fn new(depth: u32, roots: Arc<[Root]>) -> io::Result<Self> {
        let ring = check_support(depth)?;
        let slots = (depth / MAX_CHAIN).max(1) as usize;
        let (tx, rx) = channel();
        let fixed = Arc::new(AtomicU64::new(0));
        let counter = fixed.clone();
        let thread = std::thread::Builder::new()
            .name("hicache-uring".into())
            .spawn(move || Driver::new(ring, roots, slots, counter).run(rx))?;
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
    name: Name,
    tmp: Name,
    how: types::OpenHow,
    /// The bucket dir the chain works in, open until the chain ends.
    bucket: Option<Arc<OwnedFd>>,
    /// Whether the item was started again after its bucket dir was recreated.
    retried: bool,
    stx: libc::statx,
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
}

impl Driver {
    fn new(ring: IoUring, roots: Arc<[Root]>, n: usize, fixed: Arc<AtomicU64>) -> Self {
        let free_buffers = match ring.submitter().register_buffers_sparse(BUFFER_SLOTS) {
            Ok(()) => (0..BUFFER_SLOTS as u16).rev().collect(),
            Err(e) => {
                tracing::debug!(error = %e, "io_uring fixed buffers unavailable");
                Vec::new()
            }
        };
        let slots = (0..n)
            .map(|_| Slot {
                name: Name::new(),
                tmp: Name::new(),
                how: types::OpenHow::new(),
                bucket: None,
                retried: false,
                // SAFETY: statx is plain old data; all-zero is a valid value.
                stx: unsafe { std::mem::zeroed() },
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
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Job(job) => self.accept(job),
            Msg::Register { region, addr, len } => {
                if len == 0 || len > MAX_FIXED_BUFFER {
                    return;
                }
                let Some(index) = self.free_buffers.pop() else {
                    return;
                };
                let iov = libc::iovec {
                    iov_base: addr as *mut libc::c_void,
                    iov_len: len as usize,
                };
                // SAFETY: the region stays valid until the backend deregisters it, and
                // deregistration waits for the Unregister below before releasing the memory.
                match unsafe {
                    self.ring
                        .submitter()
                        .register_buffers_update(index as u32, &[iov], None)
                } {
                    Ok(()) => {
                        self.buffers.insert(region, (index, addr, len));
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "region not registered as a fixed buffer");
                        self.free_buffers.push(index);
                    }
                }
            }
            Msg::Unregister { region, done } => {
                if let Some((index, _, _)) = self.buffers.remove(&region) {
                    let empty = libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    };
                    // SAFETY: an empty iovec clears the slot.
                    let _ = unsafe {
                        self.ring
                            .submitter()
                            .register_buffers_update(index as u32, &[empty], None)
                    };
                    self.free_buffers.push(index);
                }
                let _ = done.send(());
            }
        }
    }

    fn run(mut self, rx: Receiver<Msg>) {
        let mut closed = false;
        loop {
            if self.inflight == 0 && self.queue.is_empty() {
                if closed {
                    return;
                }
                match rx.recv() {
                    Ok(msg) => self.handle(msg),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(msg) => self.handle(msg),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            self.fill();
            if self.inflight > 0 {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e)
                        if e.raw_os_error() == Some(libc::EINTR)
                            || e.raw_os_error() == Some(libc::EBUSY) => {}
                    Err(e) => tracing::error!(error = %e, "io_uring submit failed"),
                }
                self.reap();
            }
        }
    }

    fn accept(&mut self, job: Job) {
        let id = match self.jobs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.jobs.push(None);
                self.jobs.len() - 1
            }
        };
        let n = job.plan.len();
        let mut remaining = 0;
        for i in 0..n {
            if job.plan.prepared[i] {
                self.queue.push_back((id, i));
                remaining += 1;
            }
        }
        if remaining == 0 {
            job.plan.release();
            job.done.finish();
            return;
        }
        self.jobs[id] = Some(ActiveJob { job, remaining });
    }

    fn finish_item(&mut self, job: usize, item: usize, result: Result<Outcome>) {
        let Some(active) = self.jobs[job].as_mut() else {
            return;
        };
        active.job.plan.set(item, result);
        active.remaining -= 1;
        if active.remaining == 0
            && let Some(done) = self.jobs[job].take()
        {
            done.job.plan.release();
            done.job.done.finish();
        }
    }

    /// Starts queued items while slots and submission-queue room last.
    fn fill(&mut self) {
        while let (Some(&slot), Some(&(job, item))) = (self.free.last(), self.queue.front()) {
            let plan = self.jobs[job]
                .as_ref()
                .expect("queued items belong to live jobs")
                .job
                .plan
                .clone();
            let chain = chain_len(&plan);
            // SAFETY: reading the queue's length only.
            let room = unsafe {
                self.ring.submission_shared().capacity() - self.ring.submission_shared().len()
            };
            if room < chain as usize {
                if self.ring.submit().is_err() {
                    break;
                }
                // SAFETY: as above.
                let room = unsafe {
                    self.ring.submission_shared().capacity() - self.ring.submission_shared().len()
                };
                if room < chain as usize {
                    break;
                }
            }
            self.queue.pop_front();
            if plan.is_cancelled() {
                self.finish_item(job, item, Err(plan::cancelled()));
                continue;
            }
            let retried = self.retry.remove(&(job, item));
            match self.start(slot, job, item, &plan, retried) {
                Ok(()) => {
                    self.free.pop();
                    self.inflight += 1;
                }
                Err(e) => self.finish_item(job, item, Err(e)),
            }
        }
    }

    fn start(
        &mut self,
        slot_id: usize,
        job: usize,
        item: usize,
        plan: &Plan,
        retried: bool,
    ) -> Result<()> {
        let (root, bucket) = plan.routes[item];
        let root = &self.roots[root];
        let name = plan.name(item);
        let bucket_fd = root.dir.bucket(bucket).map_err(|e| {
            plan::to_error(crate::io::IoFailure {
                op: "open bucket dir",
                path: root.dir.bucket_path(bucket),
                error: e,
            })
        })?;
        let dirfd = types::Fd(bucket_fd.as_raw_fd());
        let slot = &mut self.slots[slot_id];
        slot.name = Name::object(name).map_err(|e| {
            plan::to_error(crate::io::IoFailure {
                op: "build name",
                path: root.dir.object_path(bucket, name),
                error: e,
            })
        })?;
        slot.bucket = Some(bucket_fd);
        slot.retried = retried;
        slot.job = job;
        slot.item = item;
        slot.res = [0; MAX_CHAIN as usize];
        let path = slot.name.as_cstr().as_ptr();
        let fixed = types::Fixed(slot_id as u32);
        let dest = types::DestinationSlot::try_from_slot_target(slot_id as u32)
            .map_err(|_| Error::backend(NAME, "io_uring file slot out of range"))?;
        let iov = plan.iov(item);
        // One segment inside a registered fixed buffer moves with READ_FIXED / WRITE_FIXED.
        let fixed_buffer = plan.single_region[item]
            .and_then(|r| self.buffers.get(&r))
            .and_then(|&(index, addr, len)| {
                let [v] = iov else { return None };
                let start = v.iov_base as usize;
                let fits = start >= addr && start + v.iov_len <= addr + len as usize;
                (fits && u32::try_from(v.iov_len).is_ok()).then_some((index, *v))
            });
        let direct = if root.direct { libc::O_DIRECT } else { 0 };
        let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        // No O_CLOEXEC: direct descriptors are not process fds, and the kernel rejects the
        // flag when installing into a fixed slot.
        let mut entries: [Option<squeue::Entry>; MAX_CHAIN as usize] = Default::default();
        let n = match plan.kind {
            OpKind::Write => {
                slot.tmp = Name::temp();
                slot.how = types::OpenHow::new()
                    .flags(
                        (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | direct)
                            as u64,
                    )
                    .mode(u64::from(root.file_mode))
                    .resolve(resolve);
                let tmp = slot.tmp.as_cstr().as_ptr();
                entries[0] = Some(
                    opcode::OpenAt2::new(dirfd, tmp, &slot.how)
                        .file_index(Some(dest))
                        .build(),
                );
                entries[1] = Some(match fixed_buffer {
                    Some((index, v)) => opcode::WriteFixed::new(
                        fixed,
                        v.iov_base.cast::<u8>().cast_const(),
                        v.iov_len as u32,
                        index,
                    )
                    .offset(0)
                    .build(),
                    None => opcode::Writev::new(fixed, iov.as_ptr(), iov.len() as u32).build(),
                });
                let mut k = 2;
                if plan.sync != SyncMode::None {
                    entries[k] = Some(
                        opcode::Fsync::new(fixed)
                            .flags(types::FsyncFlags::DATASYNC)
                            .build(),
                    );
                    k += 1;
                }
                entries[k] = Some(opcode::Close::new(fixed).build());
                entries[k + 1] = Some(opcode::RenameAt::new(dirfd, tmp, dirfd, path).build());
                k += 2;
                if plan.sync == SyncMode::Full {
                    entries[k] = Some(opcode::Fsync::new(dirfd).build());
                    k += 1;
                }
                k
            }
            OpKind::Read => {
                let stx = (&mut slot.stx as *mut libc::statx).cast::<types::statx>();
                entries[0] = Some(
                    opcode::Statx::new(dirfd, path, stx)
                        .flags(libc::AT_SYMLINK_NOFOLLOW)
                        .mask(libc::STATX_SIZE | libc::STATX_TYPE)
                        .build(),
                );
                slot.how = types::OpenHow::new()
                    .flags((libc::O_RDONLY | libc::O_NOFOLLOW | direct) as u64)
                    .resolve(resolve);
                entries[1] = Some(
                    opcode::OpenAt2::new(dirfd, path, &slot.how)
                        .file_index(Some(dest))
                        .build(),
                );
                entries[2] = Some(match fixed_buffer {
                    Some((index, v)) => opcode::ReadFixed::new(
                        fixed,
                        v.iov_base.cast::<u8>(),
                        v.iov_len as u32,
                        index,
                    )
                    .offset(0)
                    .build(),
                    None => opcode::Readv::new(fixed, iov.as_ptr(), iov.len() as u32).build(),
                });
                entries[3] = Some(opcode::Close::new(fixed).build());
                4
            }
            OpKind::Exists => {
                let stx = (&mut slot.stx as *mut libc::statx).cast::<types::statx>();
                entries[0] = Some(
                    opcode::Statx::new(dirfd, path, stx)
                        .flags(libc::AT_SYMLINK_NOFOLLOW)
                        .mask(libc::STATX_TYPE)
                        .build(),
                );
                1
            }
            OpKind::Remove => {
                entries[0] = Some(opcode::UnlinkAt::new(dirfd, path).build());
                1
            }
        };
        if fixed_buffer.is_some() {
            self.fixed.fetch_add(1, Ordering::Relaxed);
        }
        slot.steps = n as u32;
        slot.pending = n as u32;
        let mut sq = self.ring.submission();
        for (step, entry) in entries.into_iter().take(n).enumerate() {
            let mut e = entry
                .expect("chain entries are filled in order")
                .user_data(((slot_id as u64) << 8) | step as u64);
            if step + 1 < n {
                e = e.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: every pointer in the entry (names, open_how, statx, iovecs) stays valid
            // until its completion: names, open_how and statx live in the slot, which is not
            // reused before all of the chain's CQEs arrive; iovecs live in the plan, which the
            // job keeps alive; the bucket dir's handle is held by the slot until then too.
            unsafe { sq.push(&e) }.expect("room checked before starting the chain");
        }
        Ok(())
    }

    fn reap(&mut self) {
        let completed: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (data, res) in completed {
            let slot_id = (data >> 8) as usize;
            let step = (data & 0xff) as usize;
            let slot = &mut self.slots[slot_id];
            slot.res[step] = res;
            slot.pending -= 1;
            if slot.pending == 0 {
                let (job, item) = (slot.job, slot.item);
                let Some(plan) = self.jobs[job].as_ref().map(|j| j.job.plan.clone()) else {
                    self.release_slot(slot_id);
                    continue;
                };
                match self.restart_in_new_bucket(slot_id, &plan) {
                    Ok(true) => {
                        self.release_slot(slot_id);
                        self.queue.push_front((job, item));
                        self.retry.insert((job, item));
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        self.release_slot(slot_id);
                        self.finish_item(job, item, Err(e));
                        continue;
                    }
                }
                let expected = plan.iov(item).iter().map(|v| v.iov_len as u64).sum::<u64>();
                let result = self.complete(slot_id, &plan, expected);
                self.release_slot(slot_id);
                self.finish_item(job, item, result);
            }
        }
    }

    fn release_slot(&mut self, slot_id: usize) {
        self.slots[slot_id].bucket = None;
        self.free.push(slot_id);
        self.inflight -= 1;
    }

    /// Whether the chain failed only because its bucket dir was removed meanwhile; the dir is
    /// then recreated and the item runs again (once). An error when the dir cannot be
    /// recreated (e.g. a link now sits in its place).
    fn restart_in_new_bucket(&self, slot_id: usize, plan: &Plan) -> Result<bool> {
        let slot = &self.slots[slot_id];
        let first_missing = slot.res[0] == -libc::ENOENT;
        if slot.retried || !first_missing || plan.kind == OpKind::Remove {
            return Ok(false);
        }
        let Some(fd) = slot.bucket.as_ref() else {
            return Ok(false);
        };
        if !crate::beneath::is_removed(std::os::fd::AsFd::as_fd(&**fd)) {
            return Ok(false);
        }
        let (root, bucket) = plan.routes[slot.item];
        let dir = &self.roots[root].dir;
        dir.reopen(bucket, Some(fd)).map(|_| true).map_err(|e| {
            plan::to_error(crate::io::IoFailure {
                op: "recreate bucket dir",
                path: dir.bucket_path(bucket),
                error: e,
            })
        })
    }

    /// Releases a fixed-file slot whose CLOSE did not run.
    fn drop_fixed(&self, slot_id: usize) {
        let _ = self
            .ring
            .submitter()
            .register_files_update(slot_id as u32, &[-1]);
    }

    fn complete(&mut self, slot_id: usize, plan: &Plan, expected: u64) -> Result<Outcome> {
        let res = self.slots[slot_id].res;
        let os = |r: i32| io::Error::from_raw_os_error(-r);
        let item = self.slots[slot_id].item;
        let (root, bucket) = plan.routes[item];
        let root = &self.roots[root];
        let fail = |op: &'static str, name: &[u8], error: io::Error| {
            plan::to_error(crate::io::IoFailure {
                op,
                path: root.dir.object_path(bucket, name),
                error,
            })
        };
        match plan.kind {
            OpKind::Write => {
                let synced = plan.sync != SyncMode::None;
                let close_step = if synced { 3 } else { 2 };
                let rename_step = close_step + 1;
                let opened = res[0] >= 0;
                // A step the chain cancelled reports -ECANCELED, so only real flushes count.
                if synced && res[2] >= 0 {
                    root.flushed.file();
                }
                if plan.sync == SyncMode::Full && res[rename_step + 1] >= 0 {
                    root.flushed.dir();
                }
                if opened && res[close_step] < 0 {
                    self.drop_fixed(slot_id);
                }
                let slot = &mut self.slots[slot_id];
                let failure = if !opened {
                    Some(("create", os(res[0])))
                } else if res[1] < 0 {
                    Some(("pwritev", os(res[1])))
                } else if res[1] as u64 != expected {
                    Some((
                        "pwritev",
                        io::Error::new(
                            io::ErrorKind::WriteZero,
                            format!("short write: {} of {expected} bytes", res[1]),
                        ),
                    ))
                } else if synced && res[2] < 0 {
                    Some(("fdatasync", os(res[2])))
                } else if res[rename_step] < 0 {
                    Some(("rename", os(res[rename_step])))
                } else if plan.sync == SyncMode::Full && res[rename_step + 1] < 0 {
                    // Published, but not known to be durable: report it.
                    return Err(plan::to_error(crate::io::IoFailure {
                        op: "fsync bucket dir",
                        path: root.dir.bucket_path(bucket),
                        error: os(res[rename_step + 1]),
                    }));
                } else {
                    None
                };
                match failure {
                    None => Ok(Outcome::Done),
                    Some((op, e)) => {
                        let name = slot.tmp.as_bytes().to_vec();
                        if opened && let Some(dir) = slot.bucket.as_ref() {
                            let _ = crate::beneath::unlink(
                                std::os::fd::AsFd::as_fd(&**dir),
                                slot.tmp.as_cstr(),
                            );
                        }
                        Err(fail(op, &name, e))
                    }
                }
            }
            OpKind::Read => {
                if res[1] >= 0 && res[3] < 0 {
                    self.drop_fixed(slot_id);
                }
                let slot = &self.slots[slot_id];
                let name = slot.name.as_bytes();
                let missing = |r: i32| r == -libc::ENOENT || r == -libc::ENOTDIR;
                if missing(res[0]) || missing(res[1]) {
                    return Ok(Outcome::Read(ReadOutcome::Miss(MissReason::NotFound)));
                }
                if res[0] < 0 {
                    return Err(fail("statx", name, os(res[0])));
                }
                let kind = u32::from(slot.stx.stx_mode) & libc::S_IFMT;
                if kind == libc::S_IFLNK {
                    return Err(fail("statx", name, os(-libc::ELOOP)));
                }
                if kind != libc::S_IFREG {
                    return Err(fail(
                        "statx",
                        name,
                        io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
                    ));
                }
                let size = slot.stx.stx_size;
                if size != expected {
                    return Ok(Outcome::Read(ReadOutcome::Miss(MissReason::SizeMismatch {
                        expected,
                        found: size,
                    })));
                }
                if res[1] < 0 {
                    return Err(fail("open", name, os(res[1])));
                }
                if res[2] < 0 {
                    return Err(fail("preadv", name, os(res[2])));
                }
                if res[2] as u64 != expected {
                    return Ok(Outcome::Read(ReadOutcome::Miss(MissReason::SizeMismatch {
                        expected,
                        found: res[2] as u64,
                    })));
                }
                Ok(Outcome::Read(ReadOutcome::Hit))
            }
            OpKind::Exists => {
                let slot = &self.slots[slot_id];
                match res[0] {
                    0 => match u32::from(slot.stx.stx_mode) & libc::S_IFMT {
                        libc::S_IFLNK => Err(fail("statx", slot.name.as_bytes(), os(-libc::ELOOP))),
                        kind => Ok(Outcome::Exists(kind == libc::S_IFREG)),
                    },
                    r if r == -libc::ENOENT || r == -libc::ENOTDIR => Ok(Outcome::Exists(false)),
                    r => Err(fail("statx", slot.name.as_bytes(), os(r))),
                }
            }
            OpKind::Remove => match res[0] {
                r if r >= 0 || r == -libc::ENOENT => Ok(Outcome::Done),
                r => Err(fail("unlink", self.slots[slot_id].name.as_bytes(), os(r))),
            },
        }
    }
}

fn chain_len(plan: &Plan) -> u32 {
    match plan.kind {
        OpKind::Write => match plan.sync {
            SyncMode::None => 4,
            SyncMode::Data => 5,
            SyncMode::Full => 6,
        },
        OpKind::Read => 4,
        OpKind::Exists | OpKind::Remove => 1,
    }
}
