//! The connector engines call: `HiCache` turns page keys and host page indices into backend
//! transfers, choosing zero-copy, bounce or anchor per pool and framing pages in envelopes.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::backend::{
    BackendInfo, Capability, DynBackend, MissReason, ReadItem, ReadOutcome, StorageBackend,
    WriteItem,
};
use crate::config::{Config, TransferChoice};
use crate::envelope::{self, FLAG_ANCHOR, HEADER_FIELDS_LEN, Header, PageFormat};
use crate::error::{Error, Result};
use crate::key::{
    KvPart, Namespace, NamingScheme, ObjectKey, ObjectNamer, PageKey, StorageIdentity,
};
use crate::memory::{Access, MemoryRegion, RegionId, Slice, align_up};
use crate::pool::{HostPool, PoolGeometry};
use crate::probe::Fact;
use crate::registry::{PluginRegistry, Selection};
use crate::staging::StagingPool;

/// SGLang's largest batch; also the default number of slots per staging chunk.
pub const STORAGE_BATCH_SIZE: usize = 128;

/// Connector tuning and the engine identity.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HiCacheOptions {
    /// Who stores (model, ranks); with the pool this forms the namespace.
    pub identity: StorageIdentity,
    /// Most bytes of one staging chunk (bounce slots, headers).
    pub staging_chunk_bytes: u64,
    /// Most slots (objects) per staging chunk and pages per backend call.
    pub max_slots_per_chunk: usize,
    /// Most staging chunks per direction (bounds staging memory and concurrency).
    pub max_staging_chunks: usize,
}

impl Default for HiCacheOptions {
    fn default() -> Self {
        HiCacheOptions {
            identity: StorageIdentity::default(),
            staging_chunk_bytes: 64 << 20,
            max_slots_per_chunk: STORAGE_BATCH_SIZE,
            max_staging_chunks: 4,
        }
    }
}

impl HiCacheOptions {
    /// Options for `identity` with default tuning.
    pub fn new(identity: StorageIdentity) -> Self {
        HiCacheOptions {
            identity,
            ..Self::default()
        }
    }

    /// Sets the staging chunk size in bytes.
    pub fn with_staging_chunk_bytes(mut self, bytes: u64) -> Self {
        self.staging_chunk_bytes = bytes;
        self
    }

    /// Sets the slots per chunk.
    pub fn with_max_slots_per_chunk(mut self, slots: usize) -> Self {
        self.max_slots_per_chunk = slots.max(1);
        self
    }
}

/// How a pool's pages move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferMode {
    /// The backend reads and writes the pool's spans in place.
    ZeroCopy,
    /// Pages are copied through aligned staging slots.
    Bounce,
    /// The pool has no bytes: small marker objects stand for pages.
    Anchor,
}

impl fmt::Display for TransferMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransferMode::ZeroCopy => "zero-copy",
            TransferMode::Bounce => "bounce",
            TransferMode::Anchor => "anchor",
        })
    }
}

/// The transfer mode `config` gets for a pool: [`decide_mode`] under the config's naming,
/// turned into bounce when `transfer_mode = bounce`.
pub fn choose_mode(
    geometry: &PoolGeometry,
    base: Option<u64>,
    capability: &Capability,
    config: &Config,
) -> (TransferMode, String) {
    match decide_mode(geometry, base, capability, config.naming.value) {
        (TransferMode::ZeroCopy, _) if config.transfer_mode.value == TransferChoice::Bounce => (
            TransferMode::Bounce,
            format!(
                "transfer_mode = bounce (from {})",
                config.transfer_mode.source
            ),
        ),
        decided => decided,
    }
}

