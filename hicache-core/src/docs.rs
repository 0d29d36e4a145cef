//! Design notes that travel with the code.

/// # How very different engines map onto [`StorageBackend`](crate::raw::StorageBackend)
///
/// The trait is batch-in, results-out: one `async fn` call per batch, one `Result` per item,
/// memory named by slices of registrations. Each engine keeps its own submission model
/// behind that call:
///
/// - **io_uring (POSIX)**: `register` puts the region in the ring's sparse fixed-buffer
///   table (`IORING_REGISTER_BUFFERS_UPDATE`, best effort: up to 64 regions of at most 1 GiB). `write` / `read` turn each object into one
///   linked SQE chain (open, `WRITE_FIXED`/`READ_FIXED` when the object is one segment of a
///   fixed buffer, `WRITEV`/`READV` otherwise, close, rename); the ring thread submits and
///   reaps them and completes the future when every chain has ended. A short transfer breaks
///   its chain and is reported for that item, never counted as success.
/// - **threads (POSIX)**: worker threads take items of the batch one by one and run blocking
///   `pwritev`/`preadv`, continuing short transfers until the file ends.
/// - **object_store (OBJ)**: each item becomes one `put_opts` (conditional create) or `get`,
///   run concurrently up to the request limit with `buffered`; each HTTP outcome maps to that
///   item's result (404 → miss, errors after retries → error).
///
/// Planned plugins map the same way: **cuFile (GDS / GDS_MT)** — `register` calls
/// `cuFileBufRegister`, a batch becomes `cuFileBatchIOSubmit` with one `CUfileIOParams_t`
/// per segment (GDS) or a worker pool issuing `cuFileRead`/`cuFileWrite` (GDS_MT); **3FS
/// usrbio** — `register` creates an `hf3fs_iov`, a batch becomes `hf3fs_prep_io` per
/// segment, one `hf3fs_submit_ios` and `hf3fs_wait_for_ios`.
///
/// **C-ABI plugins** (`hicache-abi`) map onto it through a versioned `#[repr(C)]` table: the
/// host pins every slice of a batch, hands the plugin the batch with addresses, and awaits
/// the plugin's completion callback, which carries one result per item.
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
///   qualify too when aligned (SGLang always bounces them). Under SGLang naming the decision
///   is SGLang's own, so both find each other's objects: only `page_first` and
///   `page_first_direct` pools move zero-copy (as `_k`/`_v` objects; other layouts are stored
///   as one flat page), and when `use_direct_io` is on for a FILE plugin, only when base and
///   page stride are 4096-aligned — also on a filesystem without O_DIRECT, as SGLang does.
/// - **bounce** otherwise: pages are gathered into aligned staging slots (padded to the
///   alignment, so every I/O is aligned — SGLang packs slots at page size and misaligns them).
///   Staging chunks are leased per batch chunk, so concurrent callers never share a slot, and
///   batches larger than a chunk are split instead of failed.
/// - **anchor** for pools without bytes: one small marker object per page. Raw markers under
///   SGLang naming are SGLang's: 4096 bytes of `0x01` when `use_direct_io` is on for a FILE
///   plugin or the backend does direct I/O, 1 byte otherwise (under hicache naming, one
///   aligned block).
///
/// `transfer_mode = "bounce"` (env `HICACHE_TRANSFER_MODE`) turns every zero-copy pool into a
/// bounce pool: for storage or plugins that mishandle scattered segments, and so the
/// conformance suite runs the bounce path on every backend. The default, `auto`, decides as
/// above; `hicache doctor` shows which mode a pool gets and why.
///
/// Objects carry an envelope (header, payload at an aligned offset, xxh3 checksum) unless
/// `page_format = "raw"`; the connector writes and verifies it, so every plugin — file or
/// object — gets torn/corrupt/foreign detection without writing it again. An invalid object
/// reads as a miss with a reason and is counted in [`Stats`](crate::Stats). A plugin that
/// moves bytes on its own threads may run the connector's verification there, on each object
/// right after reading it, by implementing
/// [`StorageBackend::read_checked`](crate::raw::StorageBackend::read_checked) (POSIX's thread
/// pool does); the others keep the default and the connector verifies after the call. The
/// write side is the same: a zero-copy page's checksum is taken on the thread that writes the
/// object, just before the write, by a plugin that implements
/// [`StorageBackend::write_sealed`](crate::raw::StorageBackend::write_sealed) (POSIX's thread
/// pool does); for the others the connector takes it first, on two threads for a large call.
pub mod transfer_modes {}

