//! The plugin side: a Rust [`StorageBackend`](hicache_core::raw::StorageBackend) and its
//! [`PluginDescriptor`] exported through the C ABI by [`export_plugin!`](crate::export_plugin).
//!
//! Each instance runs its backend on a runtime of its own (two worker threads): the host
//! may have no async runtime, or another copy of one. Every entry catches panics and turns
//! them into `HICACHE_ERR_PANIC`, so none unwinds into the host.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};

use hicache_core::raw::{
    DynBackend, ListCursor, MemKind, MemoryRegion, ObjectKey, PluginContext, PluginDescriptor,
    ReadItem, RegionId, Slice, WriteItem, params_for,
};
use hicache_core::{ConfigLoader, Error, MissReason, ReadOutcome, Verdict};

use crate::abi::{
    self, hicache_batch, hicache_complete_fn, hicache_config, hicache_error, hicache_info,
    hicache_param_spec, hicache_plugin_table_v1, hicache_probe, hicache_result, hicache_usage,
    write_text,
};
use crate::host::bounded_c_str;

/// The table of one exported plugin, built on first use.
#[doc(hidden)]
pub struct Table(OnceLock<Option<Exported>>);

struct Exported {
    table: hicache_plugin_table_v1,
    _strings: Vec<CString>,
    _params: Vec<hicache_param_spec>,
}

// SAFETY: the table points into strings and arrays owned next to it and never changed.
unsafe impl Send for Exported {}
// SAFETY: as above.
unsafe impl Sync for Exported {}

/// The two entries that need the descriptor, written by the macro for it.
#[doc(hidden)]
pub type ProbeFn = unsafe extern "C" fn(*const hicache_config, *mut hicache_probe) -> i32;
#[doc(hidden)]
pub type OpenFn =
    unsafe extern "C" fn(*const hicache_config, *mut *mut c_void, *mut hicache_error) -> i32;

impl Table {
    #[doc(hidden)]
    pub const fn new() -> Self {
        Table(OnceLock::new())
    }

    /// The table, or null when the descriptor cannot be expressed in C (a NUL in a name).
    #[doc(hidden)]
    pub fn get(
        &self,
        d: &'static PluginDescriptor,
        version: &'static str,
        probe: ProbeFn,
        open: OpenFn,
    ) -> *const hicache_plugin_table_v1 {
        let exported = self.0.get_or_init(|| {
            catch_unwind(AssertUnwindSafe(|| export(d, version, probe, open)))
                .ok()
                .flatten()
        });
        match exported {
            Some(e) => &e.table,
            None => std::ptr::null(),
        }
    }
}

impl Default for Table {
    fn default() -> Self {
        Self::new()
    }
}

fn export(
    d: &'static PluginDescriptor,
    version: &'static str,
    probe: ProbeFn,
    open: OpenFn,
) -> Option<Exported> {
    let mut strings = Vec::new();
    let mut keep = |s: &str| -> Option<*const c_char> {
        let c = CString::new(s).ok()?;
        let p = c.as_ptr();
        strings.push(c);
        Some(p)
    };
    let name = keep(d.name)?;
    let version = keep(version)?;
    let summary = keep(d.summary)?;
    let mut params = Vec::with_capacity(d.params.len());
    for p in d.params {
        use hicache_core::raw::ParamKind;
        params.push(hicache_param_spec {
            name: keep(p.name)?,
            r#type: match p.kind {
                ParamKind::Bool => abi::PARAM_BOOL,
                ParamKind::UInt => abi::PARAM_UINT,
                ParamKind::Float => abi::PARAM_FLOAT,
                // A choice travels as text; the plugin checks it again when it reads it.
                _ => abi::PARAM_STR,
            },
            secret: p.secret.into(),
            doc: keep(p.doc)?,
            default_value: match p.default {
                Some(v) => keep(v)?,
                None => std::ptr::null(),
            },
        });
    }
    let table = hicache_plugin_table_v1 {
        abi_version: abi::ABI_VERSION,
        struct_size: size_of::<hicache_plugin_table_v1>() as u32,
        name,
        version,
        summary,
        kind: match d.kind {
            hicache_core::raw::BackendKind::File => abi::KIND_FILE,
            hicache_core::raw::BackendKind::Object => abi::KIND_OBJECT,
        },
        priority: d.priority,
        params: params.as_ptr(),
        n_params: params.len() as u32,
        reserved: 0,
        probe: Some(probe),
        open: Some(open),
        close: Some(close),
        info: Some(info),
        register_memory: Some(register_memory),
        deregister_memory: Some(deregister_memory),
        submit: Some(submit),
        usage: Some(usage),
        list: Some(list),
    };
    Some(Exported {
        table,
        _strings: strings,
        _params: params,
    })
}

