//! cuFile's batch API: requests submitted together and reaped by status, what the `GDS`
//! plugin drives (`GDS_MT` uses `cuFileRead`/`cuFileWrite` on its own threads instead).

use std::ffi::c_void;

use super::{CuFile, FileHandle, GdsError, sys};

/// The batch functions, resolved when the library has them.
#[derive(Clone, Copy)]
pub(super) struct BatchFns {
    pub(super) setup: sys::BatchSetUpFn,
    pub(super) submit: sys::BatchSubmitFn,
    pub(super) get_status: sys::BatchGetStatusFn,
    pub(super) destroy: sys::BatchDestroyFn,
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

/// One request of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Request<'r> {
    /// The registered file.
    pub file: &'r FileHandle<'r>,
    /// Which way.
    pub op: Op,
    /// The (registered) buffer.
    pub base: *mut c_void,
    /// Bytes.
    pub size: usize,
    /// Where in the file.
    pub file_offset: u64,
    /// Where in the buffer.
    pub buf_offset: u64,
}

/// A batch context of up to `capacity` requests in flight; destroyed on drop.
pub struct Batch<'a> {
    cufile: &'a CuFile,
    fns: BatchFns,
    raw: sys::CUfileBatchHandle,
    capacity: u32,
    /// Set when requests may be pending for good: the context is then never destroyed.
    abandoned: std::cell::Cell<bool>,
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl CuFile {
    /// A batch context for up to `capacity` requests at once (`cuFileBatchIOSetUp`); a
    /// library without the batch API is [`GdsError::MissingSymbol`].
    pub fn batch(&self, capacity: u32) -> Result<Batch<'_>, GdsError> {
        let fns = self.batch.ok_or_else(|| GdsError::MissingSymbol {
            path: self.path.clone(),
            symbol: "cuFileBatchIOSetUp",
        })?;
        let mut raw: sys::CUfileBatchHandle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer (cuFile API).
        let status = unsafe { (fns.setup)(&mut raw, capacity) };
        Self::check("cuFileBatchIOSetUp", status)?;
        Ok(Batch {
            cufile: self,
            fns,
            raw,
            capacity,
            abandoned: std::cell::Cell::new(false),
        })
    }
}

