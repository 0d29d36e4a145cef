//! `hicache._native`: the connector for Python callers (SGLang's storage threads above all).
//!
//! One `Connector` wraps a [`BlockingHiCache`]. Every call that does I/O lets go of the GIL
//! while it runs, so SGLang's three storage threads (prefetch, prefetch I/O, backup) move pages
//! at once. The host pool is the caller's own buffer (a pinned torch tensor, a numpy array):
//! the connector keeps a reference to it for as long as it is registered, so Python cannot
//! free it under a transfer.

#![deny(missing_docs)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hicache::{
    AnchorPool, AttentionKind, BlockingHiCache, BufferLayout, Dtype, EnvSnapshot, HiCache,
    HiCacheOptions, HitPolicy, HostPool, HostSlots, Layout, MemKind, MemoryRegion, PageKey,
    PoolGeometry, PoolId, PoolName, PoolQuery, PoolReport, PoolTransfer, ReadOutcome, RegionPool,
    SidecarGeometry, SidecarPool, Span, StorageIdentity,
};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(
    _native,
    HiCacheError,
    PyException,
    "An error of hicache: its message names what failed and how to fix it."
);

fn to_py(e: hicache::Error) -> PyErr {
    HiCacheError::new_err(e.to_string())
}

fn invalid(what: impl Into<String>) -> PyErr {
    HiCacheError::new_err(what.into())
}

/// The connector of one rank, as Python sees it.
#[pyclass(frozen, module = "hicache._native")]
struct Connector {
    /// Declared first, so it drops first: its pool is let go before the buffer below.
    cache: BlockingHiCache,
    pool: Mutex<Registered>,
    /// Set by `close`, under `pool`'s lock: every later call but `stats` fails (the `plugin`
    /// property still answers).
    closed: AtomicBool,
}

/// The registered pool, as this binding keeps it.
#[derive(Default)]
struct Registered {
    /// The Python object whose memory the pool is: held, never read, so it stays alive
    /// while registered.
    #[allow(dead_code)]
    owner: Option<Py<PyAny>>,
    geometry: Option<PoolGeometry>,
    /// Each registered sidecar's buffers, held like `owner`.
    #[allow(dead_code)]
    sidecars: HashMap<PoolName, Vec<Py<PyAny>>>,
}

/// A batch's answer to Python: per page whether it was done, and `(index, message)` for
/// each page that failed.
type Outcomes = (Vec<bool>, Vec<(usize, String)>);

/// A page's keys that are valid, with their positions in the call; the others get `error`.
struct Checked {
    keys: Vec<PageKey>,
    at: Vec<usize>,
    errors: Vec<(usize, String)>,
}

fn check_keys(keys: Vec<String>) -> Checked {
    let mut out = Checked {
        keys: Vec::with_capacity(keys.len()),
        at: Vec::with_capacity(keys.len()),
        errors: Vec::new(),
    };
    for (i, k) in keys.into_iter().enumerate() {
        match PageKey::new(k) {
            Ok(k) => {
                out.keys.push(k);
                out.at.push(i);
            }
            Err(e) => out.errors.push((i, e.to_string())),
        }
    }
    out
}

/// The keys before the first invalid one (an existence check ends there).
fn leading_valid(keys: Vec<String>) -> Vec<PageKey> {
    let mut checked = check_keys(keys);
    let leading = checked
        .at
        .iter()
        .enumerate()
        .take_while(|(j, i)| j == *i)
        .count();
    checked.keys.truncate(leading);
    checked.keys
}

/// Host token slots as Python gives them: a list of ints, or a 1-D C-contiguous int64 array
/// (numpy, or the `.numpy()` view of a CPU torch tensor), read in one copy instead of one
/// conversion per index. 8192 indices, release build: 19 µs as an array, 69 µs as a list
/// (plus 71 µs for the caller's `tolist()`).
struct Tokens(Vec<u64>);

