//! Each object operation written once: phases of [`Step`]s (the system calls) and one
//! interpreter of their results, [`Op::advance`]. An engine only executes: the thread pool
//! runs a phase's steps as blocking calls ([`crate::io`]), io_uring queues them as one chain
//! of linked SQEs ([`crate::uring`]), and both hand the results back to `advance`, which
//! ends the operation or names the next phase.
//!
//! | operation | phases |
//! |---|---|
//! | write | `OpenStaged → Write → [DataSync] → Close → Publish(first) → [SyncDir]`; after a short write `Write(rest) → …` again from the open file; a stored key `Publish(Exchange) → [SyncDir]`; no `renameat2` flags `Publish(Plain) → [SyncDir]` |
//! | read | `OpenObject → Read ⇒ Guard ⇒ Close` |
//! | exists | `StatName` |
//! | remove | `StatName`, then `MoveToSpare` (a regular file) or `Unlink`; without a spare pool `Unlink` |
//!
//! A step that fails, or a `Write` that moves fewer bytes than asked, ends its phase: the
//! steps after it report [`NOT_RUN`]. `⇒` marks steps after which the phase goes on anyway
//! ([`Step::goes_on`]): a read that ends early must still close its file, and its length is
//! judged here, not by the executor. This is io_uring's `IO_LINK` / `IO_HARDLINK`, which the
//! thread pool follows step by step.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::beneath;
use crate::config::SyncMode;
use crate::name::Name;
use crate::protocol::{OpKind, Outcome};
use crate::root::{IoFailure, Root};
use crate::spare::SparePool;

/// The most steps in one phase (a write with `sync = full`).
pub(crate) const MAX_STEPS: usize = 6;

/// The result of a step that did not run because an earlier one ended the phase.
pub(crate) const NOT_RUN: i64 = -(libc::ECANCELED as i64);

/// How many times an open that raced a rename in its dir (`EAGAIN`/`EXDEV` from a scoped
/// lookup) is tried again.
const OPEN_RETRIES: u8 = 3;

/// How a publish renames the staged file over the object's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rename {
    /// `renameat2(RENAME_NOREPLACE)`: publishes a new key, `EEXIST` for a stored one.
    NoReplace,
    /// `renameat2(RENAME_EXCHANGE)`: swaps with the stored object, which is then recycled.
    Exchange,
    /// `renameat`: replaces whatever is there.
    Plain,
}

impl Rename {
    /// The `renameat2` flags.
    pub(crate) fn flags(self) -> u32 {
        match self {
            Rename::NoReplace => libc::RENAME_NOREPLACE,
            Rename::Exchange => libc::RENAME_EXCHANGE,
            Rename::Plain => 0,
        }
    }
}

/// One system call of an operation, on the operation's names and its one open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Opens the staged file [`Op::tmp`] in [`Op::stage_dir`] with [`Op::open_flags`].
    OpenStaged,
    /// Writes [`Op::write_iov`] at offset [`Op::written`]; a result short of
    /// [`Op::remaining`] ends the phase.
    Write,
    /// `fdatasync` of the open file.
    DataSync,
    /// Closes the open file.
    Close,
    /// Renames the staged file to the object's name.
    Publish(Rename),
    /// `fsync` of the bucket dir.
    SyncDir,
    /// Opens the object [`Op::name`] in the bucket dir with [`Op::open_flags`].
    OpenObject,
    /// Reads the object's expected bytes into the caller's iovecs from offset 0.
    Read,
    /// Reads past the object's expected end (offset [`Op::expected`]) into the guard.
    Guard,
    /// Stats the object's name without following a link; the executor puts the file type
    /// in [`Op::stx`]'s `stx_mode`.
    StatName,
    /// Renames the object to the spare name [`Op::tmp`] in its bucket dir.
    MoveToSpare,
    /// Unlinks the object's name (a link itself, never what it points to).
    Unlink,
}

impl Step {
    /// Whether the phase goes on after this step fails or ends short.
    pub(crate) fn goes_on(self) -> bool {
        matches!(self, Step::Read | Step::Guard)
    }
}

/// The steps of one phase.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Steps {
    list: [Step; MAX_STEPS],
    len: usize,
}

impl Steps {
    fn new(steps: &[Step]) -> Self {
        let mut list = [Step::Close; MAX_STEPS];
        list[..steps.len()].copy_from_slice(steps);
        Steps {
            list,
            len: steps.len(),
        }
    }

