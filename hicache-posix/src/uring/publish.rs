//! The publish of a write on io_uring: reading the first chain (stage, write, publish by
//! `RENAME_NOREPLACE`), then, as [`crate::protocol::after_rename`] says, an exchange with the
//! stored object, a plain rename, or the bucket dir recreated first; the replaced file is
//! recycled.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;

use crate::config::SyncMode;
use crate::io::IoFailure;
use crate::plan::{self, Outcome, Plan};
use crate::protocol::{self, AfterRename};
use hicache_core::{Error, Result};
use io_uring::{opcode, types};

use super::chain::{Chain, os};
use super::{Driver, MAX_CHAIN, Phase};
use crate::NAME;

impl Driver {
    /// The staged file's path, for a message about it.
    fn staged_path(&self, slot_id: usize, plan: &Plan) -> std::path::PathBuf {
        let slot = &self.slots[slot_id];
        let (root, bucket) = plan.routes[slot.item];
        let root = &self.roots[root];
        let tmp = String::from_utf8_lossy(slot.tmp.as_bytes()).into_owned();
        match (slot.spare, root.spares.as_ref()) {
            (Some(_), Some(pool)) => pool.path().join(tmp),
            _ => root.dir.object_path(bucket, slot.tmp.as_bytes()),
        }
    }

    /// Removes the staged file of a write that will not be published.
    pub(super) fn discard(&mut self, slot_id: usize) {
        let slot = &mut self.slots[slot_id];
        let root = &self.roots[slot.root];
        let _ = match (slot.spare, root.spares.as_ref(), slot.bucket.as_ref()) {
            (Some(_), Some(pool), _) => crate::beneath::unlink(pool.fd(), slot.tmp.as_cstr()),
            (None, _, Some(dir)) => crate::beneath::unlink(dir.as_fd(), slot.tmp.as_cstr()),
            _ => Ok(()),
        };
    }

