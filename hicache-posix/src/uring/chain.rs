//! Object operations as chains of linked SQEs, one chain per [`Phase`]: [`Driver::start`]
//! queues an operation's first chain, [`Driver::complete`] reads a finished chain through
//! [`crate::protocol`] and either ends the operation or queues its next phase on the same
//! slot (a publish that found its key stored goes on to the exchange; a removal goes on from
//! its `STATX` to the spare dir or to an unlink).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;

use crate::NAME;
use crate::config::SyncMode;
use crate::io::{IoFailure, Root};
use crate::name::Name;
use crate::plan::{self, OpKind, Outcome, Plan};
use crate::protocol::{self, Stored};
use crate::spare::SparePool;
use hicache_core::{Error, MissReason, ReadOutcome, Result};
use io_uring::{opcode, squeue, types};

use super::{Driver, MAX_CHAIN, Phase};

/// Up to [`MAX_CHAIN`] entries and how each links to the next.
#[derive(Default)]
pub(super) struct Chain {
    entries: [Option<squeue::Entry>; MAX_CHAIN as usize],
    len: usize,
    /// Bit k: step k links to the next with IO_HARDLINK (the chain goes on even when the
    /// step fails or ends short) instead of IO_LINK.
    hard: u8,
}

impl Chain {
    pub(super) fn push(&mut self, entry: squeue::Entry) {
        self.entries[self.len] = Some(entry);
        self.len += 1;
    }

    /// Pushes a step after which the chain goes on whatever its result.
    fn push_hard(&mut self, entry: squeue::Entry) {
        self.hard |= 1 << self.len;
        self.push(entry);
    }
}

/// The root's spare pool, when writes stage and removals recycle through it.
fn pool(root: &Root) -> Option<&SparePool> {
    root.spares.as_ref().filter(|p| !p.is_lost())
}

/// `STATX` of a name's file type, links not followed, into `stx`.
fn stat_type(dirfd: types::Fd, path: *const libc::c_char, stx: &mut libc::statx) -> squeue::Entry {
    let stx = (stx as *mut libc::statx).cast::<types::statx>();
    opcode::Statx::new(dirfd, path, stx)
        .flags(libc::AT_SYMLINK_NOFOLLOW)
        .mask(libc::STATX_TYPE)
        .build()
}

pub(super) fn os(r: i32) -> io::Error {
    io::Error::from_raw_os_error(-r)
}