    pub(crate) fn as_slice(&self) -> &[Step] {
        &self.list[..self.len]
    }

    /// The result of `step` in `res` (results in step order), or [`NOT_RUN`].
    fn result(&self, res: &[i64], step: Step) -> i64 {
        self.as_slice()
            .iter()
            .position(|&s| s == step)
            .and_then(|k| res.get(k).copied())
            .unwrap_or(NOT_RUN)
    }
}

/// Where an operation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The operation's first phase.
    Start,
    /// Write: the bytes a short write left, then the rest of the first phase.
    WriteRest,
    /// Write: publish the staged file again, this way.
    Publish(Rename),
    /// Remove: rename the regular file to a spare name.
    MoveToSpare,
    /// Remove: unlink the name.
    Unlink,
}

/// What an engine does after handing a phase's results to [`Op::advance`].
#[derive(Debug)]
pub(crate) enum Next {
    /// Run [`Op::steps`] again (the next phase, or the same one on a recreated dir).
    Run,
    /// The operation is over. A file it left open ([`Op::is_open`]) is the engine's to
    /// release.
    Done(Result<Outcome, IoFailure>),
}

/// One object operation in progress, at a stable address while an engine runs its steps
/// (io_uring reads its names and `stx` from here).
pub(crate) struct Op {
    kind: OpKind,
    sync: SyncMode,
    phase: Phase,
    bucket_id: [u8; 2],
    bucket: Arc<OwnedFd>,
    name: Name,
    /// The staged file: a spare (`spare` is its id), else a temporary file in the bucket dir.
    /// For a removal, the spare name the object moves to.
    tmp: Name,
    spare: Option<u64>,
    /// The bucket dir the staged file lies in when it is not the object's: a spare taken
    /// from another dir.
    stage: Option<([u8; 2], Arc<OwnedFd>)>,
    /// Whether opening the staged file creates it (it is not a recycled spare).
    create: bool,
    /// How the write's first phase publishes.
    first: Rename,
    expected: u64,
    written: u64,
    /// The iovecs past `written`, built only after a short write.
    rest: Vec<libc::iovec>,
    /// What [`Step::StatName`] found (its `stx_mode`).
    pub(crate) stx: libc::statx,
    /// A file is open (between a successful open and a successful close).
    open: bool,
    /// The staged file was opened, so it exists and a failed write removes it.
    staged: bool,
    /// The operation started over once after its dir (or spare) went.
    restarted: bool,
    /// The bucket dir was recreated during a publish.
    renewed: bool,
    retries: u8,
    /// A read counted in the spare pool's read tracker.
    reading: bool,
    /// How a data path's transfer failed (the call and its error), which a step result
    /// cannot carry.
    failed_transfer: Option<(&'static str, io::Error)>,
}

// SAFETY: `rest` holds iovecs only while the operation runs, pointing into memory its plan
// pins; the engine that owns the operation is the only one that touches them.
unsafe impl Send for Op {}

fn pool(root: &Root) -> Option<&SparePool> {
    root.spares.as_ref()
}

fn os(r: i64) -> io::Error {
    io::Error::from_raw_os_error(i32::try_from(-r).unwrap_or(libc::EIO))
}

fn errno(r: i64) -> i32 {
    i32::try_from(-r).unwrap_or(libc::EIO)
}

impl Op {
    /// Begins an operation of `kind` on object `name` in `bucket` whose bytes total
    /// `expected` (the iovecs' length; 0 for exists and remove).
    pub(crate) fn new(
        root: &Root,
        kind: OpKind,
        sync: SyncMode,
        bucket: [u8; 2],
        name: &[u8],
        expected: u64,
    ) -> Result<Op, IoFailure> {
        let name = Name::object(name).map_err(|error| IoFailure {
            op: "build name",
            path: root.dir.object_path(bucket, name),
            error,
        })?;
        let bucket_fd = root.dir.bucket(bucket).map_err(|error| IoFailure {
            op: "open bucket dir",
            path: root.dir.bucket_path(bucket),
            error,
        })?;
        // A removal without a spare pool to recycle into just unlinks.
        let unlinks = kind == OpKind::Remove && pool(root).is_none();
        let mut op = Op {
            kind,
            sync,
            phase: if unlinks { Phase::Unlink } else { Phase::Start },
            bucket_id: bucket,
            bucket: bucket_fd,
            name,
            tmp: Name::new(),
            spare: None,
            stage: None,
            create: false,
            first: Rename::Plain,
            expected,
            written: 0,
            rest: Vec::new(),
            // SAFETY: statx is plain old data; all-zero is a valid value.
            stx: unsafe { std::mem::zeroed() },
            open: false,
            staged: false,
            restarted: false,
            renewed: false,
            retries: 0,
            reading: false,
            failed_transfer: None,
        };
        match kind {
            OpKind::Write => op.stage(root, true),
            // Spares are not reused while a read that may hold one of their inodes runs.
            OpKind::Read => {
                if let Some(pool) = root.spares.as_ref() {
                    pool.reads.enter();
                    op.reading = true;
                }
            }
            OpKind::Exists | OpKind::Remove => {}
        }
        Ok(op)
    }