/// Runs `f`, turning a panic into `ERR_PANIC` with the panic's message in `err`.
fn guarded(err: *mut hicache_error, f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => abi::OK,
        Ok(Err(e)) => {
            set_error(err, &e.to_string());
            status_of(&e)
        }
        Err(panic) => {
            set_error(err, &format!("panicked: {}", panic_text(&panic)));
            abi::ERR_PANIC
        }
    }
}

fn set_error(err: *mut hicache_error, message: &str) {
    // SAFETY: a non-null error buffer is the host's, alive during the call (ABI).
    if let Some(err) = unsafe { err.as_mut() } {
        write_text(&mut err.message, message);
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The ABI status of a backend error.
fn status_of(e: &Error) -> i32 {
    match e {
        Error::Unavailable { .. } => abi::ERR_UNAVAILABLE,
        Error::Timeout { .. } => abi::ERR_TIMEOUT,
        Error::Unsupported { .. } => abi::ERR_UNSUPPORTED,
        Error::InvalidBatch { .. }
        | Error::InvalidKey { .. }
        | Error::UnregisteredRegion { .. }
        | Error::SliceOutOfRange { .. }
        | Error::Misaligned { .. }
        | Error::MemoryBusy { .. } => abi::ERR_INVALID,
        _ => abi::ERR_IO,
    }
}

/// A text the host passed, or an error naming `what`.
///
/// # Safety
/// `p` must be null or a NUL-terminated string alive during the call.
unsafe fn host_text(p: *const c_char, what: &str) -> Result<String, Error> {
    if p.is_null() {
        return Err(Error::InvalidBatch {
            reason: format!("{what} is NULL"),
        });
    }
    // SAFETY: the caller's contract; at most 64 KiB are read.
    let bytes = unsafe { bounded_c_str(p, 1 << 16) };
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::InvalidBatch {
        reason: format!("{what} is not UTF-8"),
    })
}

/// The host's config as this plugin's [`PluginContext`] inputs.
///
/// # Safety
/// `c` must point to a config valid during the call (ABI).
unsafe fn config(
    d: &'static PluginDescriptor,
    c: *const hicache_config,
) -> Result<(hicache_core::Config, hicache_core::raw::PluginParams), Error> {
    // SAFETY: the caller's contract.
    let c = unsafe { c.as_ref() }.ok_or_else(|| Error::InvalidBatch {
        reason: "the config is NULL".into(),
    })?;
    let mut dirs = Vec::new();
    for i in 0..c.n_storage_dirs as usize {
        // SAFETY: `n_storage_dirs` entries, each a string (ABI).
        dirs.push(unsafe { host_text(*c.storage_dirs.add(i), "a storage dir") }?);
    }
    let mut loader = ConfigLoader::new().set("use_direct_io", c.use_direct_io != 0);
    if !dirs.is_empty() {
        loader = loader.set("storage_dir", dirs);
    }
    for i in 0..c.n_params as usize {
        // SAFETY: `n_params` entries (ABI).
        let p = unsafe { &*c.params.add(i) };
        // SAFETY: strings of the host, alive during the call.
        let name = unsafe { host_text(p.name, "a parameter name") }?;
        // SAFETY: as above.
        let value = unsafe { host_text(p.value, "a parameter value") }?;
        loader = loader.set(format!("plugin.{}.{name}", d.name), value);
    }
    let config = loader.load()?;
    let params = params_for(d, &config)?;
    Ok((config, params))
}

/// The `probe` entry for descriptor `d`.
///
/// # Safety
/// As `hicache_plugin_table_v1.probe` (ABI).
#[doc(hidden)]
pub unsafe fn probe(
    d: &'static PluginDescriptor,
    c: *const hicache_config,
    out: *mut hicache_probe,
) -> i32 {
    // SAFETY: the host's buffer, alive during the call (ABI).
    let Some(out) = (unsafe { out.as_mut() }) else {
        return abi::ERR_INVALID;
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let (config, params) = unsafe { config(d, c) }?;
        let probe = d.probe(&PluginContext::new(&config, &params));
        Ok::<_, Error>(probe.verdict().clone())
    }));
    match result {
        Ok(Ok(Verdict::Usable { detail })) => {
            write_text(&mut out.detail, &detail);
            abi::OK
        }
        Ok(Ok(Verdict::Unusable { reason, hint })) => {
            write_text(&mut out.detail, &reason);
            write_text(&mut out.hint, hint.as_deref().unwrap_or(""));
            1
        }
        Ok(Err(e)) => {
            write_text(&mut out.detail, &e.to_string());
            1
        }
        Err(panic) => {
            write_text(
                &mut out.detail,
                &format!("the probe panicked: {}", panic_text(&panic)),
            );
            abi::ERR_PANIC
        }
    }
}