impl Driver {
    pub(super) fn start(
        &mut self,
        slot_id: usize,
        job: usize,
        item: usize,
        plan: &Plan,
        retried: bool,
    ) -> Result<()> {
        let (root_id, bucket) = plan.routes[item];
        let root = &self.roots[root_id];
        let name = plan.name(item);
        let bucket_fd = root.dir.bucket(bucket).map_err(|e| {
            plan::to_error(IoFailure {
                op: "open bucket dir",
                path: root.dir.bucket_path(bucket),
                error: e,
            })
        })?;
        let dirfd = types::Fd(bucket_fd.as_raw_fd());
        let slot = &mut self.slots[slot_id];
        slot.name = Name::object(name).map_err(|e| {
            plan::to_error(IoFailure {
                op: "build name",
                path: root.dir.object_path(bucket, name),
                error: e,
            })
        })?;
        slot.bucket = Some(bucket_fd);
        slot.retried = retried;
        slot.renewed = false;
        slot.spare = None;
        slot.noreplace = false;
        slot.root = root_id;
        slot.job = job;
        slot.item = item;
        let path = slot.name.as_cstr().as_ptr();
        let fixed = types::Fixed(slot_id as u32);
        let dest = types::DestinationSlot::try_from_slot_target(slot_id as u32)
            .map_err(|_| Error::backend(NAME, "io_uring file slot out of range"))?;
        let iov = plan.iov(item);
        let expected: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
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
        let mut chain = Chain::default();
        // No O_CLOEXEC: direct descriptors are not process fds, and the kernel rejects the
        // flag when installing into a fixed slot.
        match plan.kind {
            OpKind::Write => {
                slot.phase = Phase::Main;
                // Stage in a spare of the right size (overwritten in place) or a new one, in
                // this process's spare dir; without one, in a temp file in the bucket dir.
                let (stage_dir, create, rename) = match pool(root) {
                    Some(pool) => {
                        let (id, create) = match pool.take(expected) {
                            Some(id) => (id, 0),
                            None => (pool.fresh(), libc::O_CREAT | libc::O_EXCL),
                        };
                        slot.tmp = Name::spare(id);
                        slot.spare = Some(id);
                        slot.noreplace = pool.exchange.load(Ordering::Relaxed);
                        let flags = if slot.noreplace {
                            libc::RENAME_NOREPLACE
                        } else {
                            0
                        };
                        (types::Fd(pool.fd().as_raw_fd()), create, flags)
                    }
                    None => {
                        slot.tmp = Name::temp();
                        (dirfd, libc::O_CREAT | libc::O_EXCL, 0)
                    }
                };
                // openat2 refuses a mode without O_CREAT.
                let mode = if create != 0 { root.file_mode } else { 0 };
                slot.how = types::OpenHow::new()
                    .flags((libc::O_WRONLY | create | libc::O_NOFOLLOW | direct) as u64)
                    .mode(u64::from(mode))
                    .resolve(resolve);
                let tmp = slot.tmp.as_cstr().as_ptr();
                chain.push(
                    opcode::OpenAt2::new(stage_dir, tmp, &slot.how)
                        .file_index(Some(dest))
                        .build(),
                );
                chain.push(match fixed_buffer {
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
                if plan.sync != SyncMode::None {
                    chain.push(
                        opcode::Fsync::new(fixed)
                            .flags(types::FsyncFlags::DATASYNC)
                            .build(),
                    );
                }
                chain.push(opcode::Close::new(fixed).build());
                chain.push(
                    opcode::RenameAt::new(stage_dir, tmp, dirfd, path)
                        .flags(rename)
                        .build(),
                );
                if plan.sync == SyncMode::Full {
                    chain.push(opcode::Fsync::new(dirfd).build());
                }
            }
            OpKind::Read => {
                slot.phase = Phase::Main;
                // See crate::protocol: the object's bytes, then a guard block past its end;
                // both reads hard-link onward, so a read that ends early (as the guard's
                // does at the end of the file) still lets the file close.
                slot.how = types::OpenHow::new()
                    .flags((libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | direct) as u64)
                    .resolve(resolve);
                chain.push(
                    opcode::OpenAt2::new(dirfd, path, &slot.how)
                        .file_index(Some(dest))
                        .build(),
                );
                chain.push_hard(match fixed_buffer {
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
                let guard = slot.guard.iovec();
                chain.push_hard(
                    opcode::Read::new(fixed, guard.iov_base.cast::<u8>(), guard.iov_len as u32)
                        .offset(expected)
                        .build(),
                );
                chain.push(opcode::Close::new(fixed).build());
            }
            OpKind::Exists => {
                slot.phase = Phase::Main;
                chain.push(stat_type(dirfd, path, &mut slot.stx));
            }
            OpKind::Remove => {
                if pool(root).is_some() {
                    // A regular file is recycled; first ask what is under the name.
                    slot.phase = Phase::RemoveStat;
                    chain.push(stat_type(dirfd, path, &mut slot.stx));
                } else {
                    slot.phase = Phase::Unlink;
                    chain.push(opcode::UnlinkAt::new(dirfd, path).build());
                }
            }
        }
        if fixed_buffer.is_some() && matches!(plan.kind, OpKind::Write | OpKind::Read) {
            self.fixed.fetch_add(1, Ordering::Relaxed);
        }
        self.queue_chain(slot_id, chain)?;
        // Spares are not reused while a read that may hold one of their inodes runs; the
        // count ends when the slot is released (the chain is queued, not yet submitted).
        if plan.kind == OpKind::Read
            && let Some(pool) = self.roots[root_id].spares.as_ref()
        {
            pool.reads.enter();
            self.slots[slot_id].reading = true;
        }
        Ok(())
    }

    /// Queues `chain` for the slot; its completions are counted back in `reap`.
    pub(super) fn queue_chain(&mut self, slot_id: usize, chain: Chain) -> Result<()> {
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
            // valid until its completion: names, open_how, statx and guard live in the slot,
            // which is not reused before all of the chain's CQEs arrive; iovecs live in the
            // plan, which the job keeps alive; the bucket dir's handle is held by the slot,
            // the spare dir's by the root, until then too. Room was checked above.
            if unsafe { sq.push(&e) }.is_err() {
                return Err(Error::backend(NAME, "io_uring submission queue full"));
            }
        }
        Ok(())
    }

    /// Whether the operation's first chain failed only because its bucket dir was removed
    /// meanwhile (the dir is recreated) or, for a write staged in a spare, because the spare
    /// or the spare dir went; the item then runs again, once. An error when the bucket dir
    /// cannot be recreated (e.g. a link now sits in its place).
    pub(super) fn restart(&self, slot_id: usize, plan: &Plan) -> Result<bool> {
        let slot = &self.slots[slot_id];
        let first_missing = slot.res[0] == -libc::ENOENT;
        if slot.retried || !first_missing || slot.phase != Phase::Main {
            return Ok(false);
        }
        let (root, bucket) = plan.routes[slot.item];
        let root = &self.roots[root];
        if slot.spare.is_some() {
            // The taken spare vanished, or the whole spare dir did (then the next try uses a
            // temp file): either way a fresh start stages again.
            if let Some(pool) = root.spares.as_ref() {
                pool.lost_if_removed();
            }
            return Ok(true);
        }
        let Some(fd) = slot.bucket.as_ref() else {
            return Ok(false);
        };
        if !crate::beneath::is_removed(fd.as_fd()) {
            return Ok(false);
        }
        root.dir
            .reopen(bucket, Some(fd))
            .map(|_| true)
            .map_err(|e| {
                plan::to_error(IoFailure {
                    op: "recreate bucket dir",
                    path: root.dir.bucket_path(bucket),
                    error: e,
                })
            })
    }

    /// Reads a finished chain: the item's result, or None when its next phase was queued on
    /// the slot.
    pub(super) fn complete(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        expected: u64,
    ) -> Option<Result<Outcome>> {
        let res = self.slots[slot_id].res;
        let phase = self.slots[slot_id].phase;
        match (plan.kind, phase) {
            (OpKind::Write, Phase::Main) => self.write_main(slot_id, plan, expected, res),
            (OpKind::Write, Phase::Exchange | Phase::Rename) => {
                self.write_publish(slot_id, plan, phase, res)
            }
            (OpKind::Read, _) => Some(self.read(slot_id, plan, expected, res)),
            (OpKind::Exists, _) => Some(self.exists(slot_id, plan, res[0])),
            (OpKind::Remove, _) => self.remove(slot_id, plan, phase, res[0]),
            (OpKind::Write, _) => Some(Err(Error::backend(
                NAME,
                format!("io_uring: a write in phase {phase:?}"),
            ))),
        }
    }

    /// The failure of item `slot`'s object, as the core error.
    pub(super) fn fail(
        &self,
        slot_id: usize,
        plan: &Plan,
        op: &'static str,
        error: io::Error,
    ) -> Error {
        let slot = &self.slots[slot_id];
        let (root, bucket) = plan.routes[slot.item];
        plan::to_error(IoFailure {
            op,
            path: self.roots[root]
                .dir
                .object_path(bucket, slot.name.as_bytes()),
            error,
        })
    }

    fn read(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        expected: u64,
        res: [i32; MAX_CHAIN as usize],
    ) -> Result<Outcome> {
        let opened = res[0] >= 0;
        if opened && res[3] < 0 {
            self.drop_fixed(slot_id);
        }
        if !opened {
            if protocol::is_missing(-res[0]) {
                return Ok(Outcome::Read(ReadOutcome::Miss(MissReason::NotFound)));
            }
            return Err(self.fail(slot_id, plan, "open", os(res[0])));
        }
        if res[1] < 0 {
            return Err(self.fail(slot_id, plan, "preadv", os(res[1])));
        }
        if res[2] < 0 {
            return Err(self.fail(slot_id, plan, "pread past the end", os(res[2])));
        }
        // The file is closed by now: a miss looks at the name again (what is there now, for
        // the message and to refuse what is not a regular file).
        let super::Slot { bucket, name, .. } = &mut self.slots[slot_id];
        let look = || {
            let st = crate::beneath::stat(bucket.as_ref()?.as_fd(), name.as_cstr()).ok()?;
            Some(Stored {
                regular: crate::beneath::is_file(&st),
                size: st.st_size as u64,
            })
        };
        match protocol::read_outcome(expected, res[1] as u64, res[2] as u64, look) {
            Ok(outcome) => Ok(Outcome::Read(outcome)),
            Err(e) => Err(self.fail(slot_id, plan, "preadv", e)),
        }
    }

    fn exists(&self, slot_id: usize, plan: &Plan, r: i32) -> Result<Outcome> {
        let kind = u32::from(self.slots[slot_id].stx.stx_mode) & libc::S_IFMT;
        match r {
            0 => protocol::exists_by_type(kind)
                .map(Outcome::Exists)
                .map_err(|e| self.fail(slot_id, plan, "statx", e)),
            r if protocol::is_missing(-r) => Ok(Outcome::Exists(false)),
            r => Err(self.fail(slot_id, plan, "statx", os(r))),
        }
    }

    fn remove(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        phase: Phase,
        r: i32,
    ) -> Option<Result<Outcome>> {
        match phase {
            Phase::RemoveStat => {
                if protocol::is_missing(-r) {
                    return Some(Ok(Outcome::Done));
                }
                if r < 0 {
                    return Some(Err(self.fail(slot_id, plan, "statx", os(r))));
                }
                let regular =
                    u32::from(self.slots[slot_id].stx.stx_mode) & libc::S_IFMT == libc::S_IFREG;
                let slot = &mut self.slots[slot_id];
                let pool = self.roots[slot.root].spares.as_ref();
                let (Some(bucket), Some(pool)) = (slot.bucket.as_ref(), pool) else {
                    return Some(Err(Error::backend(
                        NAME,
                        "io_uring: a removal without its dirs",
                    )));
                };
                let dirfd = types::Fd(bucket.as_raw_fd());
                let path = slot.name.as_cstr().as_ptr();
                let mut chain = Chain::default();
                if regular {
                    // Into the spare dir, to be recycled by a later write.
                    let id = pool.fresh();
                    slot.tmp = Name::spare(id);
                    slot.spare = Some(id);
                    slot.phase = Phase::RemoveToSpare;
                    let spare_dir = types::Fd(pool.fd().as_raw_fd());
                    let tmp = slot.tmp.as_cstr().as_ptr();
                    chain.push(opcode::RenameAt::new(dirfd, path, spare_dir, tmp).build());
                } else {
                    // A link, or whatever else, is unlinked itself (never followed).
                    slot.phase = Phase::Unlink;
                    chain.push(opcode::UnlinkAt::new(dirfd, path).build());
                }
                self.queue_chain(slot_id, chain).err().map(Err)
            }
            Phase::RemoveToSpare if r >= 0 => {
                // Between the STATX and the rename the name may have changed hands: only a
                // regular file is kept.
                let slot = &mut self.slots[slot_id];
                if let (Some(id), Some(pool)) = (slot.spare, self.roots[slot.root].spares.as_ref())
                {
                    let found = crate::beneath::stat(pool.fd(), slot.tmp.as_cstr());
                    if !protocol::recycle(pool, id, found) {
                        let _ = crate::beneath::unlink(pool.fd(), slot.tmp.as_cstr());
                    }
                }
                Some(Ok(Outcome::Done))
            }
            Phase::RemoveToSpare => {
                // The move failed (the spare dir went, or the name did): unlink instead.
                let slot = &mut self.slots[slot_id];
                let Some(bucket) = slot.bucket.as_ref() else {
                    return Some(Ok(Outcome::Done));
                };
                let dirfd = types::Fd(bucket.as_raw_fd());
                let path = slot.name.as_cstr().as_ptr();
                slot.phase = Phase::Unlink;
                let mut chain = Chain::default();
                chain.push(opcode::UnlinkAt::new(dirfd, path).build());
                self.queue_chain(slot_id, chain).err().map(Err)
            }
            _ => Some(match r {
                r if r >= 0 || r == -libc::ENOENT => Ok(Outcome::Done),
                r => Err(self.fail(slot_id, plan, "unlink", os(r))),
            }),
        }
    }
}

pub(super) fn chain_len(plan: &Plan) -> u32 {
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