impl<'a, 'py> FromPyObject<'a, 'py> for Tokens {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match int64_array(&obj)? {
            Some(tokens) => Ok(Tokens(tokens)),
            None => Ok(Tokens(obj.extract::<Vec<u64>>()?)),
        }
    }
}

/// The values of a 1-D C-contiguous little-endian int64 array (numpy's array interface), or
/// `None` for anything else (taken then as a sequence of ints). Negative values are refused.
fn int64_array(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u64>>> {
    let Ok(iface) = obj.getattr("__array_interface__") else {
        return Ok(None);
    };
    let typestr: String = iface.get_item("typestr")?.extract()?;
    let shape: Vec<usize> = iface.get_item("shape")?.extract()?;
    let strides = iface.get_item("strides")?;
    let contiguous = strides.is_none() || strides.extract::<Vec<isize>>()? == [8];
    if typestr != "<i8" || shape.len() != 1 || !contiguous {
        return Ok(None);
    }
    let (ptr, _readonly): (usize, bool) = iface.get_item("data")?.extract()?;
    let n = shape[0];
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    if ptr == 0 || !ptr.is_multiple_of(std::mem::align_of::<i64>()) {
        return Ok(None);
    }
    // SAFETY: the array interface says `ptr` holds `n` contiguous, aligned, little-endian
    // int64 values (checked above) in memory the array owns; `obj` keeps the array alive for
    // this borrow, and the GIL is held, so no Python code resizes or frees it while the
    // values are copied out.
    let values = unsafe { std::slice::from_raw_parts(ptr as *const i64, n) };
    values
        .iter()
        .map(|&v| {
            u64::try_from(v).map_err(|_| invalid(format!("host token index {v} is negative")))
        })
        .collect::<PyResult<Vec<u64>>>()
        .map(Some)
}

/// Where a Python buffer's bytes are: a torch tensor (`data_ptr`, `numel`, `element_size`)
/// or anything with the numpy array interface. It must be C-contiguous, writable host memory.
fn host_buffer(owner: &Bound<'_, PyAny>) -> PyResult<(usize, u64)> {
    if owner.hasattr("data_ptr")? {
        if owner.hasattr("is_contiguous")?
            && !owner.call_method0("is_contiguous")?.extract::<bool>()?
        {
            return Err(invalid(
                "the host pool's tensor is not contiguous; register the pool's own kv_buffer",
            ));
        }
        if owner.hasattr("device")? {
            let device: String = owner.getattr("device")?.getattr("type")?.extract()?;
            if device != "cpu" {
                return Err(invalid(format!(
                    "the host pool's tensor is on `{device}`; hicache's host pools are CPU memory"
                )));
            }
        }
        let ptr: usize = owner.call_method0("data_ptr")?.extract()?;
        let numel: u64 = owner.call_method0("numel")?.extract()?;
        let size: u64 = owner.call_method0("element_size")?.extract()?;
        let len = numel
            .checked_mul(size)
            .ok_or_else(|| invalid("the tensor's size overflows"))?;
        return Ok((ptr, len));
    }
    if owner.hasattr("__array_interface__")? {
        let iface = owner.getattr("__array_interface__")?;
        let (ptr, readonly): (usize, bool) = iface.get_item("data")?.extract()?;
        if readonly {
            return Err(invalid(
                "the host pool's array is read-only; reads must fill it",
            ));
        }
        if !iface.get_item("strides")?.is_none() {
            let contiguous: bool = owner
                .getattr("flags")?
                .get_item("C_CONTIGUOUS")?
                .extract()?;
            if !contiguous {
                return Err(invalid("the host pool's array is not C-contiguous"));
            }
        }
        let len: u64 = owner.getattr("nbytes")?.extract()?;
        return Ok((ptr, len));
    }
    Err(invalid(
        "the host pool's buffer must be a torch tensor (data_ptr/numel/element_size) or a numpy array",
    ))
}

#[allow(clippy::too_many_arguments)]
fn geometry(
    attention: &str,
    layers: u64,
    page_tokens: u64,
    dtype: &str,
    layout: &str,
    pages: u64,
    kv_heads: Option<u64>,
    head_dim: Option<u64>,
    kv_cache_dim: Option<u64>,
) -> PyResult<PoolGeometry> {
    let attention = match (attention, kv_heads, head_dim, kv_cache_dim) {
        ("mha", Some(kv_heads), Some(head_dim), None) => AttentionKind::Mha { kv_heads, head_dim },
        ("mla", None, None, Some(kv_cache_dim)) => AttentionKind::Mla { kv_cache_dim },
        ("mha", ..) => {
            return Err(invalid(
                "an `mha` pool takes kv_heads and head_dim (and no kv_cache_dim)",
            ));
        }
        ("mla", ..) => {
            return Err(invalid(
                "an `mla` pool takes kv_cache_dim (and no kv_heads or head_dim)",
            ));
        }
        (other, ..) => {
            return Err(invalid(format!(
                "attention `{other}` is not one of mha, mla"
            )));
        }
    };
    let dtype = Dtype::parse(dtype.strip_prefix("torch.").unwrap_or(dtype)).map_err(to_py)?;
    let layout = Layout::parse(layout).map_err(to_py)?;
    PoolGeometry::new(attention, layers, dtype, page_tokens, layout, pages).map_err(to_py)
}

fn report_dict<'py>(py: Python<'py>, report: &PoolReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("mode", report.mode.to_string())?;
    d.set_item("reason", &report.reason)?;
    d.set_item("page_bytes", report.page_bytes)?;
    d.set_item("spans_per_page", report.spans_per_page)?;
    d.set_item("objects_per_page", report.objects_per_page)?;
    d.set_item("stored_bytes_per_page", report.stored_bytes_per_page)?;
    d.set_item("io_alignment", report.io_alignment)?;
    d.set_item("namespace", &report.namespace)?;
    d.set_item("writer", report.writer)?;
    Ok(d)
}