    /// Picks where a write stages its bytes, in the object's bucket dir: a recycled spare of
    /// the right size (overwritten in place) when `recycled`, else a new spare, or (without a
    /// spare pool) a new temp file.
    fn stage(&mut self, root: &Root, recycled: bool) {
        match pool(root) {
            Some(pool) => {
                let taken = if recycled {
                    pool.take(self.bucket_id, self.expected)
                } else {
                    None
                };
                let (from, id, create) = match taken {
                    Some((from, id)) => (from, id, false),
                    None => (self.bucket_id, pool.fresh(), true),
                };
                // A spare elsewhere whose dir cannot be opened goes back to the pool; the
                // write makes a new file here.
                self.stage = None;
                let (id, create) = if from == self.bucket_id {
                    (id, create)
                } else {
                    match root.dir.bucket(from) {
                        Ok(fd) => {
                            self.stage = Some((from, fd));
                            (id, create)
                        }
                        Err(_) => {
                            if !pool.give(from, id, self.expected) {
                                tracing::debug!(
                                    spare = id,
                                    "a spare whose dir cannot be opened is left there"
                                );
                            }
                            (pool.fresh(), true)
                        }
                    }
                };
                self.tmp = pool.name(id);
                self.spare = Some(id);
                self.create = create;
                self.first = if pool.exchange.load(Ordering::Relaxed) {
                    Rename::NoReplace
                } else {
                    Rename::Plain
                };
            }
            None => {
                self.tmp = Name::temp();
                self.stage = None;
                self.spare = None;
                self.create = true;
                self.first = Rename::Plain;
            }
        }
    }

    /// The steps of the current phase.
    pub(crate) fn steps(&self) -> Steps {
        use Step::*;
        let data = self.sync != SyncMode::None;
        let full = self.sync == SyncMode::Full;
        let mut list = [Close; MAX_STEPS];
        let mut len = 0;
        let mut push = |s: Step, on: bool| {
            if on {
                list[len] = s;
                len += 1;
            }
        };
        match (self.kind, self.phase) {
            (OpKind::Write, Phase::Start | Phase::WriteRest) => {
                push(OpenStaged, self.phase == Phase::Start);
                push(Write, true);
                push(DataSync, data);
                push(Close, true);
                push(Publish(self.first), true);
                push(SyncDir, full);
            }
            (OpKind::Write, Phase::Publish(how)) => {
                push(Publish(how), true);
                push(SyncDir, full);
            }
            (OpKind::Read, _) => {
                for s in [OpenObject, Read, Guard, Close] {
                    push(s, true);
                }
            }
            (_, Phase::MoveToSpare) => push(MoveToSpare, true),
            (_, Phase::Unlink) => push(Unlink, true),
            (OpKind::Exists | OpKind::Remove, _) => push(StatName, true),
        }
        Steps::new(&list[..len])
    }

    /// The bucket dir the object lives in.
    pub(crate) fn bucket(&self) -> BorrowedFd<'_> {
        self.bucket.as_fd()
    }

