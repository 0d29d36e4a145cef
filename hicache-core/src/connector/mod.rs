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

pub use mode::{ModeRule, TransferMode, choose_mode, decide_mode};
pub use options::{
    HiCacheOptions, HostSlots, PayloadCheck, PoolReport, STORAGE_BATCH_SIZE, SetOutcome, Stats,
};

use mode::effective_alignment;
use options::Counters;
use plan::{Part, PoolState};

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::backend::{BackendInfo, DynBackend};
use crate::config::Config;
use crate::envelope::{self, PageFormat};
use crate::error::{Error, Result};
use crate::key::{KvPart, Namespace, NamingScheme, ObjectNamer};
use crate::memory::MemKind;
use crate::memory::align_up;
use crate::meters::ConnectorMeters;
use crate::pool::HostPool;
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
    counters: Counters,
    meters: ConnectorMeters,
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
        let capability = self.info.capability;
        let naming = self.config.naming.value;
        let format = self.config.page_format.value;
        let rule = ModeRule::of(&self.config, &self.info);
        let (mode, reason) = choose_mode(
            &geometry,
            memory.as_ref().map(|m| m.addr() as u64),
            &self.info,
            &self.config,
        );
        let device = memory.as_ref().is_some_and(|m| m.kind() != MemKind::Host);
        if let Some(m) = memory.as_ref().filter(|_| device) {
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
                        "a pool in {} memory must move zero-copy (the connector cannot copy GPU memory through host staging), but this one would bounce: {reason}",
                        m.kind()
                    ),
                });
            }
        }
        let align = effective_alignment(&capability);
        let identity = &self.options.identity;
        let namespace = Namespace::new(identity, &geometry);
        let namer = ObjectNamer::new(naming, &namespace, identity, &geometry.attention());
        let spans = geometry.spans_per_page();
        let parts = if naming == NamingScheme::Sglang && mode == TransferMode::ZeroCopy {
            (0..spans)
                .map(|i| Part {
                    kv: Some(if i == 0 { KvPart::K } else { KvPart::V }),
                    spans: i..i + 1,
                })
                .collect()
        } else {
            vec![Part {
                kv: None,
                spans: 0..spans,
            }]
        };
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
        let payload_len = match mode {
            TransferMode::ZeroCopy => {
                geometry.span_len() * (parts[0].spans.end - parts[0].spans.start)
            }
            TransferMode::Bounce => geometry.page_bytes(),
            TransferMode::Anchor => marker_len,
        };
        let slot_len = match mode {
            TransferMode::ZeroCopy => header_len,
            TransferMode::Bounce | TransferMode::Anchor => {
                header_len + align_up(payload_len, align)
            }
        };
        let stored_object = header_len + align_up(payload_len, align);
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
        let pool_region = match (mode, &memory) {
            (TransferMode::ZeroCopy, Some(m)) => Some(self.backend.register(m.clone())?),
            _ => None,
        };
        let writer = !geometry.attention().is_rank_replicated() || identity.tp_rank == 0;
        let report = PoolReport {
            mode,
            reason,
            page_bytes: geometry.page_bytes(),
            spans_per_page: spans,
            objects_per_page: parts.len() as u64,
            stored_bytes_per_page: stored_object * parts.len() as u64,
            io_alignment: align,
            naming,
            page_format: format,
            namespace: namespace.short_hex(),
            writer,
            staging_chunk_bytes: slot_len * slots as u64,
            pool_path: pool_region.map(|id| self.backend.region_path(id)),
            payload_check: match (format, device) {
                (PageFormat::Raw, _) => PayloadCheck::LengthOnly,
                (PageFormat::Envelope, true) => PayloadCheck::DeviceUnchecked,
                (PageFormat::Envelope, false) => PayloadCheck::Checksum,
            },
        };
        tracing::info!(
            backend = %self.info.name,
            mode = %report.mode,
            reason = %report.reason,
            layout = %geometry.layout(),
            page_bytes = report.page_bytes,
            alignment = align,
            naming = %naming,
            format = %format,
            writer,
            pool_path = report.pool_path.as_ref().map(tracing::field::display),
            "registered host pool"
        );
        let state = PoolState {
            backend: self.backend.clone(),
            memory,
            device,
            _pool: pool,
            geometry,
            pool_region,
            mode,
            format,
            namer,
            namespace,
            parts,
            align,
            header_len,
            payload_len,
            write_staging: staging(),
            read_staging: staging(),
            objects_per_call: slots,
            writer,
            report: report.clone(),
        };
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(state));
        Ok(report)
    }

    /// The registered pool's report.
    pub fn pool_report(&self) -> Option<PoolReport> {
        self.current().ok().map(|s| s.report.clone())
    }

    /// [`HiCache::unregister_pool`], blocking the thread: returns once calls that were
    /// running have returned, no transfer uses the pool or staging memory, and both are
    /// deregistered. Idempotent. In async code prefer `unregister_pool`.
    pub fn close(&self) {
        let state = self.state.write().unwrap_or_else(|e| e.into_inner()).take();
        let Some(state) = state else { return };
        while Arc::strong_count(&state) > 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // PoolState's drop waits for the last pin, then deregisters.
        drop(state);
    }

    /// Unregisters the host pool: later calls fail with [`Error::PoolNotRegistered`], and
    /// this returns once no transfer uses the pool's memory any more and it has been
    /// deregistered from the backend, so the caller may free it. Idempotent.
    pub async fn unregister_pool(&self) {
        let state = self.state.write().unwrap_or_else(|e| e.into_inner()).take();
        let Some(state) = state else { return };
        // Calls in progress hold the state: wait for them to return, then for any transfer
        // that outlived its call, so dropping the state deregisters without blocking.
        while Arc::strong_count(&state) > 1 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        if let Some(memory) = &state.memory {
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

    fn current(&self) -> Result<Arc<PoolState>> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::PoolNotRegistered)
    }
}
