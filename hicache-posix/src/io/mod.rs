//! The thread pool's executor: an operation's steps ([`crate::protocol::op`]) as blocking
//! system calls, one after another, with the results handed to [`Op::advance`]. With a
//! [`DataPath`], the `Read` and `Write` steps go to the path instead ([`Running`] stops at
//! them, so a worker can gather several operations' transfers into one call).
//!
//! Every path operation goes through [`crate::beneath`]: objects are reached from their
//! bucket dir's handle by one name, and no link is ever followed. Names live in stack
//! buffers and transfers are single vectored syscalls, so the hot path allocates nothing per
//! page; `EINTR` is retried. `Read ⇒ Guard` runs as one `preadv`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use hicache_core::raw::AlignedBuf;

use crate::beneath;
use crate::data_path::{DataPath, Direction, Transfer};
use crate::protocol::op::{MAX_STEPS, NOT_RUN, Next, Op, Rename, Step, Steps};
use crate::protocol::{Guard, Outcome};
use crate::root::{IoFailure, Root};

/// A syscall result as the kernel gives io_uring's: the value, or minus the errno.
fn kernel_result(r: io::Result<u64>) -> i64 {
    match r {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(e) => -i64::from(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// One vectored transfer at `offset`, retried on `EINTR`.
///
/// Raw `pwritev`/`preadv`, not `nix`'s: those take `IoSlice`s, which are Rust slices, and
/// these iovecs point into registered memory that the kernel reads or writes while only the
/// plan's pins (not Rust references) guard it.
fn transfer(fd: &OwnedFd, iov: &[libc::iovec], offset: u64, write: bool) -> io::Result<u64> {
    let count = libc::c_int::try_from(iov.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many iovecs"))?;
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    loop {
        // SAFETY: every iovec points into memory the caller resolved against a live
        // registration, or into the worker's own guard block; the fd is open.
        let n = unsafe {
            if write {
                libc::pwritev(fd.as_raw_fd(), iov.as_ptr(), count, offset)
            } else {
                libc::preadv(fd.as_raw_fd(), iov.as_ptr(), count, offset)
            }
        };
        if n >= 0 {
            return Ok(n as u64);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Room a blocking item reuses, one per I/O thread: the guard block and the iovec list it is
/// appended to, and a sealed write's header block and iovecs, so an item allocates nothing
/// once these have grown to the longest object.
pub(crate) struct Scratch {
    guard: Guard,
    /// Filled, used and cleared within one read.
    iov: Vec<libc::iovec>,
    /// Alignment of the header blocks below (the roots' direct-I/O alignment).
    align: usize,
    /// A sealed write's header, filled from the object's first segment (see [`Scratch::seal`]).
    header: Option<AlignedBuf>,
    /// A sealed write's iovecs: `header`, then the object's others.
    sealed: Vec<libc::iovec>,
}

// SAFETY: the iovec lists hold pointers only during one item on the thread that owns the
// scratch (they are cleared before it ends); the guard and header are owned memory, like a Box.
unsafe impl Send for Scratch {}

impl Scratch {
    /// Scratch for roots whose direct-I/O alignment is at most `align`.
    pub(crate) fn new(align: u64) -> io::Result<Self> {
        Ok(Scratch {
            guard: Guard::new(align)?,
            iov: Vec::new(),
            align: usize::try_from(align).unwrap_or(usize::MAX).max(1),
            header: None,
            sealed: Vec::new(),
        })
    }

    /// A write's iovecs with its first segment replaced by a sealed copy: the copy is made in
    /// this thread's header block, `fill` completes it from the other segments' bytes, and
    /// `run` gets the new list. `fill`'s error ends the item unwritten.
    ///
    /// # Safety
    /// `iov` must point into memory that stays readable, and that nobody writes, until this
    /// call returns (a plan's pins on its write sources).
    pub(crate) unsafe fn seal<T>(
        &mut self,
        iov: &[libc::iovec],
        fill: impl FnOnce(&[std::io::IoSlice<'_>], &mut [u8]) -> hicache_core::Result<()>,
        run: impl FnOnce(&[libc::iovec], &mut Scratch) -> T,
    ) -> hicache_core::Result<T> {
        let Some((first, rest)) = iov.split_first() else {
            return Err(hicache_core::Error::InvalidBatch {
                reason: "a sealed write needs a first segment to seal".into(),
            });
        };
        let len = first.iov_len;
        let mut header = match self.header.take() {
            Some(h) if h.len() >= len => h,
            _ => AlignedBuf::zeroed(len.max(self.align).next_multiple_of(self.align), self.align)?,
        };
        // SAFETY: the caller keeps `first` readable and unwritten for this call; `header`
        // holds at least `len` bytes.
        header.as_mut_slice()[..len].copy_from_slice(unsafe {
            std::slice::from_raw_parts(first.iov_base.cast::<u8>(), len)
        });
        // SAFETY: `IoSlice` has `iovec`'s layout on Unix; the caller keeps these readable
        // and unwritten for this call.
        let payload = unsafe {
            std::slice::from_raw_parts(rest.as_ptr().cast::<std::io::IoSlice<'_>>(), rest.len())
        };
        let filled = fill(payload, &mut header.as_mut_slice()[..len]);
        let out = filled.map(|()| {
            let mut list = std::mem::take(&mut self.sealed);
            list.push(libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: len,
            });
            list.extend_from_slice(rest);
            let out = run(&list, self);
            list.clear();
            self.sealed = list;
            out
        });
        self.header = Some(header);
        out
    }

    /// `Read ⇒ Guard` as one `preadv` of the object's iovecs and the guard: the results of
    /// the two steps (the bytes before the expected end, the bytes past it).
    fn read_with_guard(&mut self, fd: &OwnedFd, iov: &[libc::iovec], expected: u64) -> (i64, i64) {
        self.iov.clear();
        self.iov.extend_from_slice(iov);
        self.iov.push(self.guard.iovec());
        // A regular file's read stops short only at its end, so one call tells the length:
        // no continuing (which, under O_DIRECT at an unaligned end, would only fail).
        let read = transfer(fd, &self.iov, 0, false);
        self.iov.clear();
        match read {
            Ok(n) => (
                kernel_result(Ok(n.min(expected))),
                kernel_result(Ok(n.saturating_sub(expected))),
            ),
            Err(e) => {
                let r = kernel_result(Err(e));
                (r, r)
            }
        }
    }
}

/// One operation being run with blocking calls, step by step: where it stands in its phase
/// and what its steps returned so far. Steps follow the links [`Op::steps`] describes: a
/// step that fails or a write that ends short stops its phase (the rest report
/// [`NOT_RUN`]), except where a step [goes on](Step::goes_on). What the results mean is
/// [`Op::advance`]'s to say.
pub(crate) struct Running {
    op: Op,
    file: Option<OwnedFd>,
    steps: Steps,
    res: [i64; MAX_STEPS],
    k: usize,
}

/// Where [`Running::drive`] stopped.
pub(crate) enum Progress {
    /// The next step moves the object's bytes: take it with [`Running::transfer`], move it,
    /// and hand the result to [`Running::transferred`].
    Transfer,
    /// The operation is over (its file, if one is still open, closes with the `Running`).
    Done(Result<Outcome, IoFailure>),
}

impl Running {
    pub(crate) fn new(op: Op) -> Self {
        let steps = op.steps();
        Running {
            op,
            file: None,
            steps,
            res: [NOT_RUN; MAX_STEPS],
            k: 0,
        }
    }

    /// Runs steps until the operation ends, or (with a data path) until its next step is a
    /// `Read` or `Write` for the path to move.
    pub(crate) fn drive(
        &mut self,
        root: &Root,
        iov: &[libc::iovec],
        scratch: &mut Scratch,
        path: Option<&dyn DataPath>,
    ) -> Progress {
        loop {
            let list = self.steps;
            let list = list.as_slice();
            while self.k < list.len() {
                let k = self.k;
                let step = list[k];
                let r = match (path, step) {
                    (None, Step::Read)
                        if list.get(k + 1) == Some(&Step::Guard) && self.file.is_some() =>
                    {
                        if let Some(fd) = self.file.as_ref() {
                            (self.res[k], self.res[k + 1]) =
                                scratch.read_with_guard(fd, iov, self.op.expected());
                        }
                        self.k += 2;
                        continue;
                    }
                    (Some(_), Step::Read | Step::Write) => return Progress::Transfer,
                    _ => execute(root, &mut self.op, step, iov, &mut self.file, scratch),
                };
                self.record(r);
            }
            match self.op.advance(root, iov, &self.res[..list.len()]) {
                Next::Run => {
                    self.steps = self.op.steps();
                    self.res = [NOT_RUN; MAX_STEPS];
                    self.k = 0;
                }
                Next::Done(result) => return Progress::Done(result),
            }
        }
    }

    /// Records the result of the current step and moves past it, or past the phase's end
    /// when the step ends the phase.
    fn record(&mut self, r: i64) {
        let list = self.steps;
        let list = list.as_slice();
        let step = list[self.k];
        self.res[self.k] = r;
        let short = step == Step::Write && r >= 0 && r as u64 != self.op.remaining();
        self.k = if (r < 0 || short) && !step.goes_on() {
            list.len()
        } else {
            self.k + 1
        };
    }

    /// The transfer the current step asks for (`Write`: what is left of the object at the
    /// bytes written so far; `Read`: the object's bytes from the start). `None` without an
    /// open file, or at another step.
    pub(crate) fn transfer<'a>(&'a self, iov: &'a [libc::iovec]) -> Option<Transfer<'a>> {
        let file = self.file.as_ref()?.as_fd();
        match self.steps.as_slice().get(self.k)? {
            Step::Write => Some(Transfer {
                file,
                segments: self.op.write_iov(iov),
                offset: self.op.written(),
                direction: Direction::Write,
            }),
            Step::Read => Some(Transfer {
                file,
                segments: iov,
                offset: 0,
                direction: Direction::Read,
            }),
            _ => None,
        }
    }

    /// Hands over the result of the transfer [`Running::drive`] stopped at, moved by the
    /// data path's `call`.
    pub(crate) fn transferred(&mut self, call: &'static str, result: io::Result<u64>) {
        let r = kernel_result(result.as_ref().map(|&n| n).map_err(clone_error));
        if let Err(e) = result {
            self.op.transfer_failed(call, e);
        }
        self.record(r);
    }
}

/// An error with the same errno, for the step result (the error itself goes to the
/// operation).
fn clone_error(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(n) => io::Error::from_raw_os_error(n),
        None => io::Error::from_raw_os_error(libc::EIO),
    }
}

/// Runs `op` to its end with blocking calls (see [`Running`]); a data path moves the bytes
/// when there is one.
pub(crate) fn run(
    root: &Root,
    op: Op,
    iov: &[libc::iovec],
    scratch: &mut Scratch,
    path: Option<&dyn DataPath>,
) -> Result<Outcome, IoFailure> {
    let mut running = Running::new(op);
    loop {
        match running.drive(root, iov, scratch, path) {
            Progress::Done(result) => return result,
            Progress::Transfer => {
                let (call, moved) = match (path, running.transfer(iov)) {
                    (Some(path), Some(t)) => (path.call(t.direction()), path.transfer(&t)),
                    _ => ("transfer", Err(io::Error::from_raw_os_error(libc::EBADF))),
                };
                running.transferred(call, moved);
            }
        }
    }
}

/// One step as a blocking call; its result as the kernel would give it to io_uring.
fn execute(
    root: &Root,
    op: &mut Op,
    step: Step,
    iov: &[libc::iovec],
    file: &mut Option<OwnedFd>,
    scratch: &mut Scratch,
) -> i64 {
    let no_file = || -(libc::EBADF as i64);
    match step {
        Step::OpenStaged | Step::OpenObject => {
            let (flags, mode) = op.open_flags(step, root);
            let (dir, name) = match step {
                Step::OpenStaged => (op.stage_dir(), op.tmp()),
                _ => (op.bucket(), op.name()),
            };
            match beneath::open(dir, name.as_cstr(), flags, mode) {
                Ok(fd) => {
                    *file = Some(fd);
                    0
                }
                Err(e) => kernel_result(Err(e)),
            }
        }
        Step::Write => match file.as_ref() {
            Some(fd) => kernel_result(transfer(fd, op.write_iov(iov), op.written(), true)),
            None => no_file(),
        },
        Step::Read => match file.as_ref() {
            Some(fd) => kernel_result(transfer(fd, iov, 0, false)),
            None => no_file(),
        },
        Step::Guard => match file.as_ref() {
            Some(fd) => {
                let guard = [scratch.guard.iovec()];
                kernel_result(transfer(fd, &guard, op.expected(), false))
            }
            None => no_file(),
        },
        Step::DataSync => match file.as_ref() {
            Some(fd) => kernel_result(beneath::retry(|| nix::unistd::fdatasync(fd)).map(|()| 0)),
            None => no_file(),
        },
        Step::Close => match file.take() {
            // The descriptor is released whatever close says; its error still counts (a
            // write's data may not have reached the file).
            Some(fd) => kernel_result(nix::unistd::close(fd).map(|()| 0).map_err(io::Error::from)),
            None => no_file(),
        },
        Step::Publish(how) => {
            let (from_dir, from) = (op.stage_dir(), op.tmp().as_cstr());
            let (to_dir, to) = (op.bucket(), op.name().as_cstr());
            kernel_result(
                match how {
                    Rename::NoReplace => beneath::rename_noreplace(from_dir, from, to_dir, to),
                    Rename::Exchange => beneath::exchange(from_dir, from, to_dir, to),
                    Rename::Plain => beneath::rename(from_dir, from, to_dir, to),
                }
                .map(|()| 0),
            )
        }
        Step::SyncDir => kernel_result(beneath::fsync(op.bucket()).map(|()| 0)),
        Step::StatName => match beneath::stat(op.bucket(), op.name().as_cstr()) {
            Ok(st) => {
                op.stx.stx_mode = st.st_mode as u16;
                0
            }
            Err(e) => kernel_result(Err(e)),
        },
        Step::MoveToSpare => kernel_result(
            beneath::rename(
                op.bucket(),
                op.name().as_cstr(),
                op.bucket(),
                op.tmp().as_cstr(),
            )
            .map(|()| 0),
        ),
        Step::Unlink => {
            kernel_result(beneath::unlink(op.bucket(), op.name().as_cstr()).map(|()| 0))
        }
    }
}

#[cfg(test)]
mod tests;
