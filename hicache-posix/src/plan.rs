//! A batch turned into plain data an engine thread can run: object names in one arena,
//! iovecs in one array, routes, and one result slot per item.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use hicache_core::raw::{ReadCheck, SourceSlice, TargetSlice, WriteSeal};
use hicache_core::{Error, ReadOutcome, Result};

use crate::data_path::DataPath;
use crate::io::{self, Progress, Running};
use crate::protocol::op::Op;
pub(crate) use crate::protocol::{OpKind, Outcome};
use crate::root::{IoFailure, Root};

/// A pin a plan holds on the memory its iovecs point into.
#[derive(Debug)]
pub(crate) enum Held {
    /// Memory a write reads.
    Source(#[allow(dead_code)] SourceSlice),
    /// Memory a read fills.
    Target(#[allow(dead_code)] TargetSlice),
}

/// One batch, owned, so engine threads can run it after the caller's borrow ends.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The plugin, for errors.
    pub(crate) plugin: &'static str,
    pub(crate) kind: OpKind,
    pub(crate) sync: crate::config::SyncMode,
    names: Vec<u8>,
    name_ends: Vec<usize>,
    pub(crate) routes: Vec<(usize, [u8; 2])>,
    iov: Vec<libc::iovec>,
    iov_ends: Vec<usize>,
    /// Items that failed preparation (bad slice); engines skip them.
    pub(crate) prepared: Vec<bool>,
    /// The registration an item's only segment lies in (io_uring fixed buffers), if it has
    /// exactly one segment.
    pub(crate) single_region: Vec<Option<u64>>,
    results: Vec<Mutex<Option<Result<Outcome>>>>,
    /// Set when the caller's future was dropped: items not started yet are skipped.
    cancelled: AtomicBool,
    /// Pins on every range the iovecs point into: the memory stays alive, registered and
    /// reserved until the engine has ended every item and calls [`Plan::release`].
    pins: Mutex<Vec<Held>>,
    /// What each object read whole is checked by, on the thread that read it (see
    /// [`Plan::check_reads`]).
    check: Option<*const ReadCheck<'static>>,
    /// What completes each written object's first segment, on the thread that writes it
    /// (see [`Plan::seal_writes`]).
    seal: Option<*const WriteSeal<'static>>,
}

// SAFETY: the iovecs point into ranges pinned by `pins` until every item has ended (engines
// release them only then, and no item starts afterwards); `check` is a `Sync` closure kept
// alive by `check_reads`' caller while items run, and `seal` by `seal_writes`' caller;
// nothing else in Plan is thread-bound.
unsafe impl Send for Plan {}
// SAFETY: as above; result slots are mutexes, written by the one thread running an item.
unsafe impl Sync for Plan {}

impl Plan {
    pub(crate) fn new(
        plugin: &'static str,
        kind: OpKind,
        sync: crate::config::SyncMode,
        items: usize,
    ) -> Self {
        Plan {
            plugin,
            kind,
            sync,
            names: Vec::with_capacity(items * 80),
            name_ends: Vec::with_capacity(items),
            routes: Vec::with_capacity(items),
            iov: Vec::with_capacity(items * 3),
            iov_ends: Vec::with_capacity(items),
            prepared: Vec::with_capacity(items),
            single_region: Vec::with_capacity(items),
            results: Vec::with_capacity(items),
            cancelled: AtomicBool::new(false),
            pins: Mutex::new(Vec::with_capacity(items * 3)),
            check: None,
            seal: None,
        }
    }

