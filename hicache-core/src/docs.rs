//! Design notes that travel with the code.

/// # How very different engines map onto [`StorageBackend`](crate::StorageBackend)
///
/// The trait is batch-in, results-out: one `async fn` call per batch, one `Result` per item,
/// memory named by slices of registrations. Each engine keeps its own submission model
/// behind that call:
///
/// - **io_uring (POSIX)**: `register` adds the region to the ring's fixed buffers when it
///   fits (`IORING_REGISTER_BUFFERS`), otherwise keeps it for plain vectored ops. `write` /
///   `read` turn the whole batch into SQEs (open, `WRITE_FIXED`/`READV`, …), submit them in
///   one `io_uring_enter`, and complete the future when every CQE of the batch is reaped by
///   the ring's completion thread. Short transfers are resubmitted for the remainder, never
///   counted as success.
/// - **object_store (OBJ)**: each item becomes one `put_opts` (conditional create) or ranged
///   `get`, run concurrently up to the request limit with `buffer_unordered`; each HTTP
///   outcome maps to that item's result (404 → miss, 5xx after retries → error).
/// - **cuFile (GDS / GDS_MT)**: `register` calls `cuFileBufRegister` for device memory (and
///   accepts host memory for the compat path). `write`/`read` use `cuFileBatchIOSubmit` with
///   one `CUfileIOParams_t` per segment and `cuFileBatchIOGetStatus` for completion (GDS),
///   or a worker pool issuing `cuFileRead`/`cuFileWrite` (GDS_MT).
/// - **3FS usrbio**: `register` creates an `hf3fs_iov` over shared memory (`hf3fs_iovcreate`)
///   for the region; a batch becomes `hf3fs_prep_io` per segment on an `hf3fs_ior`, one
///   `hf3fs_submit_ios`, and `hf3fs_wait_for_ios` until all results arrive; each result's byte
///   count is checked against the request.
/// - **C-ABI plugins**: the versioned `#[repr(C)]` table exposes `submit(batch) -> handle`
///   and `poll(handle, results*) -> pending|done`; the Rust adapter submits the batch and
///   completes the future from a poll loop driven by a completion notification or timer, and
///   copies per-item status codes into `Result`s.
///
/// Why batches and slices: one missing page must not fail 127 others (SGLang NIXL's
/// all-or-nothing status), and "unregistered memory" must be a typed error before I/O, not
/// NIXL's anonymous "no specified or potential backend had the required registrations".
pub mod backend_design {}

/// # Transfer modes and the envelope
///
/// `HiCache::register_pool` decides once per pool:
/// - **zero-copy** when every span of a page is aligned (base and length) to the backend's
///   direct-I/O alignment — the real one the backend reports (statx `DIOALIGN`), not a fixed
///   4096 — and the page has few enough spans for one vectored object. `layer_first` pools
///   qualify too when aligned (SGLang always bounces them); under SGLang naming they bounce to
///   keep SGLang's flat-page objects.
/// - **bounce** otherwise: pages are gathered into aligned staging slots (padded to the
///   alignment, so every I/O is aligned — SGLang packs slots at page size and misaligns them).
///   Staging chunks are leased per batch chunk, so concurrent callers never share a slot, and
///   batches larger than a chunk are split instead of failed.
/// - **anchor** for pools without bytes: one small marker object per page.
///
/// Objects carry an envelope (header, payload at an aligned offset, xxh3 checksum) unless
/// `page_format = "raw"`; the connector writes and verifies it, so every plugin — file or
/// object — gets torn/corrupt/foreign detection without writing it again. An invalid object
/// reads as a miss with a reason and is counted in [`Stats`](crate::Stats).
pub mod transfer_modes {}
