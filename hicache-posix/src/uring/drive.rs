//! The driver's loop: messages in, chains started while slots and queue room last, completions
//! reaped and handed to [`Driver::complete`], items finished.

use std::sync::mpsc::{Receiver, TryRecvError};

use crate::plan::Outcome;
use hicache_core::Result;

use super::{ActiveJob, Driver, Job, MAX_CHAIN, MAX_FIXED_BUFFER, Msg};

impl Driver {
    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Job(job) => self.accept(job),
            Msg::Register { region, addr, len } => {
                if len == 0 || len > MAX_FIXED_BUFFER {
                    return;
                }
                let Some(index) = self.free_buffers.pop() else {
                    return;
                };
                let iov = libc::iovec {
                    iov_base: addr as *mut libc::c_void,
                    iov_len: len as usize,
                };
                // SAFETY: the region stays valid until the backend deregisters it, and
                // deregistration waits for the Unregister below before releasing the memory.
                match unsafe {
                    self.ring
                        .submitter()
                        .register_buffers_update(index as u32, &[iov], None)
                } {
                    Ok(()) => {
                        self.buffers.insert(region, (index, addr, len));
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "region not registered as a fixed buffer");
                        self.free_buffers.push(index);
                    }
                }
            }
            Msg::Unregister { region, done } => {
                if let Some((index, _, _)) = self.buffers.remove(&region) {
                    let empty = libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    };
                    // SAFETY: an empty iovec clears the slot.
                    let _ = unsafe {
                        self.ring
                            .submitter()
                            .register_buffers_update(index as u32, &[empty], None)
                    };
                    self.free_buffers.push(index);
                }
                let _ = done.send(());
            }
        }
    }

    pub(super) fn run(mut self, rx: Receiver<Msg>) {
        let mut closed = false;
        loop {
            if self.inflight == 0 && self.queue.is_empty() {
                if closed {
                    return;
                }
                match rx.recv() {
                    Ok(msg) => self.handle(msg),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(msg) => self.handle(msg),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            self.fill();
            if self.inflight > 0 {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e)
                        if e.raw_os_error() == Some(libc::EINTR)
                            || e.raw_os_error() == Some(libc::EBUSY) => {}
                    Err(e) => tracing::error!(error = %e, "io_uring submit failed"),
                }
                self.reap();
            }
        }
    }

    fn accept(&mut self, job: Job) {
        let id = match self.jobs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.jobs.push(None);
                self.jobs.len() - 1
            }
        };
        let n = job.plan.len();
        let mut remaining = 0;
        for i in 0..n {
            if job.plan.prepared[i] {
                self.queue.push_back((id, i));
                remaining += 1;
            }
        }
        if remaining == 0 {
            job.plan.release();
            job.done.finish();
            return;
        }
        self.jobs[id] = Some(ActiveJob { job, remaining });
    }

    fn finish_item(&mut self, job: usize, item: usize, result: Result<Outcome>) {
        let Some(active) = self.jobs[job].as_mut() else {
            return;
        };
        active.job.plan.set(item, result);
        active.remaining -= 1;
        if active.remaining == 0
            && let Some(done) = self.jobs[job].take()
        {
            done.job.plan.release();
            done.job.done.finish();
        }
    }

    /// Starts queued items while slots and submission-queue room last.
    fn fill(&mut self) {
        while let (Some(&slot), Some(&(job, item))) = (self.free.last(), self.queue.front()) {
            let Some(plan) = self.jobs[job].as_ref().map(|j| j.job.plan.clone()) else {
                self.queue.pop_front();
                continue;
            };
            // Room for the longest chain: later phases go on the same slot without a check.
            let chain = MAX_CHAIN;
            // SAFETY: reading the queue's length only.
            let room = unsafe {
                self.ring.submission_shared().capacity() - self.ring.submission_shared().len()
            };
            if room < chain as usize {
                if self.ring.submit().is_err() {
                    break;
                }
                // SAFETY: as above.
                let room = unsafe {
                    self.ring.submission_shared().capacity() - self.ring.submission_shared().len()
                };
                if room < chain as usize {
                    break;
                }
            }
            self.queue.pop_front();
            if plan.is_cancelled() {
                self.finish_item(job, item, Err(plan.cancelled()));
                continue;
            }
            match self.start(slot, job, item, &plan) {
                Ok(()) => {
                    self.free.pop();
                    self.inflight += 1;
                }
                Err(e) => self.finish_item(job, item, Err(e)),
            }
        }
    }

    fn reap(&mut self) {
        // The list is kept between reaps, so reaping allocates nothing once it has grown.
        let mut completed = std::mem::take(&mut self.completed);
        completed.clear();
        completed.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(data, res) in &completed {
            let slot_id = (data >> 8) as usize;
            let step = (data & 0xff) as usize;
            let slot = &mut self.slots[slot_id];
            slot.res[step] = res;
            slot.pending -= 1;
            if slot.pending == 0 {
                let (job, item) = (slot.job, slot.item);
                let Some(plan) = self.jobs[job].as_ref().map(|j| j.job.plan.clone()) else {
                    self.release_slot(slot_id);
                    continue;
                };
                // None: the operation's next phase runs on the slot.
                if let Some(result) = self.complete(slot_id, &plan) {
                    self.release_slot(slot_id);
                    self.finish_item(job, item, result);
                }
            }
        }
        self.completed = completed;
    }

    fn release_slot(&mut self, slot_id: usize) {
        // An operation still in the slot (its job went) is given up.
        self.abandon(slot_id);
        self.free.push(slot_id);
        self.inflight -= 1;
    }

    /// Releases a fixed-file slot whose CLOSE did not run.
    pub(super) fn drop_fixed(&self, slot_id: usize) {
        let _ = self
            .ring
            .submitter()
            .register_files_update(slot_id as u32, &[-1]);
    }
}