impl Connector {
    /// Fails once `close` has run: a closed connector takes no pool and moves no page.
    fn check_open(&self) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(invalid(
                "the connector is closed; open a new Connector to go on",
            ));
        }
        Ok(())
    }

    fn register(
        &self,
        py: Python<'_>,
        pool: Arc<dyn HostPool>,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyDict>> {
        let geometry = *pool.geometry();
        // The lock is taken without the GIL: a thread holding the GIL never waits on it.
        let (report, old) = py.detach(|| {
            let mut held = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            // Checked under the lock `close` takes, so a pool never outlives a close.
            self.check_open()?;
            // The earlier pool is let go first: this returns once no transfer uses its
            // memory, so its buffer may then be released.
            let report = self
                .cache
                .unregister_pool()
                .and_then(|()| self.cache.register_pool(pool));
            // Unregistering let go of the sidecars too.
            let now = match report {
                Ok(_) => Registered {
                    owner,
                    geometry: Some(geometry),
                    sidecars: HashMap::new(),
                },
                Err(_) => Registered::default(),
            };
            Ok::<_, PyErr>((report, std::mem::replace(&mut *held, now)))
        })?;
        // The earlier buffer's reference is dropped here, with the GIL.
        drop(old);
        Ok(report_dict(py, &report.map_err(to_py)?)?.unbind())
    }

    /// Runs one batch of token slots: pages whose keys are invalid fail without I/O.
    fn transfer(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        tokens: Vec<u64>,
        write: bool,
    ) -> PyResult<Outcomes> {
        self.check_open()?;
        let n = keys.len();
        let per_page = tokens.len().checked_div(n).unwrap_or(0);
        if per_page * n != tokens.len() {
            return Err(invalid(format!(
                "{n} keys need the same number of host token indices each; got {}",
                tokens.len()
            )));
        }
        let Checked {
            keys,
            at,
            mut errors,
        } = check_keys(keys);
        let slots: Vec<u64> = at
            .iter()
            .flat_map(|&i| tokens[i * per_page..(i + 1) * per_page].iter().copied())
            .collect();
        let results: Vec<Result<bool, String>> = py
            .detach(|| -> hicache::Result<Vec<Result<bool, String>>> {
                let slots = HostSlots::Tokens(&slots);
                Ok(if write {
                    self.cache
                        .batch_set(&keys, slots)?
                        .into_iter()
                        .map(|r| r.map(|_| true).map_err(|e| e.to_string()))
                        .collect()
                } else {
                    self.cache
                        .batch_get(&keys, slots)?
                        .into_iter()
                        .map(|r| match r {
                            Ok(ReadOutcome::Hit) => Ok(true),
                            Ok(ReadOutcome::Miss(_)) => Ok(false),
                            Err(e) => Err(e.to_string()),
                        })
                        .collect()
                })
            })
            .map_err(to_py)?;
        let mut ok = vec![false; n];
        for (&i, r) in at.iter().zip(results) {
            match r {
                Ok(done) => ok[i] = done,
                Err(e) => errors.push((i, e)),
            }
        }
        errors.sort_by_key(|(i, _)| *i);
        Ok((ok, errors))
    }
}