/// One open instance.
struct Instance {
    backend: DynBackend,
    runtime: tokio::runtime::Runtime,
    /// Host region id → this backend's id.
    regions: Mutex<HashMap<u64, RegionId>>,
}

/// The `open` entry for descriptor `d`.
///
/// # Safety
/// As `hicache_plugin_table_v1.open` (ABI).
#[doc(hidden)]
pub unsafe fn open(
    d: &'static PluginDescriptor,
    c: *const hicache_config,
    instance: *mut *mut c_void,
    err: *mut hicache_error,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract.
        let (config, params) = unsafe { config(d, c) }?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("{}-plugin", d.name))
            .enable_all()
            .build()
            .map_err(|e| {
                Error::backend(d.name, format!("cannot start the plugin's runtime: {e}"))
            })?;
        let backend = {
            let _entered = runtime.enter();
            d.build(&PluginContext::new(&config, &params))?
        };
        let boxed = Box::new(Instance {
            backend,
            runtime,
            regions: Mutex::new(HashMap::new()),
        });
        // SAFETY: the host's out pointer, alive during the call (ABI).
        let out = unsafe { instance.as_mut() }.ok_or_else(|| Error::InvalidBatch {
            reason: "the instance out pointer is NULL".into(),
        })?;
        *out = Box::into_raw(boxed).cast();
        Ok(())
    })
}

/// # Safety
/// `p` must be an instance from `open`, not closed.
unsafe fn instance<'a>(p: *mut c_void) -> Result<&'a Instance, Error> {
    // SAFETY: the caller's contract.
    unsafe { p.cast::<Instance>().as_ref() }.ok_or_else(|| Error::InvalidBatch {
        reason: "the instance is NULL".into(),
    })
}

unsafe extern "C" fn close(p: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if p.is_null() {
            return;
        }
        // SAFETY: from `open`'s Box::into_raw; the host closes once, with nothing in flight.
        let Instance {
            backend, runtime, ..
        } = *unsafe { Box::from_raw(p.cast::<Instance>()) };
        {
            let _entered = runtime.enter();
            drop(backend);
        }
        runtime.shutdown_background();
    }));
}

