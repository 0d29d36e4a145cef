//! A loaded plugin's instance as a [`StorageBackend`]: every contract check happens here,
//! on the host side, before and after the plugin runs.
//!
//! A batch's memory is pinned here before it is handed to the plugin, and the pins, the
//! batch's C arrays and the instance are kept in a process-wide in-flight table until the
//! plugin completes the batch. The ABI has no way to call a batch back, so a caller that
//! drops its future waits, in the drop, for the completion: once the drop has returned, no
//! byte of its memory changes and none of it is pinned (the contract every backend keeps).
//! The completion is looked up by token, so a completion for an unknown or already
//! completed batch is ignored, never a use after free.

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hicache_core::raw::{
    BackendInfo, ListCursor, ListPage, MemKind, MemoryRegion, ObjectKey, ReadItem, RegionId,
    RegionTable, Slice, SourceSlice, StorageBackend, TargetSlice, Usage, WriteItem,
};
use hicache_core::{Error, MissReason, ReadOutcome, Result};
use tokio::sync::oneshot;

use super::load::bounded_c_str;
use super::plugin::CPlugin;
use crate::abi::{
    self, hicache_batch, hicache_error, hicache_item, hicache_result, hicache_segment,
    hicache_usage,
};

/// The longest result message read from a plugin.
const MESSAGE_LIMIT: usize = 4096;

/// One open instance of a plugin; closed when the last batch and the backend are gone.
pub(crate) struct Instance {
    pub(crate) plugin: CPlugin,
    pub(crate) ptr: *mut c_void,
}

// SAFETY: the ABI makes every function of an instance callable from any thread, also
// concurrently; the pointer is only handed back to the plugin.
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(close) = self.plugin.table.close {
            // SAFETY: the last reference is gone, so no batch is in flight and no other
            // call runs on the instance (ABI: close is called once, with nothing in flight).
            unsafe { close(self.ptr) };
        }
    }
}

/// A loaded plugin's backend.
pub(crate) struct LoadedBackend {
    pub(crate) plugin: CPlugin,
    pub(crate) instance: Arc<Instance>,
    pub(crate) regions: RegionTable,
    pub(crate) info: BackendInfo,
}

impl fmt::Debug for LoadedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedBackend")
            .field("plugin", &self.plugin.name)
            .field("path", &self.plugin.path)
            .finish()
    }
}

/// A result as the plugin gave it, checked for its index only.
#[derive(Debug)]
struct RawResult {
    status: i32,
    value: u64,
    message: Option<String>,
}

/// What the memory of a batch is pinned by.
enum Pin {
    // Held only to keep the memory pinned; never read.
    Source(#[allow(dead_code)] SourceSlice),
    Target(#[allow(dead_code)] TargetSlice),
}

impl Pin {
    fn addr(&self) -> usize {
        match self {
            Pin::Source(s) => s.addr(),
            Pin::Target(t) => t.addr(),
        }
    }
}

/// A submitted batch: everything the plugin may still touch, until it completes.
struct InFlight {
    _pins: Vec<Pin>,
    _keys: Vec<u8>,
    _segments: Vec<hicache_segment>,
    _items: Vec<hicache_item>,
    _batch: Box<hicache_batch>,
    n_items: usize,
    plugin: CPlugin,
    instance: Arc<Instance>,
    done: oneshot::Sender<Vec<Result<RawResult>>>,
    finished: Arc<Finished>,
}

/// Set once a batch's completion has released its memory.
#[derive(Default)]
struct Finished {
    yes: Mutex<bool>,
    changed: Condvar,
}

impl Finished {
    fn set(&self) {
        *self.yes.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Blocks until set, saying so now and then (a plugin that never completes a batch
    /// hangs the caller that gave it up: its memory could still be written).
    fn wait(&self, plugin: &str) {
        let mut yes = self.yes.lock().unwrap_or_else(|e| e.into_inner());
        let mut waited = 0u64;
        while !*yes {
            let (next, timeout) = self
                .changed
                .wait_timeout(yes, Duration::from_secs(10))
                .unwrap_or_else(|e| e.into_inner());
            yes = next;
            if timeout.timed_out() && !*yes {
                waited += 10;
                tracing::warn!(
                    plugin,
                    seconds = waited,
                    "a dropped call still waits for the plugin to complete its batch"
                );
            }
        }
    }
}

/// Waits in its drop for a batch that was handed over but not answered.
struct WaitOnDrop<'a> {
    finished: Option<Arc<Finished>>,
    plugin: &'a str,
}

impl Drop for WaitOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.finished.take() {
            f.wait(self.plugin);
        }
    }
}

// SAFETY: the raw pointers in the C arrays point into buffers this record owns; they are
// only read by the plugin, and moving the record does not move those buffers.
unsafe impl Send for InFlight {}

static IN_FLIGHT: Mutex<Option<HashMap<u64, InFlight>>> = Mutex::new(None);
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn in_flight<T>(f: impl FnOnce(&mut HashMap<u64, InFlight>) -> T) -> T {
    let mut guard = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// The completion function handed to every plugin.
unsafe extern "C" fn complete(token: *mut c_void, results: *const hicache_result, n: u32) {
    // A panic must not unwind into the plugin's C frames.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `results` holds `n` entries for the duration of this call (ABI).
        unsafe { complete_batch(token as u64, results, n) }
    });
}