/// One v2 transfer as Python gives it: pool name (`kv` for the KV pool), keys, and host
/// token slots (the pool's page size of them per key).
type PyTransfer = (String, Vec<String>, Tokens);

/// A v2 transfer with its keys checked: the valid keys, their positions, and the tokens of
/// those keys.
struct CheckedTransfer {
    pool: Option<PoolName>,
    keys: Checked,
    tokens: Vec<u64>,
    n: usize,
}

fn check_transfer((pool, keys, Tokens(tokens)): PyTransfer) -> PyResult<CheckedTransfer> {
    let pool = match pool.as_str() {
        PoolName::KV => None,
        name => Some(PoolName::new(name).map_err(to_py)?),
    };
    let n = keys.len();
    let per_page = tokens.len().checked_div(n).unwrap_or(0);
    if per_page * n != tokens.len() {
        return Err(invalid(format!(
            "pool {}: {n} keys need the same number of host token indices each; got {}",
            pool.as_ref().map_or(PoolName::KV, PoolName::as_str),
            tokens.len()
        )));
    }
    let keys = check_keys(keys);
    let tokens = keys
        .at
        .iter()
        .flat_map(|&i| tokens[i * per_page..(i + 1) * per_page].iter().copied())
        .collect();
    Ok(CheckedTransfer {
        pool,
        keys,
        tokens,
        n,
    })
}

impl CheckedTransfer {
    fn transfer(&self) -> PoolTransfer<'_> {
        PoolTransfer {
            pool: self.pool.as_ref().map_or(PoolId::Kv, PoolId::Sidecar),
            keys: &self.keys.keys,
            slots: HostSlots::Tokens(&self.tokens),
        }
    }

    /// Python's answer for this transfer from per-key results of its valid keys.
    fn outcomes(&self, results: Vec<Result<bool, String>>) -> Outcomes {
        let mut ok = vec![false; self.n];
        let mut errors = self.keys.errors.clone();
        for (&i, r) in self.keys.at.iter().zip(results) {
            match r {
                Ok(done) => ok[i] = done,
                Err(e) => errors.push((i, e)),
            }
        }
        errors.sort_by_key(|(i, _)| *i);
        (ok, errors)
    }
}