unsafe extern "C" fn info(p: *mut c_void, out: *mut hicache_info, err: *mut hicache_error) -> i32 {
    guarded(err, || {
        // SAFETY: the host's instance and buffer (ABI).
        let (inst, out) = unsafe { (instance(p)?, out.as_mut()) };
        let out = out.ok_or_else(|| Error::InvalidBatch {
            reason: "the info buffer is NULL".into(),
        })?;
        let info = inst.backend.info();
        let c = info.capability;
        out.capability = abi::hicache_capability {
            io_alignment: c.io_alignment,
            max_object_size: c.max_object_size.unwrap_or(0),
            max_segments: c.max_segments,
            direct_io: c.direct_io.into(),
            gpu_direct: c.gpu_direct.into(),
            host_memory: c.host_memory.into(),
            device_memory: c.device_memory.into(),
            atomic_publish: c.atomic_publish.into(),
            persistent: c.persistent.into(),
            reserved: [0; 6],
        };
        write_text(&mut out.location, &info.location);
        Ok(())
    })
}

unsafe extern "C" fn register_memory(
    p: *mut c_void,
    region: u64,
    addr: *mut c_void,
    len: u64,
    mem_kind: u32,
    device: u32,
    err: *mut hicache_error,
) -> i32 {
    guarded(err, || {
        // SAFETY: the host's instance (ABI).
        let inst = unsafe { instance(p) }?;
        let kind = match mem_kind {
            abi::MEM_HOST => MemKind::Host,
            abi::MEM_DEVICE => MemKind::Device { device },
            other => {
                return Err(Error::InvalidBatch {
                    reason: format!("unknown memory kind {other}"),
                });
            }
        };
        if addr.is_null() {
            return Err(Error::InvalidBatch {
                reason: "the region's address is NULL".into(),
            });
        }
        let mut regions = inst.regions.lock().unwrap_or_else(|e| e.into_inner());
        if regions.contains_key(&region) {
            return Err(Error::InvalidBatch {
                reason: format!("region {region} is already registered"),
            });
        }
        // SAFETY: the host keeps `addr..addr+len` alive until it deregisters the region, and
        // hands it to this plugin only for batches it has pinned (shared for writes,
        // exclusive for reads), so this region is the only access to those bytes while a
        // batch uses them (ABI).
        let r = unsafe { MemoryRegion::from_raw(addr.cast(), len, kind) };
        let id = inst.backend.register(r)?;
        regions.insert(region, id);
        Ok(())
    })
}

unsafe extern "C" fn deregister_memory(
    p: *mut c_void,
    region: u64,
    err: *mut hicache_error,
) -> i32 {
    guarded(err, || {
        // SAFETY: the host's instance (ABI).
        let inst = unsafe { instance(p) }?;
        let mut regions = inst.regions.lock().unwrap_or_else(|e| e.into_inner());
        let id = regions
            .get(&region)
            .copied()
            .ok_or_else(|| Error::InvalidBatch {
                reason: format!("region {region} is not registered"),
            })?;
        inst.backend.deregister(id)?;
        regions.remove(&region);
        Ok(())
    })
}

unsafe extern "C" fn usage(
    p: *mut c_void,
    out: *mut hicache_usage,
    err: *mut hicache_error,
) -> i32 {
    guarded(err, || {
        // SAFETY: the host's instance and buffer (ABI).
        let (inst, out) = unsafe { (instance(p)?, out.as_mut()) };
        let out = out.ok_or_else(|| Error::InvalidBatch {
            reason: "the usage buffer is NULL".into(),
        })?;
        let backend = inst.backend.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // On the instance's runtime, waited for here: the host may call from inside its
        // own runtime, where blocking on a future of ours is not allowed.
        inst.runtime.spawn(async move {
            let _ = tx.send(CatchUnwind(Box::pin(backend.usage())).await);
        });
        let u = match rx.recv() {
            Ok(Ok(answer)) => answer?,
            // Re-raised here, where `guarded` turns it into HICACHE_ERR_PANIC.
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => return Err(Error::backend("plugin", "usage ended without an answer")),
        };
        out.total_bytes = u.total_bytes.unwrap_or(abi::UNKNOWN);
        out.used_bytes = u.used_bytes.unwrap_or(abi::UNKNOWN);
        out.available_bytes = u.available_bytes.unwrap_or(abi::UNKNOWN);
        Ok(())
    })
}