    /// Has every object this plan reads whole checked by `check` (item index, the bytes of
    /// its iovecs) on the thread that read it; a failed check makes it a miss.
    ///
    /// # Safety
    /// `check` must stay alive until the engine has ended the plan: until its run's future
    /// completes, or until that future's drop returns (which waits for the items running and
    /// skips the others, see [`crate::flight`]).
    pub(crate) unsafe fn check_reads(&mut self, check: &ReadCheck<'_>) {
        // SAFETY: only the lifetime is erased; the caller keeps `check` alive for as long as
        // an engine thread can call it (above).
        let erased: &ReadCheck<'static> = unsafe { std::mem::transmute(check) };
        self.check = Some(erased as *const ReadCheck<'static>);
    }

    /// Has every object this plan writes sealed by `seal` (item index, the bytes of its
    /// iovecs after the first, a copy of the first to fill in) on the thread that writes it,
    /// just before; the filled copy is written in the first iovec's place.
    ///
    /// # Safety
    /// As for [`Plan::check_reads`]: `seal` must stay alive until the engine has ended the
    /// plan.
    pub(crate) unsafe fn seal_writes(&mut self, seal: &WriteSeal<'_>) {
        // SAFETY: only the lifetime is erased; the caller keeps `seal` alive for as long as
        // an engine thread can call it (above).
        let erased: &WriteSeal<'static> = unsafe { std::mem::transmute(seal) };
        self.seal = Some(erased as *const WriteSeal<'static>);
    }

    /// A read's result after its check: a hit whose bytes fail it becomes a miss.
    fn checked(&self, i: usize, result: Result<Outcome>) -> Result<Outcome> {
        let (Ok(Outcome::Read(ReadOutcome::Hit)), Some(check)) = (&result, self.check) else {
            return result;
        };
        let iov = self.iov(i);
        // SAFETY: `IoSlice` has `iovec`'s layout on Unix; these iovecs point into memory this
        // plan pins as read targets, which this thread has just filled and nobody else writes
        // while the pins last.
        let bytes = unsafe {
            std::slice::from_raw_parts(iov.as_ptr().cast::<std::io::IoSlice<'_>>(), iov.len())
        };
        // SAFETY: `check_reads`' caller keeps the check alive while items run.
        let check = unsafe { &*check };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(i, bytes))) {
            Ok(Ok(())) => result,
            Ok(Err(reason)) => Ok(Outcome::Read(ReadOutcome::Miss(reason))),
            Err(_) => Err(Error::backend(self.plugin, "the read's check panicked")),
        }
    }

    /// Adds an item; `iov` is empty for exists/remove.
    pub(crate) fn push(
        &mut self,
        name: &str,
        route: (usize, [u8; 2]),
        iov: &[libc::iovec],
        single_region: Option<u64>,
    ) {
        self.single_region.push(single_region);
        self.names.extend_from_slice(name.as_bytes());
        self.name_ends.push(self.names.len());
        self.routes.push(route);
        self.iov.extend_from_slice(iov);
        self.iov_ends.push(self.iov.len());
        self.prepared.push(true);
        self.results.push(Mutex::new(None));
    }

    /// Adds an item that already failed (a bad slice): engines skip it.
    pub(crate) fn push_failed(&mut self, error: Error) {
        self.single_region.push(None);
        self.name_ends.push(self.names.len());
        self.routes.push((0, *b"00"));
        self.iov_ends.push(self.iov.len());
        self.prepared.push(false);
        self.results.push(Mutex::new(Some(Err(error))));
    }

    /// Takes the result of item `i` (`None` if it never ran).
    pub(crate) fn take(&self, i: usize) -> Option<Result<Outcome>> {
        self.results[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Stores the result of item `i`.
    pub(crate) fn set(&self, i: usize, result: Result<Outcome>) {
        *self.results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
    }

    /// Keeps a pin for as long as the plan lives.
    pub(crate) fn hold(&mut self, pin: Held) {
        self.pins
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .push(pin);
    }

    /// Drops the pins once no item runs any more; engines call it before reporting the plan
    /// done, so a caller that sees the end also sees its memory released.
    pub(crate) fn release(&self) {
        let pins = std::mem::take(&mut *self.pins.lock().unwrap_or_else(|e| e.into_inner()));
        drop(pins);
    }

    /// Skips every item not started yet (the caller stopped waiting).
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// Whether the caller stopped waiting.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub(crate) fn len(&self) -> usize {
        self.results.len()
    }

    pub(crate) fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.name_ends[i - 1] };
        &self.names[start..self.name_ends[i]]
    }

    pub(crate) fn iov(&self, i: usize) -> &[libc::iovec] {
        let start = if i == 0 { 0 } else { self.iov_ends[i - 1] };
        &self.iov[start..self.iov_ends[i]]
    }

    /// Runs item `i` with blocking syscalls (bytes moved by `path` when there is one) and
    /// stores its result.
    pub(crate) fn run_item(
        &self,
        i: usize,
        roots: &[Root],
        scratch: &mut io::Scratch,
        path: Option<&dyn DataPath>,
    ) {
        if !self.prepared[i] {
            return;
        }
        if self.is_cancelled() {
            self.set(i, Err(self.cancelled()));
            return;
        }
        let root = &roots[self.routes[i].0];
        let result = match (self.kind, self.seal) {
            (OpKind::Write, Some(seal)) => self.run_sealed(i, root, roots, scratch, path, seal),
            _ => self
                .begin(i, roots)
                .and_then(|op| io::run(root, op, self.iov(i), scratch, path))
                .map_err(|f| self.error(f)),
        };
        let result = self.checked(i, result);
        self.set(i, result);
    }