impl Connector {
    /// Runs one v2 call: pages whose keys are invalid fail without I/O.
    fn transfer_v2(
        &self,
        py: Python<'_>,
        transfers: Vec<PyTransfer>,
        write: bool,
    ) -> PyResult<Vec<Outcomes>> {
        self.check_open()?;
        let checked = transfers
            .into_iter()
            .map(check_transfer)
            .collect::<PyResult<Vec<_>>>()?;
        let calls: Vec<PoolTransfer<'_>> = checked.iter().map(CheckedTransfer::transfer).collect();
        let rows: Vec<Vec<Result<bool, String>>> = py
            .detach(|| -> hicache::Result<_> {
                Ok(if write {
                    self.cache
                        .batch_set_v2(&calls)?
                        .into_iter()
                        .map(|row| {
                            row.into_iter()
                                .map(|r| r.map(|_| true).map_err(|e| e.to_string()))
                                .collect()
                        })
                        .collect()
                } else {
                    self.cache
                        .batch_get_v2(&calls)?
                        .into_iter()
                        .map(|row| {
                            row.into_iter()
                                .map(|r| match r {
                                    Some(Ok(ReadOutcome::Hit)) => Ok(true),
                                    Some(Ok(ReadOutcome::Miss(_))) | None => Ok(false),
                                    Some(Err(e)) => Err(e.to_string()),
                                })
                                .collect()
                        })
                        .collect()
                })
            })
            .map_err(to_py)?;
        Ok(checked
            .iter()
            .zip(rows)
            .map(|(t, row)| t.outcomes(row))
            .collect())
    }
}