impl Batch<'_> {
    /// Submits `requests` and waits for every one of them: each request's bytes moved, or
    /// its error, in order. It returns only once every submitted request has ended, so no
    /// request touches its memory afterwards; it has no deadline of its own (cuFile ends
    /// each request, with a timeout status at worst). An error of the whole batch (more
    /// requests than the context holds, the submit refused) is the outer error.
    ///
    /// # Safety
    /// Each request's buffer range must be memory cuFile may use for its direction
    /// (writable for reads), used by nothing else until this returns. After
    /// [`GdsError::Abandoned`], the memory of every request may still be used by cuFile:
    /// the caller must never reuse or free it.
    pub unsafe fn run(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Vec<Result<usize, GdsError>>, GdsError> {
        let n = u32::try_from(requests.len())
            .ok()
            .filter(|&n| n <= self.capacity)
            .ok_or(GdsError::Call {
                call: "cuFileBatchIOSubmit",
                code: 5022,
                cu_err: 0,
            })?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut params = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            let (file_offset, _) = super::offsets("cuFileBatchIOSubmit", r.file_offset, 0)?;
            // The buffer offset travels in the address, `devPtr_offset` stays 0: cuFile
            // 1.15.1 (compat mode, host memory) ignored `devPtr_offset` in batch requests,
            // measured on the H200 — every request of a batch landed at the buffer's base.
            let start = usize::try_from(r.buf_offset).map_err(|_| GdsError::Os {
                call: "cuFileBatchIOSubmit",
                source: std::io::Error::from_raw_os_error(libc::EOVERFLOW),
            })?;
            params.push(sys::CUfileIOParams {
                mode: sys::BATCH_MODE,
                io: sys::CUfileBatchIo {
                    base: r.base.cast::<u8>().wrapping_add(start).cast(),
                    file_offset,
                    buf_offset: 0,
                    size: r.size,
                },
                fh: r.file.raw,
                opcode: match r.op {
                    Op::Read => sys::OPCODE_READ,
                    Op::Write => sys::OPCODE_WRITE,
                },
                // The request's index + 1, so no cookie is NULL.
                cookie: (i + 1) as *mut c_void,
            });
        }
        // SAFETY: `n` requests on live handles with the caller's memory; the array lives
        // through the call (cuFile copies it).
        let status = unsafe { (self.fns.submit)(self.raw, n, params.as_mut_ptr(), 0) };
        CuFile::check("cuFileBatchIOSubmit", status)?;
        let mut results: Vec<Option<Result<usize, GdsError>>> =
            (0..requests.len()).map(|_| None).collect();
        let mut left = requests.len();
        let mut events = vec![
            sys::CUfileIOEvents {
                cookie: std::ptr::null_mut(),
                status: 0,
                ret: 0,
            };
            requests.len()
        ];
        while left > 0 {
            // Woken at least once a second; the loop ends when every request has.
            let mut timeout = libc::timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            let mut got = left as u32;
            // SAFETY: an event array of at least `got` entries and a timespec for the call.
            let status = unsafe {
                (self.fns.get_status)(self.raw, 1, &mut got, events.as_mut_ptr(), &mut timeout)
            };
            if let Err(e) = CuFile::check("cuFileBatchIOGetStatus", status) {
                // Requests may still be in flight and their end cannot be learnt: the
                // context is kept (never destroyed under them) and the caller told.
                self.abandoned.set(true);
                return Err(GdsError::Abandoned {
                    pending: left,
                    source: Box::new(e),
                });
            }
            for event in &events[..(got as usize).min(events.len())] {
                let Some(slot) = (event.cookie as usize)
                    .checked_sub(1)
                    .and_then(|i| results.get_mut(i))
                    .filter(|slot| slot.is_none())
                else {
                    continue; // not ours, or reported twice: ignored, never trusted
                };
                *slot = Some(outcome(event));
                left -= 1;
            }
        }
        Ok(results.into_iter().flatten().collect())
    }
}

/// One event as a request's result.
fn outcome(event: &sys::CUfileIOEvents) -> Result<usize, GdsError> {
    let ret = event.ret as isize;
    match event.status {
        sys::STATUS_COMPLETE if ret >= 0 => Ok(ret as usize),
        // A negative amount: an errno, or a cuFile error past 5000.
        _ if ret < 0 => {
            let code = i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX);
            Err(if code > 5000 {
                GdsError::Call {
                    call: "cuFileBatchIOGetStatus",
                    code,
                    cu_err: 0,
                }
            } else {
                GdsError::Os {
                    call: "cuFileBatchIOGetStatus",
                    source: std::io::Error::from_raw_os_error(code),
                }
            })
        }
        status => Err(GdsError::BatchStatus {
            status: status_name(status),
            ret,
        }),
    }
}

/// The name of a `CUfileStatus_t`.
pub fn status_name(status: i32) -> &'static str {
    match status {
        sys::STATUS_WAITING => "CUFILE_WAITING",
        sys::STATUS_PENDING => "CUFILE_PENDING",
        sys::STATUS_INVALID => "CUFILE_INVALID",
        sys::STATUS_CANCELED => "CUFILE_CANCELED",
        sys::STATUS_COMPLETE => "CUFILE_COMPLETE",
        sys::STATUS_TIMEOUT => "CUFILE_TIMEOUT",
        sys::STATUS_FAILED => "CUFILE_FAILED",
        _ => "an unknown status",
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let _ = self.cufile;
        if self.abandoned.get() {
            return;
        }
        // SAFETY: a context cuFileBatchIOSetUp returned, destroyed once; `run` returns
        // only when none of its requests is pending, or marks it abandoned.
        unsafe { (self.fns.destroy)(self.raw) };
    }
}