/// Decides the transfer mode of a pool whose memory starts at `base` (`None`: anchor pool).
///
/// Zero-copy needs every span (base and length) aligned to the backend's direct-I/O alignment
/// and few enough spans per object; SGLang naming additionally keeps `layer_first` pools in
/// bounce mode, because SGLang stores those as flat pages under one name.
pub fn decide_mode(
    geometry: &PoolGeometry,
    base: Option<u64>,
    capability: &Capability,
    naming: NamingScheme,
) -> (TransferMode, String) {
    let Some(base) = base else {
        return (
            TransferMode::Anchor,
            "the pool has no KV bytes (logical anchor pool); pages are tracked by marker objects"
                .into(),
        );
    };
    let align = effective_alignment(capability);
    let spans = geometry.spans_per_page();
    if naming == NamingScheme::Sglang && spans > 2 {
        return (
            TransferMode::Bounce,
            format!(
                "{} pages have {spans} spans and SGLang naming stores them as one flat page",
                geometry.layout()
            ),
        );
    }
    // One more segment for the envelope header.
    if spans + 1 > u64::from(capability.max_segments.max(1)) {
        return (
            TransferMode::Bounce,
            format!(
                "a {} page has {spans} spans, more than the {} segments per object the backend takes",
                geometry.layout(),
                capability.max_segments
            ),
        );
    }
    if !geometry.spans_aligned(base, align) {
        return (
            TransferMode::Bounce,
            format!(
                "direct I/O needs {align}-byte alignment but the pool base {base:#x} or its span length {} is not a multiple of it",
                geometry.span_len()
            ),
        );
    }
    let why = if align > 1 {
        format!(
            "base and {spans} span(s) of {} bytes per page are {align}-byte aligned",
            geometry.span_len()
        )
    } else {
        format!("direct I/O is off; {spans} span(s) per page move in place")
    };
    (TransferMode::ZeroCopy, why)
}

fn effective_alignment(capability: &Capability) -> u64 {
    if capability.direct_io {
        capability.io_alignment.max(1)
    } else {
        1
    }
}

/// What `register_pool` decided, for logs, `hicache doctor` and callers.
#[derive(Clone, Debug, Serialize)]
pub struct PoolReport {
    /// The transfer mode.
    pub mode: TransferMode,
    /// Why.
    pub reason: String,
    /// Bytes of one page.
    pub page_bytes: u64,
    /// Spans per page in the host pool.
    pub spans_per_page: u64,
    /// Objects per page in storage.
    pub objects_per_page: u64,
    /// Bytes stored per page (headers and padding included).
    pub stored_bytes_per_page: u64,
    /// Alignment applied to transfers.
    pub io_alignment: u64,
    /// Object naming.
    pub naming: NamingScheme,
    /// Object framing.
    pub page_format: PageFormat,
    /// Short namespace digest (part of object names under hicache naming).
    pub namespace: String,
    /// Whether this rank writes (MLA: only TP rank 0 does).
    pub writer: bool,
    /// Staging bytes per chunk: envelope headers in zero-copy mode (0 with raw pages), whole
    /// pages in bounce mode, marker objects for an anchor pool.
    pub staging_chunk_bytes: u64,
}

/// Host pages named by page index or, like SGLang, by token index.
#[derive(Clone, Copy, Debug)]
pub enum HostSlots<'a> {
    /// One page index per key.
    Pages(&'a [u64]),
    /// `page_tokens` contiguous token indices per key, the first page-aligned.
    Tokens(&'a [u64]),
}

/// Result of writing one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SetOutcome {
    /// The page is stored.
    Written,
    /// Nothing was written: this rank is not the writer of a rank-replicated (MLA) pool.
    SkippedNotWriter,
}

/// Counters of the connector.
#[derive(Debug, Default)]
struct Counters {
    pages_written: AtomicU64,
    pages_hit: AtomicU64,
    pages_not_found: AtomicU64,
    pages_invalid: AtomicU64,
    page_errors: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
}

/// A snapshot of the connector's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Pages stored.
    pub pages_written: u64,
    /// Pages read and verified.
    pub pages_hit: u64,
    /// Reads that found no object.
    pub pages_not_found: u64,
    /// Reads that found an invalid object (torn, corrupt, foreign).
    pub pages_invalid: u64,
    /// Pages that failed with an error.
    pub page_errors: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Payload bytes read.
    pub bytes_read: u64,
}