/// # Memory: pins, cancellation and deregistration
///
/// Registered memory is reached only through **pins**. A backend pins every slice of a batch
/// with [`RegionTable::source`](crate::raw::RegionTable::source) (memory a storage write reads)
/// or [`RegionTable::target`](crate::raw::RegionTable::target) (memory a storage read fills)
/// before it issues I/O; the connector pins host pages and staging slots the same way when
/// it checksums, gathers or scatters them. A pin
/// - keeps the region's memory alive (owned regions) and registered:
///   [`RegionTable::remove`](crate::raw::RegionTable::remove) refuses with
///   [`Error::RegionBusy`](crate::Error::RegionBusy) while any pin is held;
/// - enforces the data-race rule: read pins may overlap, a write pin overlaps nothing, and a
///   pin that would break this is refused with
///   [`Error::MemoryBusy`](crate::Error::MemoryBusy) instead of letting two transfers race.
///
/// **Dropped futures.** A plugin's `read`/`write` future may be dropped at any await point
/// (an engine's timeout or `select!`). The contract: once the drop has returned, no byte of
/// the batch's *target* memory changes any more, and an abandoned write has published a
/// whole object or nothing. The POSIX engines meet it by marking the plan cancelled (items
/// not started never start) and blocking in the drop until the syscalls already running have
/// ended — at most one per worker thread or one chain per ring slot. Memory that an abandoned
/// transfer still *reads* may stay pinned after the drop (OBJ hands pinned buffers to the
/// HTTP client, which may still be sending them); the pins make that safe: the connector
/// hands out a staging chunk only when nothing pins it, waits before a read lands in host
/// pages that a write still reads, and `HiCache::unregister_pool` / dropping the connector
/// wait for the last pin before deregistering.
///
/// The conformance cases `cancel_*` check all of this for every plugin: workloads of a
/// thousand calls or more, half of them under timeouts or `select!` that drop them at random
/// points (a workload whose calls stay pending long enough to be dropped runs until 250 were),
/// over raw and enveloped pages and zero-copy and bounce pools; a deregistration racing I/O;
/// and a dropped read watched for late writes.
pub mod memory_contract {}

