//! One object operation as a linked chain of SQEs ([`Driver::start`]), and its completions
//! read back into an outcome ([`Driver::complete`]).

use std::io;
use std::sync::atomic::Ordering;

use crate::NAME;
use crate::config::SyncMode;
use crate::name::Name;
use crate::plan::{self, OpKind, Outcome, Plan};
use crate::protocol::{self, Stored};
use hicache_core::{Error, MissReason, ReadOutcome, Result};
use io_uring::{opcode, squeue, types};
use std::os::fd::{AsFd, AsRawFd};

use super::{Driver, MAX_CHAIN};

impl Driver {
    pub(super) fn start(
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
        // Bit k: step k links to the next with IO_HARDLINK (the chain goes on even when the
        // step fails or ends short) instead of IO_LINK.
        let mut hard_links = 0u8;
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
                // See crate::protocol: the object's bytes, then a guard block past its end;
                // both reads hard-link onward, so a read that ends early (as the guard's
                // does at the end of the file) still lets the file close.
                slot.how = types::OpenHow::new()
                    .flags((libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | direct) as u64)
                    .resolve(resolve);
                entries[0] = Some(
                    opcode::OpenAt2::new(dirfd, path, &slot.how)
                        .file_index(Some(dest))
                        .build(),
                );
                entries[1] = Some(match fixed_buffer {
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
                let expected: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
                let guard = slot.guard.iovec();
                entries[2] = Some(
                    opcode::Read::new(fixed, guard.iov_base.cast::<u8>(), guard.iov_len as u32)
                        .offset(expected)
                        .build(),
                );
                entries[3] = Some(opcode::Close::new(fixed).build());
                hard_links = 0b0110;
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
                e = e.flags(if hard_links & (1 << step) != 0 {
                    squeue::Flags::IO_HARDLINK
                } else {
                    squeue::Flags::IO_LINK
                });
            }
            // SAFETY: every pointer in the entry (names, open_how, statx, guard, iovecs) stays
            // valid until its completion: names, open_how, statx and guard live in the slot,
            // which is not
            // reused before all of the chain's CQEs arrive; iovecs live in the plan, which the
            // job keeps alive; the bucket dir's handle is held by the slot until then too.
            unsafe { sq.push(&e) }.expect("room checked before starting the chain");
        }
        Ok(())
    }

    /// Whether the chain failed only because its bucket dir was removed meanwhile; the dir is
    /// then recreated and the item runs again (once). An error when the dir cannot be
    /// recreated (e.g. a link now sits in its place).
    pub(super) fn restart_in_new_bucket(&self, slot_id: usize, plan: &Plan) -> Result<bool> {
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

    pub(super) fn complete(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        expected: u64,
    ) -> Result<Outcome> {
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
                let opened = res[0] >= 0;
                if opened && res[3] < 0 {
                    self.drop_fixed(slot_id);
                }
                let slot = &mut self.slots[slot_id];
                let name = slot.name.as_bytes().to_vec();
                if !opened {
                    if protocol::is_missing(-res[0]) {
                        return Ok(Outcome::Read(ReadOutcome::Miss(MissReason::NotFound)));
                    }
                    return Err(fail("open", &name, os(res[0])));
                }
                if res[1] < 0 {
                    return Err(fail("preadv", &name, os(res[1])));
                }
                if res[2] < 0 {
                    return Err(fail("pread past the end", &name, os(res[2])));
                }
                // The file is closed by now: a miss looks at the name again (what is there
                // now, for the message and to refuse what is not a regular file).
                let look = || {
                    let dir = slot.bucket.as_ref()?;
                    let st = crate::beneath::stat(dir.as_fd(), slot.name.as_cstr()).ok()?;
                    Some(Stored {
                        regular: crate::beneath::is_file(&st),
                        size: st.st_size as u64,
                    })
                };
                protocol::read_outcome(expected, res[1] as u64, res[2] as u64, look)
                    .map(Outcome::Read)
                    .map_err(|e| fail("preadv", &name, e))
            }
            OpKind::Exists => {
                let slot = &self.slots[slot_id];
                match res[0] {
                    0 => protocol::exists_by_type(u32::from(slot.stx.stx_mode) & libc::S_IFMT)
                        .map(Outcome::Exists)
                        .map_err(|e| fail("statx", slot.name.as_bytes(), e)),
                    r if protocol::is_missing(-r) => Ok(Outcome::Exists(false)),
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
