//! [`Op::advance`]: what a phase's results mean, and what comes next.

use std::io;
use std::sync::atomic::Ordering;

use hicache_core::{MissReason, ReadOutcome};

use super::{Next, OPEN_RETRIES, Op, Phase, Rename, Step, errno, os, pool};
use crate::beneath;
use crate::config::SyncMode;
use crate::protocol::{self, AfterRename, Stored};
use crate::protocol::{OpKind, Outcome};
use crate::root::{IoFailure, Root};

impl Op {
    /// Reads the results of [`Op::steps`] (one per step, in order; [`NOT_RUN`](super::NOT_RUN) for those
    /// that did not run) and decides what comes next. `iov` is the caller's iovecs.
    pub(crate) fn advance(&mut self, root: &Root, iov: &[libc::iovec], res: &[i64]) -> Next {
        let steps = self.steps();
        let r = |s: Step| steps.result(res, s);
        match (self.kind, self.phase) {
            (OpKind::Write, Phase::Start | Phase::WriteRest) => self.after_write(root, iov, r),
            (OpKind::Write, Phase::Publish(how)) => {
                self.after_publish(root, how, r(Step::Publish(how)), r(Step::SyncDir))
            }
            (OpKind::Read, _) => self.after_read(root, r),
            (OpKind::Exists, Phase::Start) => self.after_exists(root, r(Step::StatName)),
            (OpKind::Remove, Phase::Start) => self.after_remove_stat(root, r(Step::StatName)),
            (_, Phase::MoveToSpare) => self.after_move_to_spare(root, r(Step::MoveToSpare)),
            (_, Phase::Unlink) => match r(Step::Unlink) {
                r if r >= 0 || errno(r) == libc::ENOENT => self.done(root, Ok(Outcome::Done)),
                r => self.fail(root, "unlink", os(r)),
            },
            (kind, phase) => self.fail(
                root,
                "run",
                io::Error::other(format!("no phase {phase:?} for {kind:?}")),
            ),
        }
    }

    /// Whether a failed open may run again: a recycled spare that is gone or no longer a
    /// plain file is replaced by a new one, a new spare whose name is taken gets another
    /// (a few times), a bucket dir that went is recreated (once); a scoped lookup that raced
    /// a rename is tried a few times.
    fn open_again(&mut self, root: &Root, r: i64) -> Result<bool, IoFailure> {
        let e = errno(r);
        if matches!(e, libc::EAGAIN | libc::EXDEV) && self.retries < OPEN_RETRIES {
            self.retries += 1;
            return Ok(true);
        }
        if self.kind == OpKind::Write && self.spare.is_some() && !self.create {
            // Unlinked as a name (a link planted there is removed, never followed).
            let _ = beneath::unlink(self.stage_dir(), self.tmp.as_cstr());
            self.stage(root, false);
            return Ok(true);
        }
        if self.kind == OpKind::Write
            && self.spare.is_some()
            && e == libc::EEXIST
            && self.retries < OPEN_RETRIES
        {
            // A new spare's name is taken (spare names sit in shared bucket dirs and their
            // ids are sequential): another id; what is there is left alone.
            self.retries += 1;
            self.stage(root, false);
            return Ok(true);
        }
        if !protocol::is_missing(e) || self.restarted {
            return Ok(false);
        }
        self.restarted = true;
        let renewed = self.renew_bucket(root)?;
        if renewed && self.kind == OpKind::Write {
            // A new file in the new dir.
            self.stage(root, false);
        }
        Ok(renewed)
    }

