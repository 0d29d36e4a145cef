//! The connector engines call: `HiCache` turns page keys and host page indices into backend
//! transfers, choosing zero-copy, bounce or anchor per pool and framing pages in envelopes.
//!
//! - `options`: what a caller tunes and gets back (options, slots, outcomes, stats, report);
//! - `mode`: which transfer mode a pool gets on a backend;
//! - this module: the connector's lifecycle (open, register, unregister, close);
//! - `io`: the batch calls (set, get, exists, remove);
//! - `plan`: a registered pool's fixed state, how a chunk of pages becomes objects, and the
//!   envelope framing of each object.

mod io;
mod mode;
mod options;
mod plan;
mod shape;
mod v2;

pub use mode::{ModeRule, TransferMode, choose_mode, decide_mode};
pub use options::{
    HiCacheOptions, HostSlots, PayloadCheck, PoolReport, STORAGE_BATCH_SIZE, SetOutcome, Stats,
};
pub use v2::{ExistsV2, HitPolicy, PoolId, PoolQuery, PoolTransfer};

use mode::effective_alignment;
use options::Counters;
use plan::{Part, PoolState};
use shape::PageShape;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::backend::{BackendInfo, DynBackend};
use crate::config::Config;
use crate::envelope::{self, PageFormat};
use crate::error::{Error, Result};
use crate::key::{Namespace, NamingScheme, ObjectNamer};
use crate::memory::{MemKind, MemoryRegion, align_up};
use crate::meters::ConnectorMeters;
use crate::pool::{HostPool, PoolName};
use crate::probe::Fact;
use crate::registry::{PluginRegistry, Selection};
use crate::staging::StagingPool;

/// The storage connector: one backend, one registered host pool.
///
/// All methods take `&self` and may be called from several threads at once (prefetch,
/// backup and existence threads, as SGLang does).
pub struct HiCache {
    backend: DynBackend,
    info: BackendInfo,
    config: Config,
    options: HiCacheOptions,
    selection: Option<String>,
    plugin_facts: Vec<Fact>,
    state: RwLock<Option<Arc<PoolState>>>,
    sidecars: RwLock<BTreeMap<PoolName, Arc<PoolState>>>,
    counters: Counters,
    meters: ConnectorMeters,
}

/// What `build_state` needs to know of a pool being registered.
struct Registration {
    /// How the log names the pool.
    what: String,
    shape: PageShape,
    memory: Vec<MemoryRegion>,
    pool: Option<Arc<dyn HostPool>>,
    mode: TransferMode,
    reason: String,
    namespace: Namespace,
    namer: ObjectNamer,
    /// One name tag per object of a page (`None`: the page's one object).
    tags: Vec<Option<String>>,
    replicated: bool,
}

impl fmt::Debug for HiCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HiCache")
            .field("backend", &self.info.name)
            .field("selection", &self.selection)
            .finish()
    }
}

impl HiCache {
    /// Selects a plugin from `registry` for `config`, builds it, and wraps it.
    pub fn open(
        registry: &PluginRegistry,
        config: Config,
        options: HiCacheOptions,
    ) -> Result<Self> {
        let (backend, selection) = registry.open(&config)?;
        Self::build(backend, config, options, Some(&selection))
    }

    /// Wraps a backend built elsewhere (tests, embedding, dynamic plugins).
    pub fn with_backend(
        backend: DynBackend,
        config: Config,
        options: HiCacheOptions,
    ) -> Result<Self> {
        Self::build(backend, config, options, None)
    }

    fn build(
        backend: DynBackend,
        config: Config,
        options: HiCacheOptions,
        selection: Option<&Selection>,
    ) -> Result<Self> {
        options.identity.validate()?;
        let info = backend.info();
        let meters = ConnectorMeters::new(&info.name);
        Ok(HiCache {
            backend,
            info,
            config,
            options,
            selection: selection.map(Selection::summary),
            plugin_facts: selection
                .and_then(|s| s.considered.iter().find(|c| c.name == s.plugin.name))
                .map(|c| c.facts.clone())
                .unwrap_or_default(),
            state: RwLock::new(None),
            sidecars: RwLock::new(BTreeMap::new()),
            counters: Counters::default(),
            meters,
        })
    }

    /// The backend's identity and capability.
    pub fn backend_info(&self) -> &BackendInfo {
        &self.info
    }

    /// The backend itself.
    pub fn backend(&self) -> &DynBackend {
        &self.backend
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the selected plugin's probe established (its engine, each dir's filesystem and
    /// I/O mode, the endpoint…); empty for a backend given to
    /// [`with_backend`](Self::with_backend).
    pub fn plugin_facts(&self) -> &[Fact] {
        &self.plugin_facts
    }

    /// The selection summary line, when the plugin was selected by `open`.
    pub fn selection_summary(&self) -> Option<&str> {
        self.selection.as_deref()
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            pages_written: get(&c.pages_written),
            pages_hit: get(&c.pages_hit),
            pages_not_found: get(&c.pages_not_found),
            pages_invalid: get(&c.pages_invalid),
            page_errors: get(&c.page_errors),
            bytes_written: get(&c.bytes_written),
            bytes_read: get(&c.bytes_read),
        }
    }