/// # Safety
/// `results` must be null or point to `n` results readable during the call.
unsafe fn complete_batch(token: u64, results: *const hicache_result, n: u32) {
    let Some(batch) = in_flight(|t| t.remove(&token)) else {
        tracing::error!(
            token,
            "a plugin completed a batch that is not in flight (completed twice, or never submitted); ignored"
        );
        return;
    };
    let plugin = batch.plugin;
    let expected = batch.n_items;
    let mut out: Vec<Option<Result<RawResult>>> = (0..expected).map(|_| None).collect();
    if results.is_null() && n > 0 {
        fill(&mut out, || {
            plugin.contract("completed a batch with a NULL result array")
        });
    } else if n as usize != expected {
        fill(&mut out, || {
            plugin.contract(format!(
                "completed a batch of {expected} items with {n} results"
            ))
        });
    } else if n > 0 {
        // SAFETY: non-null, `n` entries (caller).
        let results = unsafe { std::slice::from_raw_parts(results, n as usize) };
        for r in results {
            let i = r.index as usize;
            let Some(slot) = out.get_mut(i) else {
                tracing::error!(
                    plugin = plugin.name,
                    index = r.index,
                    "result for an item outside the batch"
                );
                continue;
            };
            if slot.is_some() {
                *slot = Some(Err(plugin.contract(format!("gave item {i} two results"))));
                continue;
            }
            let message = (!r.message.is_null()).then(|| {
                // SAFETY: a non-null message is NUL-terminated text alive during this call
                // (ABI); at most MESSAGE_LIMIT bytes are read.
                let bytes = unsafe { bounded_c_str(r.message, MESSAGE_LIMIT) };
                String::from_utf8_lossy(bytes).into_owned()
            });
            *slot = Some(Ok(RawResult {
                status: r.status,
                value: r.value,
                message,
            }));
        }
        if let Some(bad) = results.iter().find(|r| r.index as usize >= expected) {
            let detail = format!(
                "gave a result for item {} of a batch of {expected}",
                bad.index
            );
            for slot in out.iter_mut().filter(|s| s.is_none()) {
                *slot = Some(Err(plugin.contract(detail.clone())));
            }
        }
    }
    let results = out
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| Err(plugin.contract(format!("gave no result for item {i}"))))
        })
        .collect();
    let InFlight {
        _pins,
        _keys,
        _segments,
        _items,
        _batch,
        done,
        instance,
        finished,
        ..
    } = batch;
    // The plugin is done with the memory: unpin it before the caller hears of the results,
    // so its next call may reuse the pages at once. A caller that has gone (its future
    // dropped) finds its memory released here.
    drop((_pins, _keys, _segments, _items, _batch));
    finished.set();
    let _ = done.send(results);
    if Arc::strong_count(&instance) == 1 {
        // The last user of the instance: close it, but not from inside the plugin's own
        // completion call (ABI).
        std::thread::spawn(move || drop(instance));
    }
}

fn fill(out: &mut [Option<Result<RawResult>>], error: impl Fn() -> Error) {
    for slot in out {
        *slot = Some(Err(error()));
    }
}