    fn after_write(&mut self, root: &Root, iov: &[libc::iovec], r: impl Fn(Step) -> i64) -> Next {
        if self.phase == Phase::Start {
            let opened = r(Step::OpenStaged);
            if opened < 0 {
                return match self.open_again(root, opened) {
                    Ok(true) => Next::Run,
                    Ok(false) => {
                        let path = self.staged_path(root);
                        self.done(
                            root,
                            Err(IoFailure {
                                op: "create",
                                path,
                                error: os(opened),
                            }),
                        )
                    }
                    Err(f) => self.done(root, Err(f)),
                };
            }
            self.open = true;
            self.staged = true;
        }
        let wrote = r(Step::Write);
        if wrote < 0 {
            let (call, error) = self.transfer_failure("pwritev", wrote);
            return self.fail_staged(root, call, error);
        }
        let wrote = wrote as u64;
        if wrote < self.remaining() {
            if wrote == 0 {
                let error = io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write: {} of {} bytes", self.written, self.expected),
                );
                return self.fail_staged(root, "pwritev", error);
            }
            // A short write: the rest of the phase was not run and the file is still open;
            // the next phase writes what is left, from where it stopped.
            self.written += wrote;
            self.rest = advance_iov(iov, self.written);
            self.phase = Phase::WriteRest;
            return Next::Run;
        }
        if self.sync != SyncMode::None {
            let synced = r(Step::DataSync);
            if synced < 0 {
                return self.fail_staged(root, "fdatasync", os(synced));
            }
            root.flushed.file();
        }
        let closed = r(Step::Close);
        if closed < 0 {
            return self.fail_staged(root, "close", os(closed));
        }
        self.open = false;
        self.after_publish(
            root,
            self.first,
            r(Step::Publish(self.first)),
            r(Step::SyncDir),
        )
    }

    /// The staged file's path, for a message about it.
    fn staged_path(&self, root: &Root) -> std::path::PathBuf {
        root.dir
            .object_path(self.stage_bucket(), self.tmp.as_bytes())
    }

    fn fail_staged(&mut self, root: &Root, op: &'static str, error: io::Error) -> Next {
        let path = self.staged_path(root);
        self.done(root, Err(IoFailure { op, path, error }))
    }

    /// After a publishing rename (`renamed`) done `how`, and the bucket dir's flush that
    /// followed it (`dir_sync`, under `sync = full`).
    fn after_publish(&mut self, root: &Root, how: Rename, renamed: i64, dir_sync: i64) -> Next {
        let result = if renamed >= 0 {
            Ok(())
        } else {
            Err(os(renamed))
        };
        let next = match how {
            Rename::NoReplace | Rename::Exchange => {
                protocol::after_rename(result, how == Rename::Exchange)
            }
            Rename::Plain => match result {
                Ok(()) => AfterRename::Published,
                Err(e) if e.kind() == io::ErrorKind::NotFound => AfterRename::BucketGone,
                Err(e) => AfterRename::Failed(e),
            },
        };
        match next {
            AfterRename::Published => {
                self.staged = false;
                if how == Rename::Exchange {
                    self.recycle_tmp(root);
                }
                self.published(root, dir_sync)
            }
            AfterRename::Exchange => {
                self.phase = Phase::Publish(Rename::Exchange);
                Next::Run
            }
            AfterRename::Rename { unsupported } => {
                if unsupported && let Some(pool) = root.spares.as_ref() {
                    pool.exchange.store(false, Ordering::Relaxed);
                }
                self.phase = Phase::Publish(Rename::Plain);
                Next::Run
            }
            // The staged file went with its bucket dir: the write starts over in a new one.
            AfterRename::BucketGone => match self.renewed {
                false => match self.renew_bucket(root) {
                    Ok(true) => {
                        self.renewed = true;
                        self.staged = false;
                        self.written = 0;
                        self.rest.clear();
                        self.stage(root, false);
                        self.phase = Phase::Start;
                        Next::Run
                    }
                    Ok(false) => self.fail(root, "rename", os(-(libc::ENOENT as i64))),
                    Err(f) => self.done(root, Err(f)),
                },
                true => self.fail(root, "rename", os(-(libc::ENOENT as i64))),
            },
            AfterRename::Failed(e) => self.fail(root, "rename", e),
        }
    }

    /// The object is published; with `sync = full` the bucket dir's flush must have worked
    /// too (else it is published but not known to be durable, and that is reported).
    fn published(&mut self, root: &Root, dir_sync: i64) -> Next {
        if self.sync == SyncMode::Full {
            if dir_sync < 0 {
                let failure = IoFailure {
                    op: "fsync bucket dir",
                    path: root.dir.bucket_path(self.bucket_id),
                    error: os(dir_sync),
                };
                return self.done(root, Err(failure));
            }
            root.flushed.dir();
        }
        self.done(root, Ok(Outcome::Done))
    }

    /// Keeps the file now under [`Op::tmp`] as a spare for a later write, or unlinks it
    /// (only a regular file is kept: the name may have changed hands meanwhile).
    fn recycle_tmp(&self, root: &Root) {
        if let (Some(id), Some(pool)) = (self.spare, root.spares.as_ref()) {
            let found = beneath::stat(self.stage_dir(), self.tmp.as_cstr());
            if !protocol::recycle(pool, self.stage_bucket(), id, found) {
                let _ = beneath::unlink(self.stage_dir(), self.tmp.as_cstr());
            }
        }
    }

    fn after_read(&mut self, root: &Root, r: impl Fn(Step) -> i64) -> Next {
        let opened = r(Step::OpenObject);
        if opened < 0 {
            return match self.open_again(root, opened) {
                Ok(true) => Next::Run,
                Ok(false) if protocol::is_missing(errno(opened)) => self.done(
                    root,
                    Ok(Outcome::Read(ReadOutcome::Miss(MissReason::NotFound))),
                ),
                Ok(false) => self.fail(root, "open", os(opened)),
                Err(f) => self.done(root, Err(f)),
            };
        }
        self.open = r(Step::Close) < 0;
        let (got, beyond) = (r(Step::Read), r(Step::Guard));
        if got < 0 {
            let (call, error) = self.transfer_failure("preadv", got);
            return self.fail(root, call, error);
        }
        if beyond < 0 {
            return self.fail(root, "pread past the end", os(beyond));
        }
        // A miss looks at the name again: what is stored there now, for the message and to
        // refuse what is not a regular file.
        let look = || {
            let st = beneath::stat(self.bucket(), self.name.as_cstr()).ok()?;
            Some(Stored {
                regular: beneath::is_file(&st),
                size: st.st_size as u64,
            })
        };
        match protocol::read_outcome(self.expected, got as u64, beyond as u64, look) {
            Ok(outcome) => self.done(root, Ok(Outcome::Read(outcome))),
            Err(e) => self.fail(root, "preadv", e),
        }
    }

    fn after_exists(&mut self, root: &Root, stat: i64) -> Next {
        if stat >= 0 {
            let kind = u32::from(self.stx.stx_mode) & libc::S_IFMT;
            return match protocol::exists_by_type(kind) {
                Ok(found) => self.done(root, Ok(Outcome::Exists(found))),
                Err(e) => self.fail(root, "stat", e),
            };
        }
        match self.open_again(root, stat) {
            Ok(true) => Next::Run,
            Ok(false) if protocol::is_missing(errno(stat)) => {
                self.done(root, Ok(Outcome::Exists(false)))
            }
            Ok(false) => self.fail(root, "stat", os(stat)),
            Err(f) => self.done(root, Err(f)),
        }
    }

    fn after_remove_stat(&mut self, root: &Root, stat: i64) -> Next {
        if stat < 0 {
            if protocol::is_missing(errno(stat)) {
                return self.done(root, Ok(Outcome::Done));
            }
            return self.fail(root, "stat", os(stat));
        }
        let regular = u32::from(self.stx.stx_mode) & libc::S_IFMT == libc::S_IFREG;
        match pool(root) {
            // To a spare name, to be recycled by a later write.
            Some(pool) if regular => {
                let id = pool.fresh();
                self.tmp = pool.name(id);
                self.stage = None;
                self.spare = Some(id);
                self.phase = Phase::MoveToSpare;
            }
            // A link, or whatever else, is unlinked itself (never followed).
            _ => self.phase = Phase::Unlink,
        }
        Next::Run
    }

    fn after_move_to_spare(&mut self, root: &Root, moved: i64) -> Next {
        if moved < 0 {
            // The name went, or the rename failed: unlink instead.
            self.phase = Phase::Unlink;
            return Next::Run;
        }
        self.recycle_tmp(root);
        self.done(root, Ok(Outcome::Done))
    }
}

/// The iovecs of `iov` past its first `skip` bytes (a copy: the caller's stay as they are).
fn advance_iov(iov: &[libc::iovec], mut skip: u64) -> Vec<libc::iovec> {
    let mut rest = Vec::with_capacity(iov.len());
    for v in iov {
        let len = v.iov_len as u64;
        if skip >= len {
            skip -= len;
            continue;
        }
        rest.push(libc::iovec {
            // SAFETY: skip < len, so the advanced pointer stays inside the buffer.
            iov_base: unsafe { v.iov_base.cast::<u8>().add(skip as usize) }.cast(),
            iov_len: v.iov_len - skip as usize,
        });
        skip = 0;
    }
    rest
}
