//! The thread pool's executor: an operation's steps ([`crate::protocol::op`]) as blocking
//! system calls, one after another, with the results handed to [`Op::advance`].
//!
//! Every path operation goes through [`crate::beneath`]: objects are reached from their
//! bucket dir's handle by one name, and no link is ever followed. Names live in stack
//! buffers and transfers are single vectored syscalls, so the hot path allocates nothing per
//! page; `EINTR` is retried. `Read ⇒ Guard` runs as one `preadv`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::beneath;
use crate::config::SyncMode;
use crate::protocol::op::{MAX_STEPS, NOT_RUN, Next, Op, Rename, Step};
use crate::protocol::{Guard, OpKind, Outcome};
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

/// Room a blocking read reuses, one per I/O thread: the guard block and the iovec list it is
/// appended to, so a read allocates nothing once the list has grown to the longest object.
pub(crate) struct ReadScratch {
    guard: Guard,
    /// Filled, used and cleared within one read.
    iov: Vec<libc::iovec>,
}

// SAFETY: the iovec list holds pointers only during one read on the thread that owns the
// scratch (it is cleared before the read returns); the guard is owned memory, like a Box.
unsafe impl Send for ReadScratch {}

impl ReadScratch {
    /// Scratch for roots whose direct-I/O alignment is at most `align`.
    pub(crate) fn new(align: u64) -> io::Result<Self> {
        Ok(ReadScratch {
            guard: Guard::new(align)?,
            iov: Vec::new(),
        })
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

/// Runs `op` to its end with blocking calls, one step after another, following the links
/// [`Op::steps`] describes: a step that fails or a write that ends short stops its phase
/// (the rest report [`NOT_RUN`]), except where a step [goes on](Step::goes_on). What the
/// results mean is [`Op::advance`]'s to say.
pub(crate) fn run(
    root: &Root,
    op: &mut Op,
    iov: &[libc::iovec],
    scratch: &mut ReadScratch,
) -> Result<Outcome, IoFailure> {
    let mut file: Option<OwnedFd> = None;
    loop {
        let steps = op.steps();
        let list = steps.as_slice();
        let mut res = [NOT_RUN; MAX_STEPS];
        let mut k = 0;
        while k < list.len() {
            let step = list[k];
            if step == Step::Read
                && list.get(k + 1) == Some(&Step::Guard)
                && let Some(fd) = file.as_ref()
            {
                (res[k], res[k + 1]) = scratch.read_with_guard(fd, iov, op.expected());
                k += 2;
                continue;
            }
            let r = execute(root, op, step, iov, &mut file, scratch);
            res[k] = r;
            let short = step == Step::Write && r >= 0 && r as u64 != op.remaining();
            if (r < 0 || short) && !step.goes_on() {
                break;
            }
            k += 1;
        }
        match op.advance(root, iov, &res[..list.len()]) {
            Next::Run => {}
            Next::Done(result) => return result,
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
    scratch: &mut ReadScratch,
) -> i64 {
    let no_file = || -(libc::EBADF as i64);
    match step {
        Step::OpenStaged | Step::OpenObject => {
            let (flags, mode) = op.open_flags(step, root);
            let (dir, name) = match step {
                Step::OpenStaged => (op.stage_dir(root), op.tmp()),
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
            let (from_dir, from) = (op.stage_dir(root), op.tmp().as_cstr());
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
        Step::MoveToSpare => match root.spares.as_ref() {
            Some(pool) => kernel_result(
                beneath::rename(
                    op.bucket(),
                    op.name().as_cstr(),
                    pool.fd(),
                    op.tmp().as_cstr(),
                )
                .map(|()| 0),
            ),
            None => -(libc::ENOENT as i64),
        },
        Step::Unlink => {
            kernel_result(beneath::unlink(op.bucket(), op.name().as_cstr()).map(|()| 0))
        }
    }
}

/// Runs one operation of `kind` on object `name` with blocking calls (the thread pool's
/// way of running a plan's item).
pub(crate) fn run_item(
    root: &Root,
    kind: OpKind,
    sync: SyncMode,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    scratch: &mut ReadScratch,
) -> Result<Outcome, IoFailure> {
    let expected = iov.iter().map(|v| v.iov_len as u64).sum();
    let mut op = Op::new(root, kind, sync, bucket, name, expected)?;
    run(root, &mut op, iov, scratch)
}

#[cfg(test)]
mod tests;