/// # Writing a plugin
///
/// A plugin is a [`StorageBackend`](crate::raw::StorageBackend) and the
/// [`PluginDescriptor`](crate::raw::PluginDescriptor) that selection knows it by. Everything
/// it needs is in [`raw`](crate::raw); engines never see it.
///
/// ## A static plugin in three steps
///
/// 1. **Implement the backend.** Give the plugin's name once, as a
///    [`PluginName`](crate::raw::PluginName) constant: errors come from it
///    (`.map_err(NAME.io_at("open", &path))`, `NAME.error(..)`, `NAME.unsupported(..)`), and
///    so do the region table and the descriptor's name. Keep registrations in a
///    [`RegionTable`](crate::raw::RegionTable): its `register`/`deregister` are the whole
///    methods for a plugin whose registration is bookkeeping, and its pins are how a
///    backend reaches memory without `unsafe`. Start from
///    [`Capability::default()`](crate::raw::Capability) (valid as it is) and set what the
///    backend does. Describe it with a descriptor whose probe proves it can work here.
/// 2. **Name the descriptor where the registry is built**:
///    `PluginRegistry::new(&[&acme::DESCRIPTOR])`, `hicache::registry_with(&config,
///    &[&acme::DESCRIPTOR])` or `hicache_cli::Commands::new().plugin(&acme::DESCRIPTOR)`.
///    This is the linking rule: the linker drops a library nothing references, and
///    [`register_plugin!`](crate::register_plugin) with it, so a plugin crate that is only
///    listed in `Cargo.toml` is not in the program at all. Naming it is the registration
///    that cannot be lost. When a config asks for a plugin the program lacks (`plugin =
///    "acme"`, or a `[plugin.acme]` section), selection says so with this fix: an error for
///    the former, a warning (logged by `open`, shown by `hicache plugins` and `doctor`) for
///    the latter.
/// 3. **Run the conformance suite** (`hicache-testkit`): a `[[test]]` with
///    `harness = false` holding
///    `hicache_testkit::conformance_suite!("ACME", |env| acme::open(env.dir()));`.
///
/// The whole of it, small enough to read at once (an in-memory store; a real one keeps
/// files or objects):
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
///
/// use hicache_core::raw::*;
/// use hicache_core::{ConfigLoader, MissReason, PluginRegistry, ReadOutcome, Result};
///
/// const NAME: PluginName = PluginName::new("ACME");
///
/// #[derive(Debug)]
/// struct Acme {
///     regions: RegionTable,
///     objects: Mutex<HashMap<String, Vec<u8>>>,
/// }
///
/// fn capability() -> Capability {
///     let mut c = Capability::default();
///     c.max_segments = 64;
///     c.atomic_publish = true; // a map insert is all or nothing
///     c
/// }
///
/// #[async_trait::async_trait]
/// impl StorageBackend for Acme {
///     fn info(&self) -> BackendInfo {
///         BackendInfo {
///             name: NAME.to_string(),
///             version: "1.0".into(),
///             kind: BackendKind::File,
///             capability: capability(),
///             location: "memory".into(),
///         }
///     }
///     fn register(&self, region: MemoryRegion) -> Result<RegionId> {
///         self.regions.register(region, &capability())
///     }
///     fn deregister(&self, id: RegionId) -> Result<()> {
///         self.regions.deregister(id)
///     }
///     async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
///         batch
///             .iter()
///             .map(|item| {
///                 capability().check_segments(item.key, item.segments.len())?;
///                 let bytes = self.regions.gather(item.segments)?;
///                 self.objects.lock().unwrap().insert(item.key.as_str().into(), bytes);
///                 Ok(())
///             })
///             .collect()
///     }
///     async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
///         batch
///             .iter()
///             .map(|item| {
///                 // Slices are checked before the object is looked up.
///                 capability().check_segments(item.key, item.segments.len())?;
///                 for s in item.segments {
///                     drop(self.regions.target(s)?);
///                 }
///                 let objects = self.objects.lock().unwrap();
///                 let Some(bytes) = objects.get(item.key.as_str()) else {
///                     return Ok(ReadOutcome::Miss(MissReason::NotFound));
///                 };
///                 if bytes.len() as u64 != item.len() {
///                     let found = bytes.len() as u64;
///                     let expected = item.len();
///                     return Ok(ReadOutcome::Miss(MissReason::SizeMismatch { expected, found }));
///                 }
///                 self.regions.scatter(item.segments, bytes)?;
///                 Ok(ReadOutcome::Hit)
///             })
///             .collect()
///     }
///     async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
///         let objects = self.objects.lock().unwrap();
///         keys.iter().map(|k| Ok(objects.contains_key(k.as_str()))).collect()
///     }
///     async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
///         let mut objects = self.objects.lock().unwrap();
///         keys.iter().map(|k| { objects.remove(k.as_str()); Ok(()) }).collect()
///     }
///     async fn usage(&self) -> Result<Usage> {
///         Ok(Usage::default()) // nothing known: the suite's usage case is skipped
///     }
/// }
///
/// fn probe(_: &PluginContext<'_>) -> Probe {
///     Probe::usable("memory is always there")
/// }
/// fn build(_: &PluginContext<'_>) -> Result<DynBackend> {
///     Ok(Arc::new(Acme {
///         regions: NAME.region_table(),
///         objects: Mutex::default(),
///     }))
/// }
///
/// pub static DESCRIPTOR: PluginDescriptor =
///     PluginDescriptor::new(NAME.as_str(), BackendKind::File, "ACME's store", probe, build)
///         .with_priority(50); // a third party: below the built-in plugins (100..=400)
///
/// // Step 2: named where the registry is built. `auto` tries it by its priority.
/// let registry = PluginRegistry::new(&[&DESCRIPTOR]).unwrap();
/// let config = ConfigLoader::new().set("plugin", "acme").load().unwrap();
/// let (backend, selection) = registry.open(&config).unwrap();
/// assert_eq!(selection.plugin.name, "ACME");
/// assert!(backend.info().capability.problems().is_empty());
/// ```
///
/// ## A dynamic plugin in three steps
///
/// 1. Write the backend as above, then export it from a `cdylib` crate with
///    `hicache_abi::export_plugin!(DESCRIPTOR)`; or, in C, define `hicache_plugin_v1` from
///    `hicache-abi/include/hicache_plugin.h`.
/// 2. Build the shared library.
/// 3. Put it in a dir named by `plugin_dirs` (or `HICACHE_PLUGIN_DIR`). It joins selection
///    like a built-in plugin; `hicache plugins` shows the file it came from, or why it was
///    not loaded. The host checks every slice and every completion, so a C plugin gets the
///    memory contract without writing it.
///
/// ## What each method must guarantee
///
/// The `# Behavior` section of [`StorageBackend`](crate::raw::StorageBackend) is the
/// contract, and the suite checks each line of it: one result per item in order, misses
/// kept apart from errors, slices checked before any I/O (also for a key that does not
/// exist), atomic publish when claimed, memory untouched once a dropped call's drop has
/// returned.
///
/// ## Reading the suite
///
/// Each case is one trial, `conformance::<case>` (or `conformance::<variant>::<case>`).
/// A case that does not apply says why instead of passing: `ignored (the backend does not
/// use direct I/O, so any alignment is valid)`, `ignored (the plugin reports no usage
/// figures)`. A skip is a statement about the plugin, to be read, not a failure to fix.
///
/// ## Priority
///
/// Within a kind, higher is tried first by `auto`: 3FS 400, POSIX 300, GDS_MT 200, GDS 100,
/// OBJ 100 ([`priority`](crate::raw::priority)). A third-party plugin declares less than 100,
/// so it is chosen by `auto` only when nothing built in is usable, and otherwise when the
/// config names it; above that only when users should prefer it wherever it works.
pub mod plugin_guide {}