    /// The dir [`Op::tmp`] lies in: the bucket dir, or another one holding a recycled spare.
    pub(crate) fn stage_dir(&self) -> BorrowedFd<'_> {
        match &self.stage {
            Some((_, fd)) => fd.as_fd(),
            None => self.bucket(),
        }
    }

    /// The bucket dir [`Op::stage_dir`] names.
    pub(crate) fn stage_bucket(&self) -> [u8; 2] {
        self.stage.as_ref().map_or(self.bucket_id, |(b, _)| *b)
    }

    /// The object's name.
    pub(crate) fn name(&self) -> &Name {
        &self.name
    }

    /// The staged file's name (a write), or the spare a removal moves the object to.
    pub(crate) fn tmp(&self) -> &Name {
        &self.tmp
    }

    /// `open` flags of [`Step::OpenStaged`] and [`Step::OpenObject`] (the engines add
    /// `O_NOFOLLOW` and scoped resolution), and the mode a created file gets.
    pub(crate) fn open_flags(&self, step: Step, root: &Root) -> (libc::c_int, u32) {
        let direct = if root.direct { libc::O_DIRECT } else { 0 };
        match step {
            Step::OpenStaged if self.create => (
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | direct,
                root.file_mode,
            ),
            // A recycled spare. O_NONBLOCK: a FIFO planted in its place fails the open
            // (`ENXIO`, and the write goes to a new file) instead of hanging it until a
            // reader comes; it changes nothing for regular files.
            Step::OpenStaged => (libc::O_WRONLY | libc::O_NONBLOCK | direct, 0),
            // O_NONBLOCK: opening a FIFO planted under the root must not hang (it changes
            // nothing for regular files).
            _ => (libc::O_RDONLY | libc::O_NONBLOCK | direct, 0),
        }
    }

    /// The bytes the object should have.
    pub(crate) fn expected(&self) -> u64 {
        self.expected
    }

    /// Bytes already written (the offset of the next [`Step::Write`]).
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Bytes [`Step::Write`] has yet to move.
    pub(crate) fn remaining(&self) -> u64 {
        self.expected - self.written
    }

    /// The iovecs of [`Step::Write`]: the caller's, or what a short write left of them.
    pub(crate) fn write_iov<'a>(&'a self, iov: &'a [libc::iovec]) -> &'a [libc::iovec] {
        if self.written == 0 { iov } else { &self.rest }
    }

    /// Records how a data path's transfer failed; the step's result says only that it did.
    pub(crate) fn transfer_failed(&mut self, call: &'static str, error: io::Error) {
        self.failed_transfer = Some((call, error));
    }

    /// The call and error of the failed `Read` or `Write` step whose result is `r`: what a
    /// data path recorded, else the system call `syscall` with `r`'s errno.
    fn transfer_failure(&mut self, syscall: &'static str, r: i64) -> (&'static str, io::Error) {
        self.failed_transfer
            .take()
            .unwrap_or_else(|| (syscall, os(r)))
    }

    /// Whether the operation holds an open file.
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    fn object_failure(&self, root: &Root, op: &'static str, error: io::Error) -> IoFailure {
        IoFailure {
            op,
            path: root.dir.object_path(self.bucket_id, self.name.as_bytes()),
            error,
        }
    }

    fn fail(&mut self, root: &Root, op: &'static str, error: io::Error) -> Next {
        self.done(root, Err(self.object_failure(root, op, error)))
    }

    /// Ends the operation: the read tracker is left and a staged file that was not
    /// published is removed.
    fn done(&mut self, root: &Root, result: Result<Outcome, IoFailure>) -> Next {
        if result.is_err() {
            self.discard();
        }
        self.end(root);
        Next::Done(result)
    }

    /// Gives the operation up midway (an engine that cannot queue its next phase): a
    /// staged file is removed and the read tracker left. The engine releases an open file.
    pub(crate) fn abandon(&mut self, root: &Root) {
        self.discard();
        self.end(root);
    }

    /// Leaves the read tracker (idempotent).
    fn end(&mut self, root: &Root) {
        if std::mem::take(&mut self.reading)
            && let Some(pool) = root.spares.as_ref()
        {
            pool.reads.exit();
        }
    }

    /// Removes a staged file that will not be published.
    fn discard(&mut self) {
        if std::mem::take(&mut self.staged) {
            let _ = beneath::unlink(self.stage_dir(), self.tmp.as_cstr());
        }
    }

    /// The bucket dir again when its handle was removed from the tree (the dir is
    /// recreated): Ok(false) when it was not, so a miss there is a real miss.
    fn renew_bucket(&mut self, root: &Root) -> Result<bool, IoFailure> {
        if !beneath::is_removed(self.bucket()) {
            return Ok(false);
        }
        tracing::debug!(bucket = %root.dir.bucket_path(self.bucket_id).display(), "bucket dir was removed; recreating it");
        self.bucket = root
            .dir
            .reopen(self.bucket_id, Some(&self.bucket))
            .map_err(|error| IoFailure {
                op: "recreate bucket dir",
                path: root.dir.bucket_path(self.bucket_id),
                error,
            })?;
        Ok(true)
    }
}

mod advance;
#[cfg(test)]
mod tests;
