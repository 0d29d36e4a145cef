//! An operation's phase as one chain of linked SQEs: [`Driver::start`] begins an item's
//! [`Op`], [`Driver::queue_steps`] turns the steps of its current phase into SQEs, and
//! [`Driver::complete`] hands a finished chain's results to [`Op::advance`], which ends the
//! item or names the next phase (queued on the same slot).

use std::os::fd::AsRawFd;

use crate::NAME;
use crate::plan::{Outcome, Plan};
use crate::protocol::Guard;
use crate::protocol::op::{MAX_STEPS, Next, Op, Step};
use crate::root::Root;
use hicache_core::{Error, Result};
use io_uring::{opcode, squeue, types};

use super::{Driver, MAX_CHAIN};

/// Up to [`MAX_CHAIN`] entries and how each links to the next.
#[derive(Default)]
struct Chain {
    entries: [Option<squeue::Entry>; MAX_CHAIN as usize],
    len: usize,
    /// Bit k: step k links to the next with IO_HARDLINK (the chain goes on even when the
    /// step fails or ends short) instead of IO_LINK.
    hard: u8,
}

impl Chain {
    fn push(&mut self, entry: squeue::Entry, hard: bool) {
        if hard {
            self.hard |= 1 << self.len;
        }
        self.entries[self.len] = Some(entry);
        self.len += 1;
    }
}

/// What one step's SQE needs besides the operation.
struct Place<'a> {
    root: &'a Root,
    /// The open file's fixed-file slot.
    file: types::Fixed,
    /// Where an open installs the file.
    dest: types::DestinationSlot,
    how: &'a mut types::OpenHow,
    guard: &'a mut Guard,
    /// The caller's iovecs.
    iov: &'a [libc::iovec],
    /// The one segment of `iov` and its fixed-buffer index, when it lies in a registered
    /// buffer.
    fixed_buffer: Option<(u16, libc::iovec)>,
}

/// One step as an SQE. Every path is one name relative to an open dir: `OPENAT2` resolves
/// with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` and `O_NOFOLLOW`, `STATX` does not follow
/// links.
fn entry(step: Step, op: &mut Op, at: &mut Place<'_>) -> squeue::Entry {
    let stx = std::ptr::addr_of_mut!(op.stx).cast::<types::statx>();
    let bucket = types::Fd(op.bucket().as_raw_fd());
    let name = op.name().as_cstr().as_ptr();
    let tmp = op.tmp().as_cstr().as_ptr();
    let stage_dir = types::Fd(op.stage_dir().as_raw_fd());
    match step {
        Step::OpenStaged | Step::OpenObject => {
            let (flags, mode) = op.open_flags(step, at.root);
            // No O_CLOEXEC: direct descriptors are not process fds, and the kernel rejects
            // the flag when installing into a fixed slot.
            *at.how = types::OpenHow::new()
                .flags((flags | libc::O_NOFOLLOW) as u64)
                .mode(u64::from(mode))
                .resolve(libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS);
            let (dir, path) = match step {
                Step::OpenStaged => (stage_dir, tmp),
                _ => (bucket, name),
            };
            opcode::OpenAt2::new(dir, path, &*at.how)
                .file_index(Some(at.dest))
                .build()
        }
        Step::Write => match at.fixed_buffer.filter(|_| op.written() == 0) {
            Some((index, v)) => opcode::WriteFixed::new(
                at.file,
                v.iov_base.cast::<u8>().cast_const(),
                v.iov_len as u32,
                index,
            )
            .offset(0)
            .build(),
            None => {
                let v = op.write_iov(at.iov);
                opcode::Writev::new(at.file, v.as_ptr(), v.len() as u32)
                    .offset(op.written())
                    .build()
            }
        },
        Step::Read => match at.fixed_buffer {
            Some((index, v)) => {
                opcode::ReadFixed::new(at.file, v.iov_base.cast::<u8>(), v.iov_len as u32, index)
                    .offset(0)
                    .build()
            }
            None => opcode::Readv::new(at.file, at.iov.as_ptr(), at.iov.len() as u32)
                .offset(0)
                .build(),
        },
        Step::Guard => {
            let g = at.guard.iovec();
            opcode::Read::new(at.file, g.iov_base.cast::<u8>(), g.iov_len as u32)
                .offset(op.expected())
                .build()
        }
        Step::DataSync => opcode::Fsync::new(at.file)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        Step::Close => opcode::Close::new(at.file).build(),
        Step::Publish(how) => opcode::RenameAt::new(stage_dir, tmp, bucket, name)
            .flags(how.flags())
            .build(),
        Step::SyncDir => opcode::Fsync::new(bucket).build(),
        Step::StatName => opcode::Statx::new(bucket, name, stx)
            .flags(libc::AT_SYMLINK_NOFOLLOW)
            .mask(libc::STATX_TYPE)
            .build(),
        Step::MoveToSpare => opcode::RenameAt::new(bucket, name, bucket, tmp).build(),
        Step::Unlink => opcode::UnlinkAt::new(bucket, name).build(),
    }
}

