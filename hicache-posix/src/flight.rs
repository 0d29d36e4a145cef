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
    done: Mutex<bool>,
    ended: Condvar,
    wake: Notify,
}

impl Completion {
    pub(crate) fn finish(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.ended.notify_all();
        // One async waiter at most; notify_one keeps a permit if it is not polled yet.
        self.wake.notify_one();
    }

    fn is_done(&self) -> bool {
        *self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_blocking(&self) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = self.ended.wait(done).unwrap_or_else(|e| e.into_inner());
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
