//! A batch turned into plain data an engine thread can run: object names in one arena,
//! iovecs in one array, routes, and one result slot per item.

use std::sync::Mutex;

use hicache_core::{Error, MemoryRegion, ReadOutcome, Result};

use crate::NAME;
use crate::io::{self, IoFailure, Root};

/// The operation a plan performs on every item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Write,
    Read,
    Exists,
    Remove,
}

/// The successful outcome of one item.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done,
    Read(ReadOutcome),
    Exists(bool),
}

/// One batch, owned, so engine threads can run it after the caller's borrow ends.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) kind: OpKind,
    pub(crate) sync: bool,
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
    /// Keeps owned memory alive while I/O may still run (a dropped future does not cancel
    /// I/O already handed to an engine).
    _keepalive: Vec<MemoryRegion>,
}

// SAFETY: the iovecs point into registered memory whose validity until deregistration is the
// registrant's contract (and whose owners `_keepalive` holds); nothing else in Plan is
// thread-bound.
unsafe impl Send for Plan {}
// SAFETY: as above; result slots are mutexes, written by the one thread running an item.
unsafe impl Sync for Plan {}

impl Plan {
    pub(crate) fn new(kind: OpKind, sync: bool, items: usize) -> Self {
        Plan {
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
            _keepalive: Vec::new(),
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

    pub(crate) fn keep_alive(&mut self, region: MemoryRegion) {
        self._keepalive.push(region);
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

    /// Runs item `i` with blocking syscalls and stores its result.
    pub(crate) fn run_item(&self, i: usize, roots: &[Root]) {
        if !self.prepared[i] {
            return;
        }
        let (root, bucket) = self.routes[i];
        let root = &roots[root];
        let name = self.name(i);
        let result = match self.kind {
            OpKind::Write => {
                io::write_object(root, bucket, name, self.iov(i), self.sync).map(|()| Outcome::Done)
            }
            OpKind::Read => io::read_object(root, bucket, name, self.iov(i)).map(Outcome::Read),
            OpKind::Exists => io::object_exists(root, bucket, name).map(Outcome::Exists),
            OpKind::Remove => io::remove_object(root, bucket, name).map(|()| Outcome::Done),
        };
        self.set(i, result.map_err(to_error));
    }
}

/// A failed syscall as the core error, naming the operation and the path.
pub(crate) fn to_error(f: IoFailure) -> Error {
    Error::io(NAME, f.op, Some(f.path), f.error)
}