/// One item of a batch, before it is handed over.
struct Prepared<'a> {
    key: &'a ObjectKey,
    segments: &'a [Slice],
}

impl LoadedBackend {
    fn error(&self, op: &'static str, r: &RawResult) -> Error {
        let name = self.plugin.name;
        let message = r
            .message
            .clone()
            .unwrap_or_else(|| format!("{op} failed (status {}) without a message", r.status));
        match r.status {
            abi::ERR_UNAVAILABLE => Error::Unavailable {
                component: name.into(),
                message,
                source: None,
            },
            abi::ERR_TIMEOUT => Error::Timeout {
                component: name.into(),
                op,
                millis: r.value,
            },
            abi::ERR_UNSUPPORTED => Error::Unsupported {
                component: name.into(),
                operation: message,
            },
            abi::ERR_INVALID => Error::InvalidBatch {
                reason: format!("{name}: {message}"),
            },
            abi::ERR_PANIC => Error::backend(name, format!("the plugin panicked: {message}")),
            abi::ERR_IO => Error::backend(name, message),
            other => self
                .plugin
                .contract(format!("answered {op} with unknown status {other}")),
        }
    }

    /// Pins, hands over and awaits one batch. Items whose memory or shape is wrong get
    /// their error here and never reach the plugin.
    async fn submit(&self, op: u32, items: &[Prepared<'_>]) -> Vec<Result<RawResult>> {
        let mut results: Vec<Option<Result<RawResult>>> = (0..items.len()).map(|_| None).collect();
        let cap = &self.info.capability;
        let align = if cap.direct_io { cap.io_alignment } else { 1 };
        let mut pins: Vec<Pin> = Vec::new();
        // (index in the caller's batch, first pin, pin count)
        let mut sent: Vec<(usize, usize, usize)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let first = pins.len();
            let pinned = cap
                .check_segments(item.key, item.segments.len())
                .and_then(|()| {
                    let total: u64 = item.segments.iter().map(|s| s.len).sum();
                    if let Some(max) = cap.max_object_size
                        && total > max
                    {
                        return Err(Error::Unsupported {
                            component: self.plugin.name.into(),
                            operation: format!("objects of {total} bytes (at most {max})"),
                        });
                    }
                    for s in item.segments {
                        pins.push(match op {
                            abi::OP_WRITE => {
                                Pin::Source(self.regions.source_aligned(s, align, "segment")?)
                            }
                            _ => Pin::Target(self.regions.target_aligned(s, align, "segment")?),
                        });
                    }
                    Ok(())
                });
            match pinned {
                Ok(()) => sent.push((i, first, item.segments.len())),
                Err(e) => {
                    pins.truncate(first);
                    results[i] = Some(Err(e));
                }
            }
        }
        if !sent.is_empty() {
            // Built and handed over without an await in between: the C arrays hold raw
            // pointers, and the future must stay `Send`.
            let answered = match self.hand_over(op, items, &sent, pins) {
                Started::Refused(results) => results,
                Started::Waiting(rx, finished) => {
                    let mut guard = WaitOnDrop {
                        finished: Some(finished),
                        plugin: self.plugin.name,
                    };
                    let answered = rx.await;
                    guard.finished = None;
                    match answered {
                        Ok(results) => results,
                        Err(_) => (0..sent.len())
                            .map(|_| {
                                Err(self.plugin.contract("the batch ended without a completion"))
                            })
                            .collect(),
                    }
                }
            };
            for (slot, r) in sent.iter().zip(answered) {
                results[slot.0] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(self.plugin.contract("an item got no result"))))
            .collect()
    }