unsafe extern "C" fn list(
    p: *mut c_void,
    prefix: *const c_char,
    cursor: *const c_char,
    limit: u32,
    page: abi::hicache_page_fn,
    sink: *mut c_void,
    err: *mut hicache_error,
) -> i32 {
    guarded(err, || {
        // SAFETY: the host's instance and strings (ABI); NULL means none for both strings.
        let (inst, prefix, cursor) = unsafe {
            (
                instance(p)?,
                match prefix.is_null() {
                    true => String::new(),
                    false => host_text(prefix, "the prefix")?,
                },
                match cursor.is_null() {
                    true => None,
                    false => Some(ListCursor(host_text(cursor, "the cursor")?)),
                },
            )
        };
        let backend = inst.backend.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // On the instance's runtime, waited for here, as `usage` is.
        inst.runtime.spawn(async move {
            let listing = async move {
                backend
                    .list(&prefix, cursor.as_ref(), limit.max(1) as usize)
                    .await
            };
            let _ = tx.send(CatchUnwind(Box::pin(listing)).await);
        });
        let listed = match rx.recv() {
            Ok(Ok(answer)) => answer?,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => return Err(Error::backend("plugin", "list ended without an answer")),
        };
        let next = listed
            .next
            .map(|c| CString::new(c.0))
            .transpose()
            .map_err(|_| Error::backend("plugin", "its listing cursor holds a NUL byte"))?;
        let objects: Vec<abi::hicache_listed> = listed
            .objects
            .iter()
            .map(|o| abi::hicache_listed {
                key: o.key.as_str().as_ptr().cast(),
                key_len: o.key.as_str().len() as u32,
                reserved: 0,
                size: o.size,
                modified_ns: o
                    .modified
                    .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                    .and_then(|d| i64::try_from(d.as_nanos()).ok())
                    .unwrap_or(abi::NO_TIME),
            })
            .collect();
        // SAFETY: the host's page function and sink (ABI); the keys, the array and the
        // cursor live until it returns.
        unsafe {
            page(
                sink,
                objects.as_ptr(),
                objects.len() as u32,
                next.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        Ok(())
    })
}

/// One item, copied out of the host's batch.
struct Item {
    index: u32,
    key: ObjectKey,
    segments: Vec<Slice>,
}

/// A result ready for the host.
struct Answer {
    index: u32,
    status: i32,
    value: u64,
    message: Option<CString>,
}

impl Answer {
    fn ok(index: u32, value: u64) -> Self {
        Answer {
            index,
            status: abi::OK,
            value,
            message: None,
        }
    }

    fn error(index: u32, e: &Error) -> Self {
        Answer {
            index,
            status: status_of(e),
            value: match e {
                Error::Timeout { millis, .. } => *millis,
                _ => 0,
            },
            message: CString::new(e.to_string().replace('\0', " ")).ok(),
        }
    }
}

unsafe extern "C" fn submit(
    p: *mut c_void,
    batch: *const hicache_batch,
    done: hicache_complete_fn,
    token: *mut c_void,
    err: *mut hicache_error,
) -> i32 {
    guarded(err, || {
        // SAFETY: the host's instance and batch, the batch alive until `done` (ABI).
        let (inst, batch) = unsafe { (instance(p)?, batch.as_ref()) };
        let batch = batch.ok_or_else(|| Error::InvalidBatch {
            reason: "the batch is NULL".into(),
        })?;
        let op = batch.op;
        if !matches!(
            op,
            abi::OP_WRITE | abi::OP_READ | abi::OP_EXISTS | abi::OP_REMOVE
        ) {
            return Err(Error::InvalidBatch {
                reason: format!("unknown operation {op}"),
            });
        }
        let mut items = Vec::with_capacity(batch.n_items as usize);
        let mut answers = Vec::new();
        {
            let regions = inst.regions.lock().unwrap_or_else(|e| e.into_inner());
            for index in 0..batch.n_items {
                // SAFETY: `n_items` items (ABI).
                let item = unsafe { &*batch.items.add(index as usize) };
                // SAFETY: the item's key and segments, alive until `done` (ABI).
                match unsafe { copy_item(index, item, &regions) } {
                    Ok(i) => items.push(i),
                    Err(e) => answers.push(Answer::error(index, &e)),
                }
            }
        }
        let backend = inst.backend.clone();
        let token = token as usize;
        inst.runtime.spawn(async move {
            let outcome = CatchUnwind(Box::pin(run(backend, op, &items))).await;
            match outcome {
                Ok(more) => answers.extend(more),
                Err(panic) => {
                    let e = Error::backend("plugin", format!("panicked: {}", panic_text(&panic)));
                    answers.extend(items.iter().map(|i| Answer {
                        status: abi::ERR_PANIC,
                        ..Answer::error(i.index, &e)
                    }));
                }
            }
            let results: Vec<hicache_result> = answers
                .iter()
                .map(|a| hicache_result {
                    index: a.index,
                    status: a.status,
                    value: a.value,
                    message: a.message.as_ref().map_or(std::ptr::null(), |m| m.as_ptr()),
                })
                .collect();
            // SAFETY: the host's completion with its token; the results and their
            // messages live across the call (ABI).
            unsafe { done(token as *mut c_void, results.as_ptr(), results.len() as u32) };
        });
        Ok(())
    })
}

/// # Safety
/// `item`'s key and segments must be valid (ABI).
unsafe fn copy_item(
    index: u32,
    item: &abi::hicache_item,
    regions: &HashMap<u64, RegionId>,
) -> Result<Item, Error> {
    if item.key.is_null() {
        return Err(Error::InvalidBatch {
            reason: "a key is NULL".into(),
        });
    }
    // SAFETY: `key_len` bytes of key (ABI).
    let bytes = unsafe { std::slice::from_raw_parts(item.key.cast::<u8>(), item.key_len as usize) };
    let name = std::str::from_utf8(bytes).map_err(|_| Error::InvalidBatch {
        reason: "a key is not UTF-8".into(),
    })?;
    let key = ObjectKey::new(name)?;
    let mut segments = Vec::with_capacity(item.n_segments as usize);
    for s in 0..item.n_segments as usize {
        // SAFETY: `n_segments` segments (ABI).
        let seg = unsafe { &*item.segments.add(s) };
        let region = regions
            .get(&seg.region)
            .ok_or_else(|| Error::InvalidBatch {
                reason: format!("region {} is not registered with the plugin", seg.region),
            })?;
        segments.push(Slice::new(*region, seg.offset, seg.len));
    }
    Ok(Item {
        index,
        key,
        segments,
    })
}

async fn run(backend: DynBackend, op: u32, items: &[Item]) -> Vec<Answer> {
    match op {
        abi::OP_WRITE => {
            let batch: Vec<WriteItem<'_>> = items
                .iter()
                .map(|i| WriteItem {
                    key: &i.key,
                    segments: &i.segments,
                })
                .collect();
            let results = backend.write(&batch).await;
            answers(items, results, |()| Answer::ok)
        }
        abi::OP_READ => {
            let batch: Vec<ReadItem<'_>> = items
                .iter()
                .map(|i| ReadItem {
                    key: &i.key,
                    segments: &i.segments,
                })
                .collect();
            let results = backend.read(&batch).await;
            answers(items, results, |outcome| {
                move |index, _| match outcome {
                    ReadOutcome::Hit => Answer::ok(index, 0),
                    ReadOutcome::Miss(MissReason::SizeMismatch { found, .. }) => Answer {
                        status: abi::MISS_SIZE,
                        ..Answer::ok(index, found)
                    },
                    ReadOutcome::Miss(other) => Answer {
                        status: abi::MISS_NOT_FOUND,
                        message: CString::new(other.to_string()).ok(),
                        ..Answer::ok(index, 0)
                    },
                }
            })
        }
        abi::OP_EXISTS => {
            let keys: Vec<ObjectKey> = items.iter().map(|i| i.key.clone()).collect();
            let results = backend.exists(&keys).await;
            answers(items, results, |found| {
                move |index, _| Answer::ok(index, u64::from(found))
            })
        }
        _ => {
            let keys: Vec<ObjectKey> = items.iter().map(|i| i.key.clone()).collect();
            let results = backend.remove(&keys).await;
            answers(items, results, |()| Answer::ok)
        }
    }
}

/// One answer per item; a backend that returned another count fails the missing items.
fn answers<T, F: FnOnce(u32, u64) -> Answer>(
    items: &[Item],
    results: Vec<Result<T, Error>>,
    ok: impl Fn(T) -> F,
) -> Vec<Answer> {
    let mut results = results.into_iter();
    items
        .iter()
        .map(|i| match results.next() {
            Some(Ok(v)) => ok(v)(i.index, 0),
            Some(Err(e)) => Answer::error(i.index, &e),
            None => Answer::error(
                i.index,
                &Error::backend("plugin", "the backend gave fewer results than items"),
            ),
        })
        .collect()
}

/// A future whose panic is caught and returned, so a completion is always sent.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// Exports a Rust plugin through the C ABI: makes this `cdylib` crate's
/// `hicache_plugin_v1` symbol return the table of the `static` [`PluginDescriptor`] named.
///
/// ```
/// use hicache_core::Result;
/// use hicache_core::raw::{BackendKind, DynBackend, PluginContext, PluginDescriptor, Probe};
///
/// fn probe(_: &PluginContext<'_>) -> Probe {
///     Probe::unusable("no ACME device here", "install one")
/// }
/// fn build(_: &PluginContext<'_>) -> Result<DynBackend> {
///     Err(hicache_core::Error::backend("ACME", "no device"))
/// }
/// pub static DESCRIPTOR: PluginDescriptor =
///     PluginDescriptor::new("ACME", BackendKind::File, "ACME's storage", probe, build)
///         .with_priority(50);
///
/// hicache_abi::export_plugin!(DESCRIPTOR);
///
/// // What the host reads first from the library.
/// // SAFETY: the entry returns a table that lives as long as the library.
/// let table = unsafe { &*hicache_plugin_v1() };
/// assert_eq!(table.abi_version, hicache_abi::abi::ABI_VERSION);
/// assert_eq!(table.priority, 50);
/// ```
///
/// The crate needs `crate-type = ["cdylib"]`; the plugin's version is the crate's.
#[macro_export]
macro_rules! export_plugin {
    ($descriptor:path) => {
        /// The hicache plugin ABI's entry (hicache_plugin.h).
        #[unsafe(no_mangle)]
        pub extern "C" fn hicache_plugin_v1() -> *const $crate::abi::hicache_plugin_table_v1 {
            static TABLE: $crate::__guest::Table = $crate::__guest::Table::new();
            unsafe extern "C" fn probe(
                config: *const $crate::abi::hicache_config,
                out: *mut $crate::abi::hicache_probe,
            ) -> i32 {
                // SAFETY: the host calls with the ABI's arguments.
                unsafe { $crate::__guest::probe(&$descriptor, config, out) }
            }
            unsafe extern "C" fn open(
                config: *const $crate::abi::hicache_config,
                instance: *mut *mut ::std::ffi::c_void,
                err: *mut $crate::abi::hicache_error,
            ) -> i32 {
                // SAFETY: the host calls with the ABI's arguments.
                unsafe { $crate::__guest::open(&$descriptor, config, instance, err) }
            }
            TABLE.get(&$descriptor, env!("CARGO_PKG_VERSION"), probe, open)
        }
    };
}
