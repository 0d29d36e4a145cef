//! The end of a batch as both engines report it, and what a dropped batch future does.
//!
//! A batch future that is dropped (a timeout, `select!`) must not leave I/O running on
//! memory the caller may reuse: the drop marks the plan cancelled, so items not yet started
//! never start, and blocks until the items already in the kernel have ended. That wait is
//! bounded by the syscalls in flight (one per worker thread, or one chain per io_uring slot).

use std::sync::{Condvar, Mutex};

use tokio::sync::Notify;

use crate::plan::Plan;

/// Set once when every item of a plan has ended.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    state: Mutex<State>,
    ended: Condvar,
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    done: bool,
    /// Whether a dropped future blocks in `wait_blocking`: only then does `finish` notify the
    /// condvar (std's `notify_all` is a system call even with nobody waiting, once per call).
    blocked: bool,
}

impl Completion {
    pub(crate) fn finish(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.done = true;
        let blocked = state.blocked;
        drop(state);
        if blocked {
            self.ended.notify_all();
        }
        // One async waiter at most; notify_one keeps a permit if it is not polled yet.
        self.wake.notify_one();
    }

    fn is_done(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).done
    }

    fn wait_blocking(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Set under the lock `finish` takes, so its notify cannot come before this wait.
        state.blocked = true;
        while !state.done {
            state = self.ended.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits for the plan to end. If this future is dropped first, the plan is cancelled
    /// and the drop blocks until the items already started have ended.
    pub(crate) async fn wait(&self, plan: &Plan) {
        let guard = CancelOnDrop {
            completion: self,
            plan,
        };
        while !self.is_done() {
            self.wake.notified().await;
        }
        std::mem::forget(guard);
    }
}

struct CancelOnDrop<'a> {
    completion: &'a Completion,
    plan: &'a Plan,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        self.plan.cancel();
        self.completion.wait_blocking();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_blocked_wait_ends_at_finish_and_a_late_one_at_once() {
        let c = Arc::new(Completion::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn({
            let c = c.clone();
            move || {
                c.wait_blocking();
                tx.send(()).unwrap();
            }
        });
        // The waiter has said it blocks (under the lock `finish` takes) before `finish` runs.
        while !c.state.lock().unwrap().blocked {
            std::thread::yield_now();
        }
        c.finish();
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("finish did not wake the blocked waiter");
        waiter.join().unwrap();
        assert!(c.is_done());
        let done = Completion::default();
        done.finish();
        done.wait_blocking();
    }
}