#[pymethods]
impl Connector {
    /// Opens the connector of one rank: `extra_config` is SGLang's extra config as JSON (or
    /// `@path` of a file), read with hicache's strict rules; the environment is read too.
    #[new]
    #[pyo3(signature = (extra_config, *, model = "", tp_rank = 0, tp_size = 1, pp_rank = 0, pp_size = 1, cp_rank = 0, cp_size = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        extra_config: &str,
        model: &str,
        tp_rank: u32,
        tp_size: u32,
        pp_rank: u32,
        pp_size: u32,
        cp_rank: u32,
        cp_size: u32,
    ) -> PyResult<Self> {
        let identity = StorageIdentity {
            model: model.to_string(),
            tp_rank,
            tp_size,
            pp_rank,
            pp_size,
            cp_rank,
            cp_size,
        };
        let extra = extra_config.to_string();
        let cache = py
            .detach(move || -> hicache::Result<BlockingHiCache> {
                let config = hicache::config()
                    .env(EnvSnapshot::from_process())
                    .extra_config(&extra)
                    .load()?;
                // The exporter (`metrics_listen`, `metrics_file`; each rank on its own port
                // and file) starts before the plugin, so the plugin's own metrics (its
                // cleaner's passes) reach it too.
                hicache::start_rank_metrics(&config, &identity)?;
                let registry = hicache::registry_for(&config)?;
                BlockingHiCache::new(HiCache::open(
                    &registry,
                    config,
                    HiCacheOptions::new(identity),
                )?)
            })
            .map_err(to_py)?;
        Ok(Connector {
            cache,
            pool: Mutex::new(Registered::default()),
            closed: AtomicBool::new(false),
        })
    }

    /// The plugin serving this connector.
    #[getter]
    fn plugin(&self) -> String {
        self.cache.inner().backend_info().name.to_string()
    }

    /// Registers a host pool with the given geometry over `buffer`'s memory (a C-contiguous
    /// CPU torch tensor or numpy array), or, with `buffer` None, a pool without bytes
    /// (SGLang's logical anchor pool, `kv_buffer is None`) whose pages are kept as small
    /// marker objects. Returns the pool report (transfer mode and why, page bytes,
    /// namespace, whether this rank writes). The connector keeps `buffer` alive until
    /// another pool is registered or it is closed.
    ///
    /// The caller must not write a page while a `batch_set` reads it, nor read or write one
    /// while a `batch_get` fills it (SGLang's controller holds such pages until the call
    /// returns). Nor may it move the buffer's memory while the pool is registered: holding
    /// the buffer keeps it alive, but a torch tensor's `resize_` or `set_` would still free
    /// or replace the bytes hicache moves (numpy refuses `resize` of a held array unless told
    /// `refcheck=False`).
    #[pyo3(signature = (buffer, *, attention, layers, page_tokens, dtype, layout, pages, kv_heads = None, head_dim = None, kv_cache_dim = None))]
    #[allow(clippy::too_many_arguments)]
    fn register_pool(
        &self,
        py: Python<'_>,
        buffer: Option<Bound<'_, PyAny>>,
        attention: &str,
        layers: u64,
        page_tokens: u64,
        dtype: &str,
        layout: &str,
        pages: u64,
        kv_heads: Option<u64>,
        head_dim: Option<u64>,
        kv_cache_dim: Option<u64>,
    ) -> PyResult<Py<PyDict>> {
        let geometry = geometry(
            attention,
            layers,
            page_tokens,
            dtype,
            layout,
            pages,
            kv_heads,
            head_dim,
            kv_cache_dim,
        )?;
        let Some(buffer) = buffer else {
            let pool = AnchorPool::new(geometry).map_err(to_py)?;
            return self.register(py, Arc::new(pool), None);
        };
        let (ptr, len) = host_buffer(&buffer)?;
        if ptr == 0 {
            return Err(invalid(
                "the host pool's buffer has no memory (null pointer)",
            ));
        }
        if len < geometry.pool_bytes() {
            return Err(invalid(format!(
                "the host pool's buffer holds {len} bytes; {pages} pages of this geometry need {}",
                geometry.pool_bytes()
            )));
        }
        // SAFETY: `buffer` is a live, contiguous CPU buffer of `len` bytes at `ptr` (checked
        // above), and this connector keeps a reference to it until the pool is let go (a new
        // registration or close, both of which end the transfers first). hicache reaches the
        // bytes only through the region's pins; the caller's writes are kept off pages in
        // flight by the rule stated on this method, as SGLang's controller keeps them.
        let region = unsafe { MemoryRegion::from_raw(ptr as *mut u8, len, MemKind::Host) };
        let pool = RegionPool::new(geometry, region).map_err(to_py)?;
        self.register(py, Arc::new(pool), Some(buffer.unbind()))
    }

    /// The byte ranges `(offset, length)` of page `page` in the registered pool's buffer, in
    /// the order they are stored (to cross-check an engine's own page pointers).
    fn page_spans(&self, py: Python<'_>, page: u64) -> PyResult<Vec<(u64, u64)>> {
        self.check_open()?;
        let geometry = py
            .detach(|| self.pool.lock().unwrap_or_else(|e| e.into_inner()).geometry)
            .ok_or_else(|| invalid("no pool is registered"))?;
        let spans = geometry.page_spans(page).map_err(to_py)?;
        Ok(spans.map(|s| (s.offset, s.len)).collect())
    }

    /// How many of `keys`, from the first, are stored (a key that is not valid ends the run).
    fn batch_exists(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<usize> {
        self.check_open()?;
        let keys = leading_valid(keys);
        py.detach(|| self.cache.batch_exists(&keys)).map_err(to_py)
    }

    /// Writes pages from host token slots (`page_tokens` contiguous slots per key): one
    /// `True` per stored page, and `(index, message)` for each page that failed.
    fn batch_set(&self, py: Python<'_>, keys: Vec<String>, tokens: Tokens) -> PyResult<Outcomes> {
        self.transfer(py, keys, tokens.0, true)
    }

    /// Reads pages into host token slots: `True` per verified hit (a miss is `False` with no
    /// message), and `(index, message)` for each page that failed.
    fn batch_get(&self, py: Python<'_>, keys: Vec<String>, tokens: Tokens) -> PyResult<Outcomes> {
        self.transfer(py, keys, tokens.0, false)
    }

    /// Registers the sidecar pool `name` (SGLang's hybrid pools: `mamba`, `swa`, `indexer`,
    /// …) over `buffers` (C-contiguous CPU torch tensors or numpy arrays, one per buffer).
    /// `layouts` gives, per buffer, its page stride and page 0's spans `(offset, length)` in
    /// stored order; page `p` is those spans shifted by `p × stride`. `replicated` pools
    /// (identical on every TP rank) are written by TP rank 0 only; `format` describes the
    /// bytes and goes into the pool's namespace. Returns the pool report. The connector
    /// keeps the buffers alive while the pool is registered.
    #[pyo3(signature = (name, buffers, layouts, *, page_tokens, pages, replicated, format))]
    #[allow(clippy::too_many_arguments)]
    fn register_sidecar(
        &self,
        py: Python<'_>,
        name: &str,
        buffers: Vec<Bound<'_, PyAny>>,
        layouts: Vec<(u64, Vec<(u64, u64)>)>,
        page_tokens: u64,
        pages: u64,
        replicated: bool,
        format: &str,
    ) -> PyResult<Py<PyDict>> {
        let name = PoolName::new(name).map_err(to_py)?;
        let layouts = layouts
            .into_iter()
            .map(|(stride, spans)| {
                let spans = spans
                    .into_iter()
                    .map(|(offset, len)| Span { offset, len })
                    .collect();
                BufferLayout::new(stride, spans)
            })
            .collect::<hicache::Result<Vec<_>>>()
            .map_err(to_py)?;
        let geometry =
            SidecarGeometry::new(page_tokens, pages, layouts, replicated, format).map_err(to_py)?;
        let mut regions = Vec::with_capacity(buffers.len());
        for (i, buffer) in buffers.iter().enumerate() {
            let (ptr, len) = host_buffer(buffer)?;
            if ptr == 0 {
                return Err(invalid(format!(
                    "sidecar {name}: buffer {i} has no memory (null pointer)"
                )));
            }
            // SAFETY: `buffer` is a live, contiguous CPU buffer of `len` bytes at `ptr`
            // (checked by `host_buffer`), and this connector keeps a reference to it while
            // the sidecar is registered (until it is replaced, the KV pool is registered
            // again, or close, each of which ends the transfers first). hicache reaches the
            // bytes only through the region's pins; the caller keeps its writes off pages in
            // flight, as for the KV pool.
            regions.push(unsafe { MemoryRegion::from_raw(ptr as *mut u8, len, MemKind::Host) });
        }
        let pool = SidecarPool::new(name.clone(), geometry, regions).map_err(to_py)?;
        let owners: Vec<Py<PyAny>> = buffers.into_iter().map(Bound::unbind).collect();
        let (report, old) = py.detach(|| {
            let mut held = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            self.check_open()?;
            // A sidecar of this name is let go first: this returns once no transfer uses its
            // memory, so its buffers may then be released.
            let report = self
                .cache
                .unregister_sidecar(&name)
                .and_then(|_| self.cache.register_sidecar(pool));
            let old = match &report {
                Ok(_) => held.sidecars.insert(name.clone(), owners),
                Err(_) => held.sidecars.remove(&name),
            };
            Ok::<_, PyErr>((report, old))
        })?;
        drop(old);
        Ok(report_dict(py, &report.map_err(to_py)?)?.unbind())
    }

    /// What a read could restore of `keys`: `(kv_hit, [(pool, hit)], restorable, hit)` for
    /// `pools` given as `(name, policy, window)` with policy `all_pages` or `trailing_pages`
    /// (see `HiCache::batch_exists_v2`). Keys from the first invalid one on count as absent.
    #[allow(clippy::type_complexity)]
    fn batch_exists_v2(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        pools: Vec<(String, String, usize)>,
    ) -> PyResult<(usize, Vec<(String, usize)>, Vec<usize>, usize)> {
        self.check_open()?;
        let keys = leading_valid(keys);
        let mut names = Vec::with_capacity(pools.len());
        let mut policies = Vec::with_capacity(pools.len());
        for (name, policy, window) in pools {
            names.push(PoolName::new(name).map_err(to_py)?);
            policies.push(match policy.as_str() {
                "all_pages" => HitPolicy::AllPages,
                "trailing_pages" => HitPolicy::TrailingPages { window },
                other => {
                    return Err(invalid(format!(
                        "hit policy {other:?} is not one of all_pages, trailing_pages"
                    )));
                }
            });
        }
        let queries: Vec<PoolQuery<'_>> = names
            .iter()
            .zip(policies)
            .map(|(pool, policy)| PoolQuery { pool, policy })
            .collect();
        let found = py
            .detach(|| self.cache.batch_exists_v2(&keys, &queries))
            .map_err(to_py)?;
        let hits = found
            .pool_hits
            .into_iter()
            .map(|(name, hit)| (name.to_string(), hit))
            .collect();
        Ok((found.kv_hit, hits, found.restorable, found.hit))
    }

    /// Writes each `(pool, keys, tokens)` transfer (`kv` names the KV pool): per transfer,
    /// one `True` per stored page and `(index, message)` per failed page.
    fn batch_set_v2(&self, py: Python<'_>, transfers: Vec<PyTransfer>) -> PyResult<Vec<Outcomes>> {
        self.transfer_v2(py, transfers, true)
    }

    /// Reads each `(pool, keys, tokens)` transfer: per transfer, `True` per verified hit
    /// (`False` for a miss, or for a sidecar page not read because the same call's KV read
    /// did not restore its key) and `(index, message)` per failed page.
    fn batch_get_v2(&self, py: Python<'_>, transfers: Vec<PyTransfer>) -> PyResult<Vec<Outcomes>> {
        self.transfer_v2(py, transfers, false)
    }

    /// Removes pages (every object of each); a missing page is not an error.
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Option<String>>> {
        self.check_open()?;
        let Checked { keys, at, errors } = check_keys(keys);
        let n = at.len() + errors.len();
        let results = py
            .detach(|| self.cache.batch_remove(&keys))
            .map_err(to_py)?;
        let mut out: Vec<Option<String>> = vec![None; n];
        for (i, e) in errors {
            out[i] = Some(e);
        }
        for (&i, r) in at.iter().zip(results) {
            out[i] = r.err().map(|e| e.to_string());
        }
        Ok(out)
    }

    /// Removes every stored page of the registered pool's namespace (pages of other models,
    /// ranks and geometries stay); returns how many objects went. Ranks that do not write
    /// remove nothing. Refused under `naming = "sglang"`.
    fn clear(&self, py: Python<'_>) -> PyResult<u64> {
        self.check_open()?;
        py.detach(|| self.cache.clear()).map_err(to_py)
    }

    /// The connector's counters since it opened.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.cache.stats();
        let d = PyDict::new(py);
        d.set_item("pages_written", s.pages_written)?;
        d.set_item("pages_hit", s.pages_hit)?;
        d.set_item("pages_not_found", s.pages_not_found)?;
        d.set_item("pages_invalid", s.pages_invalid)?;
        d.set_item("page_errors", s.page_errors)?;
        d.set_item("bytes_written", s.bytes_written)?;
        d.set_item("bytes_read", s.bytes_read)?;
        Ok(d)
    }

    /// Ends the connector: every later call but `stats` fails (a new `register_pool` too;
    /// the `plugin` property still answers);
    /// the pools are let go once their transfers end. Idempotent.
    fn close(&self, py: Python<'_>) {
        let old = py.detach(|| {
            let mut held = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::Release);
            // Returns once no transfer uses the pool: only then may its buffer go.
            self.cache.close();
            std::mem::take(&mut *held)
        });
        drop(old);
    }
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Connector>()?;
    m.add("HiCacheError", m.py().get_type::<HiCacheError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