    fn hand_over(
        &self,
        op: u32,
        items: &[Prepared<'_>],
        sent: &[(usize, usize, usize)],
        pins: Vec<Pin>,
    ) -> Started {
        // Keys, each NUL-terminated, in one buffer built before any pointer into it.
        let mut keys: Vec<u8> = Vec::new();
        let mut key_at = Vec::with_capacity(sent.len());
        for &(i, _, _) in sent {
            key_at.push(keys.len());
            keys.extend_from_slice(items[i].key.as_str().as_bytes());
            keys.push(0);
        }
        let mut segments: Vec<hicache_segment> = Vec::with_capacity(pins.len());
        for &(i, first, n) in sent {
            for (s, pin) in items[i].segments.iter().zip(&pins[first..first + n]) {
                segments.push(hicache_segment {
                    addr: pin.addr() as *mut c_void,
                    len: s.len,
                    region: s.region.0,
                    offset: s.offset,
                });
            }
        }
        let mut c_items: Vec<hicache_item> = Vec::with_capacity(sent.len());
        let mut at = 0;
        for (&(i, _, n), &k) in sent.iter().zip(&key_at) {
            c_items.push(hicache_item {
                key: keys[k..].as_ptr().cast(),
                key_len: items[i].key.as_str().len() as u32,
                n_segments: n as u32,
                segments: if n == 0 {
                    std::ptr::null()
                } else {
                    segments[at..].as_ptr()
                },
            });
            at += n;
        }
        let batch = Box::new(hicache_batch {
            op,
            n_items: c_items.len() as u32,
            items: c_items.as_ptr(),
        });
        let batch_ptr: *const hicache_batch = &*batch;
        let (tx, rx) = oneshot::channel();
        let finished = Arc::new(Finished::default());
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        in_flight(|t| {
            t.insert(
                token,
                InFlight {
                    _pins: pins,
                    _keys: keys,
                    _segments: segments,
                    _items: c_items,
                    _batch: batch,
                    n_items: sent.len(),
                    plugin: self.plugin,
                    instance: self.instance.clone(),
                    done: tx,
                    finished: finished.clone(),
                },
            )
        });
        let Some(submit) = self.plugin.table.submit else {
            return self.refused(token, sent.len(), "submit is NULL");
        };
        let mut err = hicache_error::empty();
        // SAFETY: the batch and everything it points to live in the in-flight record until
        // the completion removes it; the error buffer lives across the call (ABI).
        let status = unsafe {
            submit(
                self.instance.ptr,
                batch_ptr,
                complete,
                token as *mut c_void,
                &mut err,
            )
        };
        if status != abi::OK {
            let message = abi::text(&err.message);
            return self.refused(token, sent.len(), &message);
        }
        Started::Waiting(rx, finished)
    }

    /// `submit` refused the batch: every item fails with its reason. (A plugin that both
    /// completed and refused has had its completion taken; the refusal wins.)
    fn refused(&self, token: u64, n: usize, message: &str) -> Started {
        drop(in_flight(|t| t.remove(&token)));
        Started::Refused(
            (0..n)
                .map(|_| {
                    Err(Error::backend(
                        self.plugin.name,
                        format!(
                            "the plugin refused the batch: {}",
                            if message.is_empty() {
                                "no reason given"
                            } else {
                                message
                            }
                        ),
                    ))
                })
                .collect(),
        )
    }
}

impl LoadedBackend {
    /// The result of an item that only succeeds or fails (write, remove).
    fn done(&self, op: &'static str, r: RawResult) -> Result<()> {
        match r.status {
            abi::OK => Ok(()),
            s if s > 0 => Err(self
                .plugin
                .contract(format!("answered a {op} with status {s}"))),
            _ => Err(self.error(op, &r)),
        }
    }
}

/// A batch handed to the plugin, or refused by it.
enum Started {
    Refused(Vec<Result<RawResult>>),
    Waiting(oneshot::Receiver<Vec<Result<RawResult>>>, Arc<Finished>),
}

#[async_trait]
impl StorageBackend for LoadedBackend {
    fn info(&self) -> BackendInfo {
        self.info.clone()
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        let kind = region.kind();
        if !self.info.capability.accepts(kind) {
            return Err(Error::Unsupported {
                component: self.plugin.name.into(),
                operation: format!("registering {kind} memory"),
            });
        }
        let (mem_kind, device) = match kind {
            MemKind::Host => (abi::MEM_HOST, 0),
            MemKind::Device { device } => (abi::MEM_DEVICE, device),
            _ => {
                return Err(Error::Unsupported {
                    component: self.plugin.name.into(),
                    operation: format!("registering {kind} memory"),
                });
            }
        };
        let Some(register) = self.plugin.table.register_memory else {
            return Err(self.plugin.contract("register_memory is NULL"));
        };
        let (addr, len) = (region.addr(), region.len());
        let id = self.regions.insert(region);
        let mut err = hicache_error::empty();
        // SAFETY: the region is alive and registered here until deregistered; the plugin
        // touches it only for batches that name it, while they are pinned (ABI).
        let status = unsafe {
            register(
                self.instance.ptr,
                id.0,
                addr as *mut c_void,
                len,
                mem_kind,
                device,
                &mut err,
            )
        };
        if status != abi::OK {
            let _ = self.regions.remove(id);
            return Err(self.plugin.failed("register_memory", &err));
        }
        Ok(id)
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        // Refused while any batch still pins the region, so the plugin never loses memory
        // it may still write.
        self.regions.remove(id)?;
        let Some(deregister) = self.plugin.table.deregister_memory else {
            return Err(self.plugin.contract("deregister_memory is NULL"));
        };
        let mut err = hicache_error::empty();
        // SAFETY: a live instance and a host-owned error buffer (ABI).
        let status = unsafe { deregister(self.instance.ptr, id.0, &mut err) };
        if status != abi::OK {
            return Err(self.plugin.failed("deregister_memory", &err));
        }
        Ok(())
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        let items: Vec<Prepared<'_>> = batch
            .iter()
            .map(|w| Prepared {
                key: w.key,
                segments: w.segments,
            })
            .collect();
        self.submit(abi::OP_WRITE, &items)
            .await
            .into_iter()
            .map(|r| self.done("write", r?))
            .collect()
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        let items: Vec<Prepared<'_>> = batch
            .iter()
            .map(|r| Prepared {
                key: r.key,
                segments: r.segments,
            })
            .collect();
        self.submit(abi::OP_READ, &items)
            .await
            .into_iter()
            .zip(batch)
            .map(|(r, item)| match r? {
                RawResult {
                    status: abi::OK, ..
                } => Ok(ReadOutcome::Hit),
                RawResult {
                    status: abi::MISS_NOT_FOUND,
                    ..
                } => Ok(ReadOutcome::Miss(MissReason::NotFound)),
                RawResult {
                    status: abi::MISS_SIZE,
                    value,
                    ..
                } => Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                    expected: item.len(),
                    found: value,
                })),
                r => Err(self.error("read", &r)),
            })
            .collect()
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        let items: Vec<Prepared<'_>> = keys
            .iter()
            .map(|key| Prepared { key, segments: &[] })
            .collect();
        self.submit(abi::OP_EXISTS, &items)
            .await
            .into_iter()
            .map(|r| match r? {
                RawResult {
                    status: abi::OK,
                    value: v @ (0 | 1),
                    ..
                } => Ok(v == 1),
                RawResult {
                    status: abi::OK,
                    value,
                    ..
                } => Err(self.plugin.contract(format!(
                    "answered exists with value {value} (0 or 1 expected)"
                ))),
                r if r.status > 0 => Err(self
                    .plugin
                    .contract(format!("answered exists with status {}", r.status))),
                r => Err(self.error("exists", &r)),
            })
            .collect()
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        let items: Vec<Prepared<'_>> = keys
            .iter()
            .map(|key| Prepared { key, segments: &[] })
            .collect();
        self.submit(abi::OP_REMOVE, &items)
            .await
            .into_iter()
            .map(|r| self.done("remove", r?))
            .collect()
    }

    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        super::listing::list_page(&self.plugin, self.instance.ptr, prefix, cursor, limit)
    }

    async fn usage(&self) -> Result<Usage> {
        let Some(usage) = self.plugin.table.usage else {
            return Err(self.plugin.contract("usage is NULL"));
        };
        let mut out = hicache_usage {
            total_bytes: abi::UNKNOWN,
            used_bytes: abi::UNKNOWN,
            available_bytes: abi::UNKNOWN,
        };
        let mut err = hicache_error::empty();
        // SAFETY: a live instance and host-owned buffers (ABI).
        let status = unsafe { usage(self.instance.ptr, &mut out, &mut err) };
        if status != abi::OK {
            return Err(self.plugin.failed("usage", &err));
        }
        let known = |v: u64| (v != abi::UNKNOWN).then_some(v);
        Ok(Usage {
            total_bytes: known(out.total_bytes),
            used_bytes: known(out.used_bytes),
            available_bytes: known(out.available_bytes),
        })
    }
}