    /// Item `i`, a write, with its first iovec replaced by the copy `seal` completed.
    fn run_sealed(
        &self,
        i: usize,
        root: &Root,
        roots: &[Root],
        scratch: &mut io::Scratch,
        path: Option<&dyn DataPath>,
        seal: *const WriteSeal<'static>,
    ) -> Result<Outcome> {
        // SAFETY: `seal_writes`' caller keeps the seal alive while items run.
        let seal = unsafe { &*seal };
        let fill = |payload: &[std::io::IoSlice<'_>], header: &mut [u8]| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| seal(i, payload, header)))
                .unwrap_or_else(|_| Err(Error::backend(self.plugin, "the write's seal panicked")))
        };
        // SAFETY: item `i`'s iovecs point into memory this plan pins as write sources: it
        // stays alive and nobody writes it while the pins last, which is past this item.
        let sealed = unsafe {
            scratch.seal(self.iov(i), fill, |iov, scratch| {
                self.begin(i, roots)
                    .and_then(|op| io::run(root, op, iov, scratch, path))
                    .map_err(|f| self.error(f))
            })
        };
        sealed.and_then(|r| r)
    }

    /// Runs items `items` together, in step: each runs its system calls until it needs its
    /// bytes moved, then the transfers of all of them go to `path` in one
    /// [`DataPath::transfer_batch`] call, and so on until every item has ended.
    pub(crate) fn run_together(
        &self,
        items: std::ops::Range<usize>,
        roots: &[Root],
        scratch: &mut io::Scratch,
        path: &dyn DataPath,
    ) {
        let mut running: Vec<(usize, Running)> = Vec::with_capacity(items.len());
        for i in items {
            if !self.prepared[i] {
                continue;
            }
            if self.is_cancelled() {
                self.set(i, Err(self.cancelled()));
                continue;
            }
            match self.begin(i, roots) {
                Ok(op) => running.push((i, Running::new(op))),
                Err(f) => self.set(i, Err(self.error(f))),
            }
        }
        while !running.is_empty() {
            // Every item runs until it waits for a transfer or ends.
            running.retain_mut(|(i, r)| {
                let root = &roots[self.routes[*i].0];
                match r.drive(root, self.iov(*i), scratch, Some(path)) {
                    Progress::Transfer => true,
                    Progress::Done(result) => {
                        let result = self.checked(*i, result.map_err(|f| self.error(f)));
                        self.set(*i, result);
                        false
                    }
                }
            });
            if running.is_empty() {
                break;
            }
            let moved: Vec<(&'static str, std::io::Result<u64>)> = {
                let mut asked = Vec::with_capacity(running.len());
                let batch: Vec<_> = running
                    .iter()
                    .filter_map(|(i, r)| {
                        let t = r.transfer(self.iov(*i));
                        asked.push(t.as_ref().map(|t| path.call(t.direction())));
                        t
                    })
                    .collect();
                let mut results = path.transfer_batch(&batch).into_iter();
                asked
                    .into_iter()
                    .map(|asked| match asked {
                        Some(call) => (
                            call,
                            results.next().unwrap_or_else(|| {
                                Err(std::io::Error::other(
                                    "the data path returned fewer results than transfers",
                                ))
                            }),
                        ),
                        // Stopped at a transfer without an open file: as a read(2) on no
                        // descriptor would say.
                        None => (
                            "transfer",
                            Err(std::io::Error::from_raw_os_error(libc::EBADF)),
                        ),
                    })
                    .collect()
            };
            for ((_, r), (call, result)) in running.iter_mut().zip(moved) {
                r.transferred(call, result);
            }
        }
    }

    /// Item `i`'s operation, begun on its root.
    fn begin(&self, i: usize, roots: &[Root]) -> Result<Op, IoFailure> {
        let (root, bucket) = self.routes[i];
        let expected = self.iov(i).iter().map(|v| v.iov_len as u64).sum();
        Op::new(
            &roots[root],
            self.kind,
            self.sync,
            bucket,
            self.name(i),
            expected,
        )
    }

    /// An error of an item of this plan, naming the operation and the path.
    pub(crate) fn error(&self, f: IoFailure) -> Error {
        to_error(self.plugin, f)
    }

    /// The result of an item that never started because its call was dropped.
    pub(crate) fn cancelled(&self) -> Error {
        Error::backend(self.plugin, "the call was dropped before this item started")
    }
}

/// A failed syscall as the core error of `plugin`, naming the operation and the path.
pub(crate) fn to_error(plugin: &'static str, f: IoFailure) -> Error {
    if crate::beneath::is_link_error(&f.error) {
        return Error::UnsafePath {
            component: plugin.into(),
            op: f.op,
            path: f.path,
        };
    }
    Error::io(plugin, f.op, Some(f.path), f.error)
}