/// One object of a page: which spans it holds and its name suffix.
#[derive(Clone, Debug)]
struct Part {
    kv: Option<KvPart>,
    spans: Range<u64>,
}

/// Everything fixed once a pool is registered.
struct PoolState {
    backend: DynBackend,
    /// Kept so the pool lives as long as its registration.
    _pool: Arc<dyn HostPool>,
    geometry: PoolGeometry,
    /// The pool's memory (None: anchor pool); the connector reaches it only through pins.
    memory: Option<MemoryRegion>,
    pool_region: Option<RegionId>,
    mode: TransferMode,
    format: PageFormat,
    namer: ObjectNamer,
    namespace: Namespace,
    parts: Vec<Part>,
    align: u64,
    header_len: u64,
    /// Payload bytes of one object (a part's spans, a page, or a marker).
    payload_len: u64,
    write_staging: Option<StagingPool>,
    read_staging: Option<StagingPool>,
    objects_per_call: usize,
    writer: bool,
    report: PoolReport,
}

impl fmt::Debug for PoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolState")
            .field("report", &self.report)
            .finish()
    }
}

impl Drop for PoolState {
    fn drop(&mut self) {
        if let Some(id) = self.pool_region.take() {
            if let Some(memory) = &self.memory {
                // Backends end their I/O before a dropped call finishes dropping; a transfer
                // that still pins the pool (an HTTP body being sent) is waited for, so the
                // memory is never released under it.
                memory.wait_idle_blocking();
            }
            if let Err(e) = self.backend.deregister(id) {
                tracing::debug!(error = %e, "deregistering the pool failed");
            }
        }
    }
}

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
        let (mode, reason) = choose_mode(
            &geometry,
            memory.as_ref().map(|m| m.addr() as u64),
            &capability,
            &self.config,
        );
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
        let marker_len = match format {
            PageFormat::Envelope => 1,
            PageFormat::Raw => align,
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
            "registered host pool"
        );
        let state = PoolState {
            backend: self.backend.clone(),
            memory,
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

    /// Writes pages. One result per key.
    ///
    /// Errors of the whole call (no pool registered, keys and slots that do not fit) come
    /// back as `Err` before any I/O.
    pub async fn batch_set(
        &self,
        keys: &[PageKey],
        slots: HostSlots<'_>,
    ) -> Result<Vec<Result<SetOutcome>>> {
        let state = self.current()?;
        let pages = host_pages(&state.geometry, keys.len(), slots)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        if !state.writer {
            return Ok((0..keys.len())
                .map(|_| Ok(SetOutcome::SkippedNotWriter))
                .collect());
        }
        let per_call = (state.objects_per_call / state.parts.len()).max(1);
        let mut results = Vec::with_capacity(keys.len());
        for (kchunk, pchunk) in keys.chunks(per_call).zip(pages.chunks(per_call)) {
            results.extend(self.set_chunk(&state, kchunk, pchunk).await);
        }
        Ok(results)
    }

    async fn set_chunk(
        &self,
        st: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<SetOutcome>> {
        let lease = match lease(&st.write_staging).await {
            Ok(l) => l,
            Err(e) => return fail_all(keys.len(), &e),
        };
        let chunk = lease.as_ref().map(|l| l.chunk());
        let slot_len = st.write_staging.as_ref().map_or(0, StagingPool::slot_len);
        let mut plan = st.plan_chunk(keys, pages, slot_len, |off, page, part, object, segs| {
            st.stage_write(chunk, off, page, part, object, segs)
        });
        let live = plan.live();
        let items: Vec<WriteItem<'_>> = live
            .iter()
            .map(|&j| WriteItem {
                key: &plan.objects[j],
                segments: plan.segments_of(j),
            })
            .collect();
        let outcomes = one_per_item(
            st.backend.as_ref(),
            "write",
            items.len(),
            st.backend.write(&items).await,
        );
        for (&j, outcome) in live.iter().zip(outcomes) {
            let page = plan.owners[j].0;
            if let Err(e) = outcome
                && plan.failed[page].is_none()
            {
                plan.failed[page] = Some(e);
            }
        }
        let page_bytes = st.geometry.page_bytes();
        plan.failed
            .into_iter()
            .map(|failed| match failed {
                None => {
                    self.counters.pages_written.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .bytes_written
                        .fetch_add(page_bytes, Ordering::Relaxed);
                    Ok(SetOutcome::Written)
                }
                Some(e) => {
                    self.counters.page_errors.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
            })
            .collect()
    }

    /// Reads pages into host slots. One result per key: `Hit`, `Miss(reason)`, or an error.
    ///
    /// A miss in zero-copy mode may leave the target host page partly overwritten (the bytes
    /// land in place before they can be verified); in bounce and anchor mode the host page is
    /// untouched unless the read is a verified hit.
    pub async fn batch_get(
        &self,
        keys: &[PageKey],
        slots: HostSlots<'_>,
    ) -> Result<Vec<Result<ReadOutcome>>> {
        let state = self.current()?;
        let pages = host_pages(&state.geometry, keys.len(), slots)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let per_call = (state.objects_per_call / state.parts.len()).max(1);
        let mut results = Vec::with_capacity(keys.len());
        for (kchunk, pchunk) in keys.chunks(per_call).zip(pages.chunks(per_call)) {
            results.extend(self.get_chunk(&state, kchunk, pchunk).await);
        }
        Ok(results)
    }

    async fn get_chunk(
        &self,
        st: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<ReadOutcome>> {
        if st.mode == TransferMode::ZeroCopy
            && let Some(memory) = &st.memory
        {
            // A write whose call was dropped may still read these pages (an HTTP body being
            // sent): wait for it instead of failing the read with MemoryBusy.
            for (&page, part) in pages.iter().zip(std::iter::repeat(&st.parts)) {
                for p in part {
                    for span in st.span_slices(page, p) {
                        memory
                            .wait_available(span.offset, span.len, Access::Write)
                            .await;
                    }
                }
            }
        }
        let lease = match lease(&st.read_staging).await {
            Ok(l) => l,
            Err(e) => return fail_all(keys.len(), &e),
        };
        let chunk = lease.as_ref().map(|l| l.chunk());
        let slot_len = st.read_staging.as_ref().map_or(0, StagingPool::slot_len);
        let mut plan = st.plan_chunk(keys, pages, slot_len, |off, page, part, _, segs| {
            st.stage_read(chunk, off, page, part, segs);
            Ok(())
        });
        let live = plan.live();
        let mut page_results: Vec<Result<ReadOutcome>> = std::mem::take(&mut plan.failed)
            .into_iter()
            .map(|f| f.map_or(Ok(ReadOutcome::Hit), Err))
            .collect();
        let (object_keys, owners, first_slot) = (&plan.objects, &plan.owners, &plan.first_slot);
        let items: Vec<ReadItem<'_>> = live
            .iter()
            .map(|&j| ReadItem {
                key: &object_keys[j],
                segments: plan.segments_of(j),
            })
            .collect();
        let outcomes = one_per_item(
            st.backend.as_ref(),
            "read",
            items.len(),
            st.backend.read(&items).await,
        );
        for (&j, outcome) in live.iter().zip(outcomes) {
            let (i, p) = owners[j];
            if !matches!(page_results[i], Ok(ReadOutcome::Hit)) {
                continue;
            }
            let verdict = match outcome {
                Ok(ReadOutcome::Hit) => {
                    let slot = j as u64 * slot_len;
                    match st.verify(chunk, slot, pages[i], &st.parts[p], &object_keys[j]) {
                        Ok(()) => Ok(ReadOutcome::Hit),
                        Err(reason) => {
                            tracing::warn!(key = %object_keys[j], %reason, "stored object is invalid; treating it as a miss");
                            Ok(ReadOutcome::Miss(reason))
                        }
                    }
                }
                other => other,
            };
            page_results[i] = verdict;
        }
        // Bounce: copy verified pages into the host pool; a page that missed stays untouched.
        if st.mode == TransferMode::Bounce
            && let Some(chunk) = chunk
        {
            for (i, r) in page_results.iter_mut().enumerate() {
                if matches!(r, Ok(ReadOutcome::Hit)) {
                    let slot = first_slot[i] + st.header_len;
                    let res = st.memory.as_ref().map_or(Ok(()), |memory| {
                        let payload = chunk.memory.source(
                            slot,
                            st.geometry.page_bytes(),
                            "connector staging slot",
                        )?;
                        crate::pool::scatter_into(
                            memory,
                            &st.geometry,
                            pages[i],
                            payload.host_bytes()?,
                        )
                    });
                    if let Err(e) = res {
                        *r = Err(e);
                    }
                }
            }
        }
        for r in &page_results {
            let counter = match r {
                Ok(ReadOutcome::Hit) => {
                    self.counters
                        .bytes_read
                        .fetch_add(st.geometry.page_bytes(), Ordering::Relaxed);
                    &self.counters.pages_hit
                }
                Ok(ReadOutcome::Miss(MissReason::NotFound)) => &self.counters.pages_not_found,
                Ok(ReadOutcome::Miss(_)) => &self.counters.pages_invalid,
                Err(_) => &self.counters.page_errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        page_results
    }

    /// Number of leading keys whose pages exist (the longest stored prefix).
    ///
    /// A key whose existence check fails with an error ends the prefix (and is logged).
    pub async fn batch_exists(&self, keys: &[PageKey]) -> Result<usize> {
        let state = self.current()?;
        let nparts = state.parts.len();
        let per_call = (state.objects_per_call / nparts).max(1);
        let mut prefix = 0;
        for chunk in keys.chunks(per_call) {
            let mut objects = Vec::with_capacity(chunk.len() * nparts);
            for key in chunk {
                for part in &state.parts {
                    match state.object_key(key, part) {
                        Ok(k) => objects.push(k),
                        Err(e) => {
                            tracing::warn!(%key, error = %e, "existence check of an invalid key");
                            return Ok(prefix);
                        }
                    }
                }
            }
            let found = one_per_item(
                self.backend.as_ref(),
                "exists",
                objects.len(),
                self.backend.exists(&objects).await,
            );
            for page in found.chunks(nparts) {
                let mut all = true;
                for r in page {
                    match r {
                        Ok(true) => {}
                        Ok(false) => all = false,
                        Err(e) => {
                            tracing::warn!(error = %e, "existence check failed; ending the prefix there");
                            all = false;
                        }
                    }
                }
                if !all {
                    return Ok(prefix);
                }
                prefix += 1;
            }
        }
        Ok(prefix)
    }

    /// Whether one page exists.
    pub async fn exists(&self, key: &PageKey) -> Result<bool> {
        Ok(self.batch_exists(std::slice::from_ref(key)).await? == 1)
    }

    /// Removes pages (every object of each); a missing page is not an error.
    pub async fn batch_remove(&self, keys: &[PageKey]) -> Result<Vec<Result<()>>> {
        let state = self.current()?;
        let mut results = Vec::with_capacity(keys.len());
        for key in keys {
            let mut objects = Vec::with_capacity(state.parts.len());
            let mut res = Ok(());
            for part in &state.parts {
                match state.object_key(key, part) {
                    Ok(k) => objects.push(k),
                    Err(e) => res = Err(e),
                }
            }
            if res.is_ok() {
                let removed = one_per_item(
                    self.backend.as_ref(),
                    "remove",
                    objects.len(),
                    self.backend.remove(&objects).await,
                );
                for r in removed {
                    if let Err(e) = r {
                        res = Err(e);
                    }
                }
            }
            results.push(res);
        }
        Ok(results)
    }

    /// The object names a page is stored under (for tools and tests).
    pub fn object_names(&self, key: &PageKey) -> Result<Vec<ObjectKey>> {
        let state = self.current()?;
        state
            .parts
            .iter()
            .map(|p| state.object_key(key, p))
            .collect()
    }
}

impl PoolState {
    /// Names every object of `keys` and lets `stage` prepare its segments at its staging
    /// offset. A page whose name or staging fails is marked failed and contributes no object.
    fn plan_chunk(
        &self,
        keys: &[PageKey],
        pages: &[u64],
        slot_len: u64,
        mut stage: impl FnMut(u64, u64, &Part, &ObjectKey, &mut Vec<Slice>) -> Result<()>,
    ) -> ChunkPlan {
        let n = keys.len() * self.parts.len();
        let mut plan = ChunkPlan {
            objects: Vec::with_capacity(n),
            owners: Vec::with_capacity(n),
            segments: Vec::with_capacity(n * 3),
            ranges: Vec::with_capacity(n),
            failed: (0..keys.len()).map(|_| None).collect(),
            first_slot: vec![0; keys.len()],
        };
        for (i, (key, &page)) in keys.iter().zip(pages).enumerate() {
            plan.first_slot[i] = plan.objects.len() as u64 * slot_len;
            let first_object = plan.objects.len();
            for (p, part) in self.parts.iter().enumerate() {
                let start = plan.segments.len();
                let staged = self.object_key(key, part).and_then(|object| {
                    let offset = plan.objects.len() as u64 * slot_len;
                    stage(offset, page, part, &object, &mut plan.segments).map(|()| object)
                });
                match staged {
                    Ok(object) => {
                        plan.ranges.push(start..plan.segments.len());
                        plan.objects.push(object);
                        plan.owners.push((i, p));
                    }
                    Err(e) => {
                        // Drop the page's objects staged so far; they are not transferred.
                        plan.segments
                            .truncate(plan.ranges.get(first_object).map_or(start, |r| r.start));
                        plan.ranges.truncate(first_object);
                        plan.objects.truncate(first_object);
                        plan.owners.truncate(first_object);
                        plan.failed[i] = Some(e);
                        break;
                    }
                }
            }
        }
        plan
    }

    fn object_key(&self, key: &PageKey, part: &Part) -> Result<ObjectKey> {
        match part.kv {
            None => self.namer.page_object(key),
            Some(kv) => self.namer.part_object(key, kv),
        }
    }

    fn span_slices(&self, page: u64, part: &Part) -> impl Iterator<Item = crate::pool::Span> {
        self.geometry
            .page_spans(page)
            .expect("page index validated by host_pages")
            .skip(part.spans.start as usize)
            .take((part.spans.end - part.spans.start) as usize)
    }

    /// Checksum of a part's spans in the host pool, read under pins.
    fn pool_checksum(&self, page: u64, part: &Part) -> Result<u64> {
        let memory = self.memory.as_ref().ok_or_else(|| Error::InvalidPool {
            reason: "a pool without memory has no spans to checksum".into(),
        })?;
        // Span by span, each pinned while it is hashed: no allocation per page.
        let mut hasher = envelope::PayloadHasher::default();
        for span in self.span_slices(page, part) {
            let pinned = memory.source(span.offset, span.len, "connector checksum")?;
            hasher.update(pinned.host_bytes()?);
        }
        Ok(hasher.finish())
    }

    fn expected_header(&self, object: &ObjectKey, checksum: u64) -> Header {
        Header {
            flags: if self.mode == TransferMode::Anchor {
                FLAG_ANCHOR
            } else {
                0
            },
            header_len: self.header_len,
            namespace: self.namespace,
            key_hash: object.hash(),
            payload_len: self.payload_len,
            checksum,
        }
    }

    /// Prepares one object for writing: header and/or payload in the staging slot at
    /// `slot_off`, and its segments.
    fn stage_write(
        &self,
        chunk: Option<&crate::staging::Chunk>,
        slot_off: u64,
        page: u64,
        part: &Part,
        object: &ObjectKey,
        segments: &mut Vec<Slice>,
    ) -> Result<()> {
        let enveloped = self.format == PageFormat::Envelope;
        match self.mode {
            TransferMode::ZeroCopy => {
                let region = self.pool_region.expect("zero-copy pools are registered");
                if enveloped {
                    let sum = self.pool_checksum(page, part)?;
                    let chunk = chunk.expect("enveloped zero-copy pools stage headers");
                    self.put_header(chunk, slot_off, object, sum)?;
                    segments.push(Slice::new(chunk.region, slot_off, self.header_len));
                }
                segments.extend(
                    self.span_slices(page, part)
                        .map(|s| Slice::new(region, s.offset, s.len)),
                );
            }
            TransferMode::Bounce | TransferMode::Anchor => {
                let chunk = chunk.expect("bounce and anchor pools stage pages");
                let payload_off = slot_off + self.header_len;
                let mut slot =
                    chunk
                        .memory
                        .target(payload_off, self.payload_len, "connector staging slot")?;
                let payload = slot.host_bytes_mut()?;
                match (&self.memory, self.mode) {
                    (Some(memory), TransferMode::Bounce) => {
                        crate::pool::gather_from(memory, &self.geometry, page, payload)?
                    }
                    _ => payload.fill(0x01),
                }
                if enveloped {
                    let sum = envelope::checksum([&*payload]);
                    drop(slot);
                    self.put_header(chunk, slot_off, object, sum)?;
                }
                let slot_len = self.header_len + align_up(self.payload_len, self.align);
                segments.push(Slice::new(chunk.region, slot_off, slot_len));
            }
        }
        Ok(())
    }

    fn put_header(
        &self,
        chunk: &crate::staging::Chunk,
        slot_off: u64,
        object: &ObjectKey,
        sum: u64,
    ) -> Result<()> {
        let fields = self.expected_header(object, sum).encode();
        chunk
            .memory
            .target(slot_off, HEADER_FIELDS_LEN as u64, "connector header slot")?
            .copy_from(0, &fields)
    }

    fn stage_read(
        &self,
        chunk: Option<&crate::staging::Chunk>,
        slot_off: u64,
        page: u64,
        part: &Part,
        segments: &mut Vec<Slice>,
    ) {
        match self.mode {
            TransferMode::ZeroCopy => {
                if self.format == PageFormat::Envelope
                    && let Some(chunk) = chunk
                {
                    segments.push(Slice::new(chunk.region, slot_off, self.header_len));
                }
                let region = self.pool_region.expect("zero-copy pools are registered");
                segments.extend(
                    self.span_slices(page, part)
                        .map(|s| Slice::new(region, s.offset, s.len)),
                );
            }
            TransferMode::Bounce | TransferMode::Anchor => {
                let chunk = chunk.expect("bounce and anchor pools stage pages");
                let slot_len = self.header_len + align_up(self.payload_len, self.align);
                segments.push(Slice::new(chunk.region, slot_off, slot_len));
            }
        }
    }

    /// Checks a read object: header identity and payload checksum (envelope), or nothing more
    /// than the length the backend already checked (raw).
    fn verify(
        &self,
        chunk: Option<&crate::staging::Chunk>,
        slot_off: u64,
        page: u64,
        part: &Part,
        object: &ObjectKey,
    ) -> Result<(), MissReason> {
        if self.format == PageFormat::Raw {
            return Ok(());
        }
        let chunk = chunk.expect("enveloped pools stage headers");
        let unreadable = |e: Error| MissReason::BadHeader {
            detail: e.to_string(),
        };
        let mut fields = [0u8; HEADER_FIELDS_LEN];
        {
            let head = chunk
                .memory
                .source(slot_off, HEADER_FIELDS_LEN as u64, "connector header slot")
                .map_err(unreadable)?;
            fields.copy_from_slice(head.host_bytes().map_err(unreadable)?);
        }
        let header = Header::decode(&fields)?;
        header.check_identity(&self.expected_header(object, 0))?;
        let sum = match self.mode {
            TransferMode::ZeroCopy => self.pool_checksum(page, part).map_err(unreadable)?,
            TransferMode::Bounce | TransferMode::Anchor => {
                let payload = chunk
                    .memory
                    .source(
                        slot_off + self.header_len,
                        self.payload_len,
                        "connector staging slot",
                    )
                    .map_err(unreadable)?;
                envelope::checksum([payload.host_bytes().map_err(unreadable)?])
            }
        };
        if sum != header.checksum {
            return Err(MissReason::ChecksumMismatch);
        }
        Ok(())
    }
}

/// The objects of one chunk of pages: names, segments, and which page each belongs to.
struct ChunkPlan {
    objects: Vec<ObjectKey>,
    /// (page index in the chunk, part index) of each object.
    owners: Vec<(usize, usize)>,
    segments: Vec<Slice>,
    ranges: Vec<Range<usize>>,
    /// Per page: why it cannot be transferred (bad name, staging failed).
    failed: Vec<Option<Error>>,
    /// Staging offset of each page's first object (bounce pages have exactly one).
    first_slot: Vec<u64>,
}

impl ChunkPlan {
    /// Objects whose page has not failed.
    fn live(&self) -> Vec<usize> {
        (0..self.objects.len())
            .filter(|j| self.failed[self.owners[*j].0].is_none())
            .collect()
    }

    fn segments_of(&self, object: usize) -> &[Slice] {
        &self.segments[self.ranges[object].clone()]
    }
}

/// Leases a staging chunk when the pool stages anything.
async fn lease(staging: &Option<StagingPool>) -> Result<Option<crate::staging::Lease<'_>>> {
    match staging {
        Some(s) => s.lease().await.map(Some),
        None => Ok(None),
    }
}

/// A plugin owes one result per item, in order. Any other count leaves every item's fate
/// unknown (zipping would count an unanswered write as written, or an unanswered read as a
/// hit), so every item fails.
fn one_per_item<T>(
    backend: &dyn StorageBackend,
    op: &str,
    items: usize,
    results: Vec<Result<T>>,
) -> Vec<Result<T>> {
    if results.len() == items {
        return results;
    }
    let name = backend.info().name;
    let e = Error::backend(
        name.clone(),
        format!(
            "{op} returned {} results for {items} items (a plugin bug: one result per item)",
            results.len()
        ),
    );
    tracing::error!(plugin = %name, error = %e, "plugin broke the one-result-per-item rule");
    (0..items).map(|_| Err(e.clone())).collect()
}

/// The error of a call that failed as a whole, for each of its `n` items.
fn fail_all<T>(n: usize, e: &Error) -> Vec<Result<T>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

/// Validates host slots against the keys and the pool and returns one page index per key.
fn host_pages(geometry: &PoolGeometry, keys: usize, slots: HostSlots<'_>) -> Result<Vec<u64>> {
    let out_of_pool = |what: String| Error::InvalidBatch {
        reason: format!("{what} is outside the pool of {} pages", geometry.pages()),
    };
    match slots {
        HostSlots::Pages(pages) => {
            if pages.len() != keys {
                return Err(Error::InvalidBatch {
                    reason: format!("{keys} keys but {} host pages", pages.len()),
                });
            }
            if let Some(p) = pages.iter().find(|p| **p >= geometry.pages()) {
                return Err(out_of_pool(format!("host page {p}")));
            }
            Ok(pages.to_vec())
        }
        HostSlots::Tokens(tokens) => {
            let ps = geometry.page_tokens();
            if tokens.len() as u64 != keys as u64 * ps {
                return Err(Error::InvalidBatch {
                    reason: format!(
                        "{keys} keys need {} host token indices ({ps} per page), got {}",
                        keys as u64 * ps,
                        tokens.len()
                    ),
                });
            }
            tokens
                .chunks(ps as usize)
                .enumerate()
                .map(|(i, page)| {
                    let first = page[0];
                    if first % ps != 0 || page.iter().enumerate().any(|(j, t)| *t != first + j as u64) {
                        return Err(Error::InvalidBatch {
                            reason: format!(
                                "token indices of key {i} are not one whole page (they must be {ps} contiguous indices starting at a multiple of {ps}); got {first}.."
                            ),
                        });
                    }
                    let p = first / ps;
                    if p >= geometry.pages() {
                        return Err(out_of_pool(format!("token index {first} (page {p})")));
                    }
                    Ok(p)
                })
                .collect()
        }
    }
}