impl Driver {
    /// Begins item `item` of `job` on slot `slot_id` and queues its first phase.
    pub(super) fn start(
        &mut self,
        slot_id: usize,
        job: usize,
        item: usize,
        plan: &Plan,
    ) -> Result<()> {
        let (root_id, bucket) = plan.routes[item];
        let root = &self.roots[root_id];
        let expected = plan.iov(item).iter().map(|v| v.iov_len as u64).sum();
        let op = Op::new(
            root,
            plan.kind,
            plan.sync,
            bucket,
            plan.name(item),
            expected,
        )
        .map_err(|f| plan.error(f))?;
        let slot = &mut self.slots[slot_id];
        slot.op = Some(op);
        slot.root = root_id;
        slot.job = job;
        slot.item = item;
        let queued = self.queue_steps(slot_id, plan);
        if queued.is_err() {
            self.abandon(slot_id);
        }
        queued
    }

    /// Queues the steps of the slot's current phase as one chain.
    fn queue_steps(&mut self, slot_id: usize, plan: &Plan) -> Result<()> {
        let slot = &mut self.slots[slot_id];
        let root = &self.roots[slot.root];
        let iov = plan.iov(slot.item);
        // One segment inside a registered fixed buffer moves with READ_FIXED / WRITE_FIXED.
        let fixed_buffer = plan.single_region[slot.item]
            .and_then(|r| self.buffers.get(&r))
            .and_then(|&(index, addr, len)| {
                let [v] = iov else { return None };
                let start = v.iov_base as usize;
                let fits = start >= addr && start + v.iov_len <= addr + len as usize;
                (fits && u32::try_from(v.iov_len).is_ok()).then_some((index, *v))
            });
        let dest = types::DestinationSlot::try_from_slot_target(slot_id as u32)
            .map_err(|_| Error::backend(NAME, "io_uring file slot out of range"))?;
        let Some(op) = slot.op.as_mut() else {
            return Err(Error::backend(
                NAME,
                "io_uring: a slot without its operation",
            ));
        };
        let mut at = Place {
            root,
            file: types::Fixed(slot_id as u32),
            dest,
            how: &mut slot.how,
            guard: &mut slot.guard,
            iov,
            fixed_buffer,
        };
        let mut chain = Chain::default();
        let mut fixed = false;
        for &step in op.steps().as_slice() {
            fixed |= fixed_buffer.is_some()
                && (step == Step::Read || (step == Step::Write && op.written() == 0));
            chain.push(entry(step, op, &mut at), step.goes_on());
        }
        if fixed {
            self.fixed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.queue_chain(slot_id, chain)
    }

    /// Queues `chain` for the slot; its completions are counted back in `reap`.
    fn queue_chain(&mut self, slot_id: usize, chain: Chain) -> Result<()> {
        let slot = &mut self.slots[slot_id];
        slot.res = [0; MAX_CHAIN as usize];
        slot.steps = chain.len as u32;
        slot.pending = chain.len as u32;
        let n = chain.len;
        let mut sq = self.ring.submission();
        if sq.capacity() - sq.len() < n {
            // Never met: a slot has one chain at a time and the ring holds MAX_CHAIN entries
            // per slot. Reported rather than assumed.
            slot.pending = 0;
            return Err(Error::backend(NAME, "io_uring submission queue full"));
        }
        for (step, entry) in chain.entries.into_iter().take(n).enumerate() {
            let Some(entry) = entry else { break };
            let mut e = entry.user_data(((slot_id as u64) << 8) | step as u64);
            if step + 1 < n {
                e = e.flags(if chain.hard & (1 << step) != 0 {
                    squeue::Flags::IO_HARDLINK
                } else {
                    squeue::Flags::IO_LINK
                });
            }
            // SAFETY: every pointer in the entry (names, open_how, statx, guard, iovecs) stays
            // valid until its completion: names and statx live in the slot's operation,
            // open_how and guard in the slot, which is not reused before all of the chain's
            // CQEs arrive; iovecs live in the plan (or, after a short write, in the
            // operation), which the job keeps alive; the bucket dir's handle is held by the
            // operation, the spare dir's by the root, until then too. Room was checked above.
            if unsafe { sq.push(&e) }.is_err() {
                return Err(Error::backend(NAME, "io_uring submission queue full"));
            }
        }
        Ok(())
    }

    /// Reads a finished chain: the item's result, or None when its next phase was queued on
    /// the slot.
    pub(super) fn complete(&mut self, slot_id: usize, plan: &Plan) -> Option<Result<Outcome>> {
        let slot = &mut self.slots[slot_id];
        let n = (slot.steps as usize).min(MAX_STEPS);
        let mut res = [0i64; MAX_STEPS];
        for (r, &c) in res.iter_mut().zip(&slot.res).take(n) {
            *r = i64::from(c);
        }
        let root = &self.roots[slot.root];
        let Some(op) = slot.op.as_mut() else {
            return Some(Err(Error::backend(
                NAME,
                "io_uring: a completion without its operation",
            )));
        };
        let next = op.advance(root, plan.iov(slot.item), &res[..n]);
        let open = op.is_open();
        match next {
            Next::Run => match self.queue_steps(slot_id, plan) {
                Ok(()) => None,
                Err(e) => {
                    self.abandon(slot_id);
                    Some(Err(e))
                }
            },
            Next::Done(result) => {
                if open {
                    self.drop_fixed(slot_id);
                }
                self.slots[slot_id].op = None;
                Some(result.map_err(|f| plan.error(f)))
            }
        }
    }

    /// Gives up the slot's operation midway: its file released, its staged file removed.
    pub(super) fn abandon(&mut self, slot_id: usize) {
        let slot = &mut self.slots[slot_id];
        let Some(mut op) = slot.op.take() else {
            return;
        };
        op.abandon(&self.roots[slot.root]);
        if op.is_open() {
            self.drop_fixed(slot_id);
        }
    }
}