    /// Registers the host pool: decides the transfer mode (logged once, returned), registers
    /// memory, sets up staging. A second call replaces the previous pool.
    pub fn register_pool(&self, pool: Arc<dyn HostPool>) -> Result<PoolReport> {
        // Read the pool's geometry and memory once: a HostPool is a safe trait and may not
        // answer the same way twice.
        let geometry = *pool.geometry();
        let memory = pool.memory();
        if let Some(m) = &memory
            && m.len() < geometry.pool_bytes()
        {
            return Err(Error::InvalidPool {
                reason: format!(
                    "pool memory is {} bytes but the geometry needs {}",
                    m.len(),
                    geometry.pool_bytes()
                ),
            });
        }
        let (mode, reason) = choose_mode(
            &geometry,
            memory.as_ref().map(|m| m.addr() as u64),
            &self.info,
            &self.config,
        );
        let identity = &self.options.identity;
        let namespace = Namespace::new(identity, &geometry);
        let replicated = geometry.attention().is_rank_replicated();
        let naming = self.config.naming.value;
        let namer = ObjectNamer::new(naming, &namespace, identity, replicated);
        let spans = geometry.spans_per_page();
        let tags: Vec<Option<String>> =
            if naming == NamingScheme::Sglang && mode == TransferMode::ZeroCopy {
                (0..spans)
                    .map(|i| Some(if i == 0 { "_k" } else { "_v" }.to_string()))
                    .collect()
            } else {
                vec![None]
            };
        let state = self.build_state(Registration {
            what: format!("{} host pool", geometry.layout()),
            shape: PageShape::of_kv(&geometry)?,
            memory: memory.into_iter().collect(),
            pool: Some(pool),
            mode,
            reason,
            namespace,
            namer,
            tags,
            replicated,
        })?;
        let report = state.report.clone();
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(state));
        Ok(report)
    }

    /// Builds a pool's state: checks its memory kind, sizes its objects and staging,
    /// registers its buffers for zero-copy, and logs the decision.
    fn build_state(&self, r: Registration) -> Result<PoolState> {
        let capability = self.info.capability;
        let naming = self.config.naming.value;
        let format = self.config.page_format.value;
        let rule = ModeRule::of(&self.config, &self.info);
        let mode = r.mode;
        let device = r.memory.first().is_some_and(|m| m.kind() != MemKind::Host);
        if let Some(m) = r.memory.first().filter(|_| device) {
            if !capability.accepts(m.kind()) {
                return Err(Error::Unsupported {
                    component: self.info.name.clone().into(),
                    operation: format!(
                        "a pool in {} memory ({} moves host memory; a GPU pool needs a GPU-direct plugin such as GDS or GDS_MT)",
                        m.kind(),
                        self.info.name
                    ),
                });
            }
            if mode != TransferMode::ZeroCopy {
                return Err(Error::InvalidPool {
                    reason: format!(
                        "a pool in {} memory must move zero-copy (the connector cannot copy GPU memory through host staging), but this one would bounce: {}",
                        m.kind(),
                        r.reason
                    ),
                });
            }
        }
        let align = effective_alignment(&capability);
        let enveloped = format == PageFormat::Envelope;
        let header_len = if enveloped {
            envelope::header_len(align)
        } else {
            0
        };
        // A raw marker is what SGLang writes: 1 byte, or 4096 when it aligns pages for
        // direct I/O (and never less than one aligned block).
        let marker_len = match format {
            PageFormat::Envelope => 1,
            PageFormat::Raw => align.max(rule.raw_marker_len()),
        };
        let spans = r.shape.spans_per_page();
        let span_lens: Vec<u64> = r.shape.spans(0).map(|s| s.len).collect();
        let parts: Vec<Part> = match mode {
            TransferMode::ZeroCopy => {
                // One object per tag; the spans are shared out evenly (one each when tagged).
                let per = spans / r.tags.len() as u64;
                r.tags
                    .iter()
                    .enumerate()
                    .map(|(i, tag)| {
                        let range = i as u64 * per..(i as u64 + 1) * per;
                        Part {
                            tag: tag.clone(),
                            payload_len: span_lens[range.start as usize..range.end as usize]
                                .iter()
                                .sum(),
                            spans: range,
                        }
                    })
                    .collect()
            }
            TransferMode::Bounce => vec![Part {
                tag: None,
                spans: 0..spans,
                payload_len: r.shape.page_bytes(),
            }],
            TransferMode::Anchor => vec![Part {
                tag: None,
                spans: 0..spans,
                payload_len: marker_len,
            }],
        };
        let largest = parts.iter().map(|p| p.payload_len).max().unwrap_or(0);
        let slot_len = match mode {
            TransferMode::ZeroCopy => header_len,
            TransferMode::Bounce | TransferMode::Anchor => header_len + align_up(largest, align),
        };
        let stored: u64 = parts
            .iter()
            .map(|p| header_len + align_up(p.payload_len, align))
            .sum();
        let slots = match self.options.staging_chunk_bytes.checked_div(slot_len) {
            None => self.options.max_slots_per_chunk,
            Some(n) => (n as usize).clamp(1, self.options.max_slots_per_chunk),
        };
        let staging = || {
            (slot_len > 0).then(|| {
                StagingPool::new(
                    self.backend.clone(),
                    slot_len,
                    slots,
                    align,
                    self.options.max_staging_chunks,
                )
            })
        };
        let mut regions = Vec::new();
        if mode == TransferMode::ZeroCopy {
            for m in &r.memory {
                match self.backend.register(m.clone()) {
                    Ok(id) => regions.push(id),
                    Err(e) => {
                        for id in regions {
                            let _ = self.backend.deregister(id);
                        }
                        return Err(e);
                    }
                }
            }
        }
        let writer = !r.replicated || self.options.identity.tp_rank == 0;
        let report = PoolReport {
            mode,
            reason: r.reason,
            page_bytes: r.shape.page_bytes(),
            spans_per_page: spans,
            objects_per_page: parts.len() as u64,
            stored_bytes_per_page: stored,
            io_alignment: align,
            naming,
            page_format: format,
            namespace: r.namespace.short_hex(),
            writer,
            staging_chunk_bytes: slot_len * slots as u64,
            pool_path: regions.first().map(|id| self.backend.region_path(*id)),
            payload_check: match (format, device) {
                (PageFormat::Raw, _) => PayloadCheck::LengthOnly,
                (PageFormat::Envelope, true) => PayloadCheck::DeviceUnchecked,
                (PageFormat::Envelope, false) => PayloadCheck::Checksum,
            },
        };
        tracing::info!(
            backend = %self.info.name,
            pool = %r.what,
            mode = %report.mode,
            reason = %report.reason,
            page_bytes = report.page_bytes,
            alignment = align,
            naming = %naming,
            format = %format,
            writer,
            pool_path = report.pool_path.as_ref().map(tracing::field::display),
            "registered host pool"
        );
        Ok(PoolState {
            backend: self.backend.clone(),
            memory: r.memory,
            device,
            _pool: r.pool,
            shape: r.shape,
            regions,
            mode,
            format,
            namer: r.namer,
            namespace: r.namespace,
            parts,
            align,
            header_len,
            write_staging: staging(),
            read_staging: staging(),
            objects_per_call: slots,
            writer,
            report,
        })
    }

    /// The registered pool's report.
    pub fn pool_report(&self) -> Option<PoolReport> {
        self.current().ok().map(|s| s.report.clone())
    }

    /// [`HiCache::unregister_pool`], blocking the thread: returns once calls that were
    /// running have returned, no transfer uses the pools' or staging memory, and all are
    /// deregistered. Idempotent. In async code prefer `unregister_pool`.
    pub fn close(&self) {
        for state in self.take_pools() {
            while Arc::strong_count(&state) > 1 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // PoolState's drop waits for the last pin, then deregisters.
            drop(state);
        }
    }

    /// Takes the KV pool and every sidecar out of the connector.
    fn take_pools(&self) -> Vec<Arc<PoolState>> {
        let kv = self.state.write().unwrap_or_else(|e| e.into_inner()).take();
        let sidecars =
            std::mem::take(&mut *self.sidecars.write().unwrap_or_else(|e| e.into_inner()));
        kv.into_iter().chain(sidecars.into_values()).collect()
    }

    /// Unregisters the host pool and every sidecar: later calls fail with
    /// [`Error::PoolNotRegistered`], and this returns once no transfer uses the pools' memory
    /// any more and it has been deregistered from the backend, so the caller may free it.
    /// Idempotent.
    pub async fn unregister_pool(&self) {
        for state in self.take_pools() {
            retire(state).await;
        }
    }

    fn current(&self) -> Result<Arc<PoolState>> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::PoolNotRegistered)
    }
}

/// Waits until no call and no transfer uses a pool taken out of the connector, then drops
/// it (which deregisters its memory without blocking).
async fn retire(state: Arc<PoolState>) {
    // Calls in progress hold the state: wait for them to return, then for any transfer that
    // outlived its call.
    while Arc::strong_count(&state) > 1 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for memory in &state.memory {
        memory.wait_idle().await;
    }
    for staging in [&state.write_staging, &state.read_staging]
        .into_iter()
        .flatten()
    {
        staging.wait_idle().await;
    }
    drop(state);
}