    pub(super) fn write_main(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        expected: u64,
        res: [i32; MAX_CHAIN as usize],
    ) -> Option<Result<Outcome>> {
        let synced = plan.sync != SyncMode::None;
        let close_step = if synced { 3 } else { 2 };
        let rename_step = close_step + 1;
        let opened = res[0] >= 0;
        let root = &self.roots[self.slots[slot_id].root];
        // A step the chain cancelled reports -ECANCELED, so only real flushes count.
        if synced && res[2] >= 0 {
            root.flushed.file();
        }
        if opened && res[close_step] < 0 {
            self.drop_fixed(slot_id);
        }
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
        } else {
            None
        };
        if let Some((op, error)) = failure {
            let path = self.staged_path(slot_id, plan);
            if opened {
                self.discard(slot_id);
            }
            return Some(Err(plan::to_error(IoFailure { op, path, error })));
        }
        let renamed = match res[rename_step] {
            r if r >= 0 => Ok(()),
            r => Err(os(r)),
        };
        if self.slots[slot_id].noreplace {
            return self.after_rename(slot_id, plan, renamed, false, res[rename_step + 1]);
        }
        match renamed {
            Ok(()) => Some(self.published(slot_id, plan, res[rename_step + 1])),
            Err(e)
                if e.kind() == io::ErrorKind::NotFound && self.slots[slot_id].spare.is_some() =>
            {
                self.renew_then(slot_id, plan, Phase::Rename)
            }
            Err(e) => {
                self.discard(slot_id);
                Some(Err(self.fail(slot_id, plan, "rename", e)))
            }
        }
    }

    /// After a NOREPLACE (`exchanged` false) or EXCHANGE rename of a staged spare;
    /// `dir_sync` is the result of the bucket dir's flush that followed it (if any).
    fn after_rename(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        renamed: io::Result<()>,
        exchanged: bool,
        dir_sync: i32,
    ) -> Option<Result<Outcome>> {
        match protocol::after_rename(renamed, exchanged) {
            AfterRename::Published => {
                if exchanged {
                    // The replaced object now has the spare's name: keep it for a later write.
                    let slot = &mut self.slots[slot_id];
                    if let (Some(id), Some(pool)) =
                        (slot.spare, self.roots[slot.root].spares.as_ref())
                    {
                        let found = crate::beneath::stat(pool.fd(), slot.tmp.as_cstr());
                        if !protocol::recycle(pool, id, found) {
                            let _ = crate::beneath::unlink(pool.fd(), slot.tmp.as_cstr());
                        }
                    }
                }
                Some(self.published(slot_id, plan, dir_sync))
            }
            AfterRename::Exchange => self.queue_publish(slot_id, plan, Phase::Exchange),
            AfterRename::Rename { unsupported } => {
                if unsupported
                    && let Some(pool) = self.roots[self.slots[slot_id].root].spares.as_ref()
                {
                    pool.exchange.store(false, Ordering::Relaxed);
                }
                self.queue_publish(slot_id, plan, Phase::Rename)
            }
            AfterRename::BucketGone => self.renew_then(slot_id, plan, Phase::Rename),
            AfterRename::Failed(e) => {
                self.discard(slot_id);
                Some(Err(self.fail(slot_id, plan, "rename", e)))
            }
        }
    }

    /// A finished EXCHANGE or plain-rename chain of a write.
    pub(super) fn write_publish(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        phase: Phase,
        res: [i32; MAX_CHAIN as usize],
    ) -> Option<Result<Outcome>> {
        let renamed = match res[0] {
            r if r >= 0 => Ok(()),
            r => Err(os(r)),
        };
        if phase == Phase::Exchange {
            return self.after_rename(slot_id, plan, renamed, true, res[1]);
        }
        match renamed {
            Ok(()) => Some(self.published(slot_id, plan, res[1])),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.slots[slot_id].renewed => {
                self.renew_then(slot_id, plan, Phase::Rename)
            }
            Err(e) => {
                self.discard(slot_id);
                Some(Err(self.fail(slot_id, plan, "rename", e)))
            }
        }
    }

    /// The object is published; with `sync = full` the bucket dir's flush (`dir_sync`, the
    /// step after the rename) must have worked too.
    fn published(&self, slot_id: usize, plan: &Plan, dir_sync: i32) -> Result<Outcome> {
        if plan.sync != SyncMode::Full {
            return Ok(Outcome::Done);
        }
        let slot = &self.slots[slot_id];
        let (root, bucket) = plan.routes[slot.item];
        let root = &self.roots[root];
        if dir_sync >= 0 {
            root.flushed.dir();
            return Ok(Outcome::Done);
        }
        // Published, but not known to be durable: report it.
        Err(plan::to_error(IoFailure {
            op: "fsync bucket dir",
            path: root.dir.bucket_path(bucket),
            error: os(dir_sync),
        }))
    }

    /// Recreates a bucket dir that was removed meanwhile (once per item), then queues `next`.
    fn renew_then(&mut self, slot_id: usize, plan: &Plan, next: Phase) -> Option<Result<Outcome>> {
        let slot = &self.slots[slot_id];
        let (root, bucket) = plan.routes[slot.item];
        let dir = &self.roots[root].dir;
        let stale = slot.bucket.clone();
        let removed = stale
            .as_ref()
            .is_some_and(|fd| crate::beneath::is_removed(fd.as_fd()));
        if slot.renewed || !removed {
            self.discard(slot_id);
            return Some(Err(self.fail(
                slot_id,
                plan,
                "rename",
                io::Error::from_raw_os_error(libc::ENOENT),
            )));
        }
        match dir.reopen(bucket, stale.as_ref()) {
            Ok(fresh) => {
                let slot = &mut self.slots[slot_id];
                slot.bucket = Some(fresh);
                slot.renewed = true;
                self.queue_publish(slot_id, plan, next)
            }
            Err(error) => {
                let path = dir.bucket_path(bucket);
                self.discard(slot_id);
                Some(Err(plan::to_error(IoFailure {
                    op: "recreate bucket dir",
                    path,
                    error,
                })))
            }
        }
    }

    /// Queues a publish of the staged file: `Exchange` (RENAME_EXCHANGE) or `Rename`
    /// (plain), followed by the bucket dir's flush under `sync = full`.
    fn queue_publish(
        &mut self,
        slot_id: usize,
        plan: &Plan,
        phase: Phase,
    ) -> Option<Result<Outcome>> {
        let slot = &mut self.slots[slot_id];
        let root = &self.roots[slot.root];
        let (Some(bucket), Some(pool)) = (slot.bucket.as_ref(), root.spares.as_ref()) else {
            return Some(Err(Error::backend(
                NAME,
                "io_uring: a publish without its dirs",
            )));
        };
        let dirfd = types::Fd(bucket.as_raw_fd());
        let stage_dir = types::Fd(pool.fd().as_raw_fd());
        slot.phase = phase;
        let flags = if phase == Phase::Exchange {
            libc::RENAME_EXCHANGE
        } else {
            0
        };
        let mut chain = Chain::default();
        let (tmp, path) = (slot.tmp.as_cstr().as_ptr(), slot.name.as_cstr().as_ptr());
        chain.push(
            opcode::RenameAt::new(stage_dir, tmp, dirfd, path)
                .flags(flags)
                .build(),
        );
        if plan.sync == SyncMode::Full {
            chain.push(opcode::Fsync::new(dirfd).build());
        }
        match self.queue_chain(slot_id, chain) {
            Ok(()) => None,
            Err(e) => {
                self.discard(slot_id);
                Some(Err(e))
            }
        }
    }
}
