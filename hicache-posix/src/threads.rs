//! The portable engine: a fixed pool of threads running blocking `preadv`/`pwritev` (or
//! handing the bytes to a [`DataPath`]).
//!
//! A batch is offered to up to `threads` workers at once; each takes the next unclaimed item
//! until none is left, so one slow item never holds up the others, and the batch completes
//! when the last worker leaves it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

use crate::data_path::DataPath;
use crate::flight::Completion;
use crate::io::Scratch;
use crate::plan::Plan;
use crate::root::Root;

struct Batch {
    plan: Arc<Plan>,
    /// Items a worker takes at once (see [`together`]).
    chunk: usize,
    next: AtomicUsize,
    workers_left: AtomicUsize,
    done: Completion,
}

impl Batch {
    /// Takes items until none is left: one at a time, or with a batching data path as many
    /// as it takes in one call, run together.
    fn work(&self, roots: &[Root], scratch: &mut Scratch, path: Option<&dyn DataPath>) {
        let together = self.chunk;
        loop {
            let start = self.next.fetch_add(together, Ordering::Relaxed);
            if start >= self.plan.len() {
                break;
            }
            let items = start..(start + together).min(self.plan.len());
            match path {
                Some(path) if together > 1 => self.plan.run_together(items, roots, scratch, path),
                _ => {
                    for i in items {
                        self.plan.run_item(i, roots, scratch, path);
                    }
                }
            }
        }
        self.leave(1);
    }

    /// `n` workers are done with the batch (or will never take it).
    fn leave(&self, n: usize) {
        if self.workers_left.fetch_sub(n, Ordering::AcqRel) == n {
            self.plan.release();
            self.done.finish();
        }
    }
}

/// Items a worker takes at once from a plan of `items`: one, or with a batching data path
/// (`limit` > 1) as many as the path moves in one call, so a call's objects meet in as few
/// batches as the path allows. Spreading a call over every worker instead (16 batches of 2
/// for a call of 32) was slower on the H200 in cuFile's compat mode, whose batches move
/// about one request at a time: GDS wrote 0.17 GB/s spread over 16 workers against 0.25
/// GB/s with whole calls as batches (512 pages of 1 MiB, 2 calls of 32 in flight), and more
/// requests in flight helped most (0.49–0.73 GB/s with 4 calls of 128).
fn together(limit: usize, items: usize) -> usize {
    limit.max(1).min(items).max(1)
}

/// What the data path moves in one call (1 without a path).
fn batch_limit(path: Option<&dyn DataPath>) -> usize {
    path.map_or(1, |p| p.batch_limit())
}

/// The next batch for a worker, or `None` once the engine is gone. A worker that finds the
/// channel empty yields up to [`SPIN_YIELDS`] times before it sleeps: the next call of a
/// caller with calls in flight usually arrives within microseconds, and a sleeping worker
/// costs the sender a futex wake and itself a context switch.
fn next_batch<T>(rx: &crossbeam_channel::Receiver<T>) -> Option<T> {
    for _ in 0..SPIN_YIELDS {
        match rx.try_recv() {
            Ok(b) => return Some(b),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
}

/// Times an idle worker yields before it sleeps.
const SPIN_YIELDS: usize = 64;

/// A pool of I/O threads fed by one multi-consumer channel.
pub(crate) struct ThreadEngine {
    /// `None` once the engine is dropping: the workers see the channel close and exit.
    tx: Option<Sender<Arc<Batch>>>,
    workers: Vec<JoinHandle<()>>,
    /// What moves objects' bytes (None: `preadv`/`pwritev`).
    path: Option<Arc<dyn DataPath>>,
}

impl std::fmt::Debug for ThreadEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadEngine")
            .field("threads", &self.workers.len())
            .finish()
    }
}

impl ThreadEngine {
    /// `align`: the largest direct-I/O alignment of the roots (it sizes each worker's read
    /// guard).
    /// `path`: what moves objects' bytes, if not the workers' own `preadv`/`pwritev`.
    pub(crate) fn new(
        threads: usize,
        roots: Arc<[Root]>,
        align: u64,
        path: Option<Arc<dyn DataPath>>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded::<Arc<Batch>>();
        let workers = (0..threads.max(1))
            .map(|n| {
                let (rx, roots, path) = (rx.clone(), roots.clone(), path.clone());
                let mut scratch = Scratch::new(align)?;
                std::thread::Builder::new()
                    .name(format!("hicache-io-{n}"))
                    .spawn(move || {
                        // Ends when the engine drops its sender.
                        while let Some(batch) = next_batch(&rx) {
                            batch.work(&roots, &mut scratch, path.as_deref());
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ThreadEngine {
            tx: Some(tx),
            workers,
            path,
        })
    }

    /// The data path, if one is plugged in.
    pub(crate) fn path(&self) -> Option<&dyn DataPath> {
        self.path.as_deref()
    }

    pub(crate) fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Runs every item of `plan`; completes when all are done. Dropping the future skips
    /// the items not started and waits for those running (see [`crate::flight`]).
    pub(crate) async fn run(&self, plan: Arc<Plan>) {
        if plan.len() == 0 {
            return;
        }
        let chunk = together(batch_limit(self.path()), plan.len());
        let fanout = plan.len().div_ceil(chunk).min(self.workers.len());
        let batch = Arc::new(Batch {
            plan,
            chunk,
            next: AtomicUsize::new(0),
            workers_left: AtomicUsize::new(fanout),
            done: Completion::default(),
        });
        let mut sent = 0;
        if let Some(tx) = &self.tx {
            while sent < fanout && tx.send(batch.clone()).is_ok() {
                sent += 1;
            }
        }
        if sent < fanout {
            // The workers are gone (engine shutting down): never wait for them.
            batch.leave(fanout - sent);
        }
        batch.done.wait(&batch.plan).await;
    }
}

impl Drop for ThreadEngine {
    fn drop(&mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{next_batch, together};

    #[test]
    fn a_call_moves_in_as_few_batches_as_the_path_allows() {
        assert_eq!(together(1, 20), 1, "no batching path: one item at a time");
        assert_eq!(together(8, 20), 8, "the path's limit");
        assert_eq!(together(128, 32), 32, "a whole call of 32 in one batch");
        assert_eq!(together(128, 3), 3);
        assert_eq!(together(0, 0), 1);
    }

    #[test]
    fn an_idle_worker_takes_what_is_queued_waits_for_what_comes_and_ends_with_the_engine() {
        let (tx, rx) = crossbeam_channel::unbounded();
        tx.send(1).unwrap();
        assert_eq!(next_batch(&rx), Some(1), "queued: taken at once");
        // Sent long after the worker stopped yielding: it must still wake for it.
        let late = std::thread::spawn({
            let tx = tx.clone();
            move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                tx.send(2).unwrap();
            }
        });
        assert_eq!(next_batch(&rx), Some(2), "asleep: woken by the send");
        late.join().unwrap();
        tx.send(3).unwrap();
        drop(tx);
        assert_eq!(
            next_batch(&rx),
            Some(3),
            "what was queued before the end still runs"
        );
        assert_eq!(next_batch(&rx), None, "the engine is gone: the worker ends");
    }
}
