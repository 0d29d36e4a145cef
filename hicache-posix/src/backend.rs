//! The POSIX backend: routing, registrations, alignment checks, and the engine.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use hicache_core::raw::routing::{self, bucket_name};
use hicache_core::raw::{
    BackendInfo, BackendKind, Capability, ListCursor, ListPage, ObjectKey, ReadCheck, ReadItem,
    RegionId, RegionTable, Slice, StorageBackend, Usage, WriteItem, WriteSeal,
};
use hicache_core::{Error, MemKind, MemoryRegion, ReadOutcome, RegionPath, Result};

use crate::NAME;
use crate::config::{EngineChoice, PosixConfig};
use crate::data_path::DataPath;
use crate::fsinfo::{self, FsInfo};
use crate::known::{self, KnownNames, Seen};
use crate::plan::{Held, OpKind, Outcome, Plan};
use crate::probe::DirProbe;
use crate::root::Root;
use crate::threads::ThreadEngine;
use crate::uring::UringEngine;

/// Most iovecs per object (Linux IOV_MAX).
const MAX_SEGMENTS: u32 = 1024;

/// Flushes a backend completed (see [`PosixBackend::flushes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushes {
    /// `fdatasync` of page files before they were published (`sync = data` or `full`).
    pub files: u64,
    /// `fsync` of bucket dirs after a rename (`sync = full`).
    pub dirs: u64,
}

/// What the backend found out about one storage dir.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RootInfo {
    /// The dir.
    pub path: PathBuf,
    /// Its filesystem.
    pub fs: FsInfo,
    /// Whether objects there are opened with O_DIRECT.
    pub direct: bool,
    /// Why direct I/O is off there although it was asked for, if so.
    pub direct_fallback: Option<String>,
}

#[derive(Debug)]
enum Engine {
    Threads(ThreadEngine),
    Uring(UringEngine),
}

impl Engine {
    async fn run(&self, plan: Arc<Plan>) {
        match self {
            Engine::Threads(t) => t.run(plan).await,
            Engine::Uring(u) => u.run(plan).await,
        }
    }

    fn describe(&self) -> String {
        match self {
            Engine::Threads(t) => match t.path() {
                Some(path) => format!("threads ({}) over {}", t.threads(), path.describe()),
                None => format!("threads ({})", t.threads()),
            },
            Engine::Uring(u) => format!("io_uring (queue depth {})", u.queue_depth()),
        }
    }
}

/// O_DIRECT files under one or more storage dirs.
#[derive(Debug)]
pub struct PosixBackend {
    /// The plugin this backend serves (POSIX, or one that plugs in its own data path).
    name: &'static str,
    regions: RegionTable,
    roots: Arc<[Root]>,
    root_info: Vec<RootInfo>,
    engine: Engine,
    alignment: u64,
    direct_io: bool,
    sync: crate::config::SyncMode,
    /// Names known to be published, per watched bucket dir (None: inotify unavailable).
    known: Option<KnownNames>,
    /// Per root: whether its filesystem lets the index answer `exists` ([`known::watchable`]).
    indexed: Vec<bool>,
    /// Keys `exists` answered from the index so far.
    from_index: std::sync::atomic::AtomicU64,
    /// Reads recorded for the cleaner (None: no cleaner).
    uses: Option<Arc<crate::uses::UseLog>>,
    /// The capacity cleaner's thread; dropping the backend stops it.
    cleaner: Option<crate::cleaner::Cleaner>,
}

impl PosixBackend {
    /// Creates the dirs and their 256 bucket dirs, checks O_DIRECT per dir, starts the engine.
    pub fn new(cfg: &PosixConfig) -> Result<Self> {
        Self::open(cfg, &[])
    }

    /// As [`new`](Self::new), taking each dir's filesystem and O_DIRECT verdict from the
    /// probe where it examined that dir (`probed` in routing order), so nothing is tested
    /// twice.
    pub(crate) fn open(cfg: &PosixConfig, probed: &[Option<DirProbe>]) -> Result<Self> {
        Self::build(NAME, cfg, probed, None)
    }

    /// A backend of plugin `name` over the same file layer, whose objects' bytes move
    /// through `path` (see [`crate::data_path`]) on the thread pool; `cfg.engine` must not
    /// ask for io_uring. Memory kinds the path accepts can be registered; errors name
    /// `name`.
    pub fn with_data_path(
        name: &'static str,
        cfg: &PosixConfig,
        path: Arc<dyn DataPath>,
    ) -> Result<Self> {
        if cfg.engine == EngineChoice::Uring {
            return Err(Error::invalid_config(
                "engine",
                name,
                format!("{name} moves bytes with {}, not io_uring", path.describe()),
            ));
        }
        Self::build(name, cfg, &[], Some(path))
    }

    fn build(
        name: &'static str,
        cfg: &PosixConfig,
        probed: &[Option<DirProbe>],
        path: Option<Arc<dyn DataPath>>,
    ) -> Result<Self> {
        if cfg.dirs.is_empty() {
            return Err(Error::invalid_config(
                "storage_dir",
                name,
                "no storage dir given",
            ));
        }
        let mut roots = Vec::with_capacity(cfg.dirs.len());
        let mut root_info = Vec::with_capacity(cfg.dirs.len());
        for (i, dir) in cfg.dirs.iter().enumerate() {
            let root_dir = prepare_dir(name, dir, cfg.dir_mode)?;
            let known = probed
                .get(i)
                .and_then(Option::as_ref)
                .filter(|p| p.path == *dir);
            let fs = match known {
                Some(p) => p.fs.clone(),
                None => fsinfo::fs_info(dir)
                    .map_err(|e| Error::io(name, "statfs", Some(dir.clone()), e))?,
            };
            // Why O_DIRECT cannot be used in this dir, if it cannot; the probe's answer
            // where it examined the dir, a test of our own otherwise.
            let refused = match (cfg.direct_io, known.and_then(|p| p.direct_io)) {
                (false, _) => None,
                (true, Some(true)) => None,
                (true, Some(false)) => Some(
                    known
                        .and_then(|p| p.direct_io_error.clone())
                        .unwrap_or_else(|| "refused by the filesystem".into()),
                ),
                (true, None) => direct_io_supported(&root_dir).err().map(|e| e.to_string()),
            };
            let (direct, fallback) = match refused {
                None => (cfg.direct_io, None),
                Some(e) => {
                    let why = format!(
                        "O_DIRECT refused on {} ({}): {e}",
                        dir.display(),
                        fs.fs_type
                    );
                    tracing::warn!(
                        root = %dir.display(),
                        fs = %fs.fs_type,
                        error = %e,
                        "O_DIRECT is refused here; falling back to buffered I/O for this dir"
                    );
                    (false, Some(why))
                }
            };
            let spares = if cfg.spare_bytes > 0 {
                Some(
                    crate::spare::SparePool::new(&root_dir, cfg.spare_bytes, cfg.dir_mode)
                        .map_err(|e| {
                            dir_error(
                                name,
                                "create spare dir",
                                dir.join(crate::spare::SPARE_DIR),
                                e,
                            )
                        })?,
                )
            } else {
                None
            };
            roots.push(Root {
                dir: root_dir,
                direct,
                spares,
                file_mode: cfg.file_mode,
                flushed: Default::default(),
            });
            root_info.push(RootInfo {
                path: dir.clone(),
                fs,
                direct,
                direct_fallback: fallback,
            });
        }
        let direct_io = root_info.iter().any(|r| r.direct);
        let alignment = root_info
            .iter()
            .filter(|r| r.direct)
            .map(|r| r.fs.io_alignment())
            .max()
            .unwrap_or(1);
        let roots: Arc<[Root]> = roots.into();
        let engine = match cfg.engine {
            EngineChoice::Threads | EngineChoice::Auto => Engine::Threads(start_threads(
                name, cfg, &roots, &root_info, alignment, path,
            )?),
            EngineChoice::Uring => Engine::Uring(
                UringEngine::new(cfg.queue_depth, roots.clone(), alignment)
                    .map_err(|e| Error::io(NAME, "io_uring setup", None, e))?,
            ),
        };
        let uses = cfg.cleaner.map(|_| Arc::new(crate::uses::UseLog::new()));
        let cleaner = match (cfg.cleaner, &uses) {
            (Some(settings), Some(uses)) => Some(
                crate::cleaner::Cleaner::start(
                    name,
                    roots.clone(),
                    root_info.iter().map(|r| r.path.clone()).collect(),
                    settings,
                    uses.clone(),
                )
                .map_err(|e| Error::io(name, "spawn the cleaner thread", None, e))?,
            ),
            _ => None,
        };
        Ok(PosixBackend {
            uses,
            cleaner,
            name,
            regions: RegionTable::new(name),
            roots,
            engine,
            alignment,
            direct_io,
            sync: cfg.sync,
            indexed: root_info
                .iter()
                .map(|r| known::watchable(&r.fs.fs_type))
                .collect(),
            known: KnownNames::new(),
            from_index: Default::default(),
            root_info,
        })
    }

    /// The data path plugged in with [`with_data_path`](Self::with_data_path), if any.
    fn path(&self) -> Option<&dyn DataPath> {
        match &self.engine {
            Engine::Threads(t) => t.path(),
            Engine::Uring(_) => None,
        }
    }

    /// Whether memory of `kind` can be registered: host memory, or what the data path moves.
    fn accepts(&self, kind: MemKind) -> bool {
        match self.path() {
            Some(p) => p.accepts(kind),
            None => kind == MemKind::Host,
        }
    }

    /// Facts about each storage dir.
    pub fn roots(&self) -> &[RootInfo] {
        &self.root_info
    }

    /// The engine in use, for humans.
    pub fn engine_description(&self) -> String {
        self.engine.describe()
    }

    /// Keys `exists` answered from its index of names known to be published, without a
    /// `stat`, so far. The index is kept only for local filesystems (ext4, xfs, btrfs,
    /// tmpfs, ramfs), where inotify reports every change whoever makes it.
    pub fn exists_from_index(&self) -> u64 {
        self.from_index.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The capacity cleaner's view of each storage dir: whether this backend holds the dir's
    /// cleaner, and its last pass there. `None` when the cleaner is off.
    pub fn cleaner(&self) -> Option<Vec<crate::cleaner::CleanerDir>> {
        self.cleaner.as_ref().map(|c| c.dirs())
    }

    /// Counts a write batch's bytes for the cleaner (which a fast writer wakes early).
    fn note_writes(&self, batch: &[WriteItem<'_>]) {
        if let Some(cleaner) = &self.cleaner {
            let bytes = batch
                .iter()
                .flat_map(|i| i.segments.iter())
                .map(|s| s.len)
                .sum();
            cleaner.note_written(bytes);
        }
    }

    /// Records reads for the cleaner before they start, so that it passes over their
    /// objects until the returned guard is dropped (when the reads have ended, or their
    /// future was dropped and the reads in the kernel have ended).
    fn note_reads<'a>(&'a self, batch: &'a [ReadItem<'a>]) -> Option<Reading<'a>> {
        let uses = self.uses.as_deref()?;
        uses.record(batch.iter().map(|i| (self.route(i.key).0, i.key)));
        Some(Reading { uses, batch })
    }

    /// Transfers the io_uring engine ran on registered (fixed) buffers so far.
    pub fn fixed_buffer_transfers(&self) -> u64 {
        match &self.engine {
            Engine::Uring(u) => u.fixed_transfers(),
            Engine::Threads(_) => 0,
        }
    }

    /// Flushes that returned success so far, over all storage dirs: what `sync` made the
    /// kernel do (the threads engine's calls and the io_uring engine's `FSYNC` steps alike).
    pub fn flushes(&self) -> Flushes {
        let (files, dirs) = self
            .roots
            .iter()
            .map(|r| r.flushed.get())
            .fold((0, 0), |(f, d), (rf, rd)| (f + rf, d + rd));
        Flushes { files, dirs }
    }

    /// The file an object is stored in.
    pub fn object_path(&self, key: &ObjectKey) -> PathBuf {
        let route = routing::route(key, self.roots.len()).expect("at least one root");
        let bucket = bucket_name(route.bucket);
        self.root_info[route.dir]
            .path
            .join(std::str::from_utf8(&bucket).expect("hex"))
            .join(key.as_str())
    }

    fn route(&self, key: &ObjectKey) -> (usize, [u8; 2]) {
        let r = routing::route(key, self.roots.len()).expect("at least one root");
        (r.dir, bucket_name(r.bucket))
    }

    /// Pins and checks each segment (for reading when writing an object, for writing when
    /// reading one); pushes its iovec into `iov` and its pin into `pins`.
    fn pin_segments(
        &self,
        kind: OpKind,
        key: &ObjectKey,
        segments: &[Slice],
        align: u64,
        iov: &mut Vec<libc::iovec>,
        pins: &mut Vec<Held>,
    ) -> Result<()> {
        if segments.len() > MAX_SEGMENTS as usize {
            return Err(Error::InvalidBatch {
                reason: format!(
                    "object {key} has {} segments; at most {MAX_SEGMENTS} are allowed",
                    segments.len()
                ),
            });
        }
        for (i, s) in segments.iter().enumerate() {
            let (held, v) = match kind {
                OpKind::Write => {
                    let p = self.regions.source(s)?;
                    let v = p.iovec();
                    (Held::Source(p), v)
                }
                _ => {
                    let p = self.regions.target(s)?;
                    let v = p.iovec();
                    (Held::Target(p), v)
                }
            };
            let (addr, len) = (v.iov_base as u64, v.iov_len as u64);
            if align > 1 && (addr % align != 0 || len % align != 0) {
                return Err(Error::Misaligned {
                    component: self.name.into(),
                    what: format!(
                        "segment {i} of object {key} (region {}, offset {})",
                        s.region, s.offset
                    ),
                    align,
                    addr,
                    len,
                });
            }
            iov.push(v);
            pins.push(held);
        }
        Ok(())
    }

    fn transfer_plan(&self, kind: OpKind, items: &[(&ObjectKey, &[Slice])]) -> Plan {
        let mut plan = Plan::new(self.name, kind, self.sync, items.len());
        let mut iov = Vec::with_capacity(4);
        let mut pins = Vec::with_capacity(4);
        for (key, segments) in items {
            iov.clear();
            let route = self.route(key);
            let align = if self.roots[route.0].direct {
                self.alignment
            } else {
                1
            };
            match self.pin_segments(kind, key, segments, align, &mut iov, &mut pins) {
                Ok(()) => {
                    let single = (segments.len() == 1).then(|| segments[0].region.0);
                    plan.push(key.as_str(), route, &iov, single);
                    for p in pins.drain(..) {
                        plan.hold(p);
                    }
                }
                Err(e) => {
                    // An item that fails keeps no pin: its memory is not touched.
                    pins.clear();
                    plan.push_failed(e);
                }
            }
        }
        plan
    }

    fn key_plan(&self, kind: OpKind, keys: &[ObjectKey]) -> Plan {
        let mut plan = Plan::new(self.name, kind, self.sync, keys.len());
        for key in keys {
            plan.push(key.as_str(), self.route(key), &[], None);
        }
        plan
    }
}

/// Reads the cleaner passes over until this is dropped.
struct Reading<'a> {
    uses: &'a crate::uses::UseLog,
    batch: &'a [ReadItem<'a>],
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.uses.end(self.batch.iter().map(|i| i.key));
    }
}

/// Takes every item's result out of a finished plan.
fn collect<T>(plan: &Plan, pick: impl Fn(Outcome) -> Option<T>) -> Vec<Result<T>> {
    (0..plan.len())
        .map(|i| match plan.take(i) {
            Some(Ok(outcome)) => pick(outcome).ok_or_else(|| {
                Error::backend(plan.plugin, "engine returned the wrong kind of result")
            }),
            Some(Err(e)) => Err(e),
            None => Err(Error::backend(
                plan.plugin,
                "the I/O engine stopped before this item ran",
            )),
        })
        .collect()
}

/// Memory filesystems are CPU-bound: one thread per CPU avoids context switches. Block
/// filesystems need queue depth: each blocking transfer keeps one request at the device, so
/// the thread pool's own `preadv`/`pwritev` gets 32 threads, the depth of the raw loop it is
/// measured against (64 KiB O_DIRECT reads on ext4 measured about 10 % faster than with 16).
/// A plugged-in data path (GDS, 3FS) keeps 16, the count it was measured with.
fn default_threads(roots: &[RootInfo], data_path: bool) -> usize {
    let memory = roots
        .iter()
        .all(|r| matches!(r.fs.fs_type.as_str(), "tmpfs" | "ramfs"));
    if memory {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    } else if data_path {
        16
    } else {
        32
    }
}

fn start_threads(
    name: &'static str,
    cfg: &PosixConfig,
    roots: &Arc<[Root]>,
    info: &[RootInfo],
    align: u64,
    path: Option<Arc<dyn DataPath>>,
) -> Result<ThreadEngine> {
    let threads = if cfg.threads == 0 {
        default_threads(info, path.is_some())
    } else {
        cfg.threads
    };
    ThreadEngine::new(threads, roots.clone(), align, path)
        .map_err(|e| Error::io(name, "spawn I/O threads", None, e))
}

/// A failed dir operation as the core error: a link met under the root is
/// [`Error::UnsafePath`].
fn dir_error(plugin: &'static str, op: &'static str, path: PathBuf, e: std::io::Error) -> Error {
    crate::plan::to_error(plugin, crate::root::IoFailure { op, path, error: e })
}

/// Creates a storage dir and its 256 bucket dirs (`00`..`ff`) with `mode`, and opens it. The
/// configured path may itself be a link; nothing beneath it may be.
fn prepare_dir(plugin: &'static str, dir: &Path, mode: u32) -> Result<crate::beneath::RootDir> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| Error::io(plugin, "create storage dir", Some(dir.to_path_buf()), e))?;
    let root = crate::beneath::RootDir::open(dir, mode)
        .map_err(|e| Error::io(plugin, "open storage dir", Some(dir.to_path_buf()), e))?;
    for b in 0..=255u8 {
        let name = bucket_name(b);
        root.bucket(name).map_err(|e| {
            dir_error(
                plugin,
                "create bucket dir",
                dir.join(std::str::from_utf8(&name).expect("hex")),
                e,
            )
        })?;
    }
    Ok(root)
}

/// Whether the filesystem of `dir` accepts O_DIRECT opens (with a probe file of an
/// unpredictable name, created exclusively, never through a link).
fn direct_io_supported(dir: &crate::beneath::RootDir) -> std::io::Result<()> {
    let name = crate::name::Name::temp();
    let fd = crate::beneath::open(
        dir.fd(),
        name.as_cstr(),
        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_DIRECT,
        0o600,
    )?;
    drop(fd);
    let _ = crate::beneath::unlink(dir.fd(), name.as_cstr());
    Ok(())
}

#[async_trait]
impl StorageBackend for PosixBackend {
    fn info(&self) -> BackendInfo {
        let mut capability = Capability::default();
        capability.direct_io = self.direct_io;
        capability.io_alignment = self.alignment;
        capability.host_memory = self.accepts(MemKind::Host);
        capability.device_memory = self.accepts(MemKind::Device { device: 0 });
        capability.gpu_direct = self.path().is_some_and(|p| p.gpu_direct());
        capability.atomic_publish = true;
        capability.max_segments = MAX_SEGMENTS;
        capability.persistent = true;
        BackendInfo {
            name: self.name.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: BackendKind::File,
            capability,
            location: self
                .root_info
                .iter()
                .map(|r| r.path.display().to_string())
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        if !self.accepts(region.kind()) {
            let hint = match self.path() {
                None => format!("{NAME} moves host memory; use the GDS plugin for GPU memory"),
                Some(p) => format!("{} moves memory with {}", self.name, p.describe()),
            };
            return Err(Error::Unsupported {
                component: self.name.into(),
                operation: format!("registering {} memory ({hint})", region.kind()),
            });
        }
        if let Some(path) = self.path() {
            path.register(&region)?;
        }
        let (addr, len) = (region.addr(), region.len());
        let id = self.regions.insert(region);
        if let Engine::Uring(u) = &self.engine {
            u.register_buffer(id.0, addr, len);
        }
        Ok(id)
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        // Refused with RegionBusy while a plan pins the region, so the ring never loses a
        // fixed buffer that a chain in flight uses.
        let region = self.regions.remove(id)?;
        if let Engine::Uring(u) = &self.engine {
            // The ring must let go of the buffer before the memory can be released.
            u.unregister_buffer(id.0);
        }
        if let Some(path) = self.path() {
            path.deregister(&region)?;
        }
        drop(region);
        Ok(())
    }

    fn region_path(&self, id: RegionId) -> RegionPath {
        let Some(region) = self.regions.get(id) else {
            return RegionPath::Unstated;
        };
        match (&self.engine, self.path()) {
            (_, Some(path)) => path.region_path(&region),
            (Engine::Threads(_), None) => RegionPath::in_place("preadv/pwritev"),
            (Engine::Uring(_), None) => RegionPath::in_place("io_uring on registered buffers"),
        }
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        self.note_writes(batch);
        let items: Vec<(&ObjectKey, &[Slice])> =
            batch.iter().map(|i| (i.key, i.segments)).collect();
        let plan = Arc::new(self.transfer_plan(OpKind::Write, &items));
        self.engine.run(plan.clone()).await;
        collect(&plan, |o| match o {
            Outcome::Done => Some(()),
            _ => None,
        })
    }

    async fn write_sealed(
        &self,
        batch: &[WriteItem<'_>],
        seal: &WriteSeal<'_>,
    ) -> Option<Vec<Result<()>>> {
        // The thread pool's own `pwritev` from host memory only, as for `read_checked`: a
        // data path may write from memory the host cannot read (GPU memory), and io_uring
        // would seal on its one driver thread.
        match &self.engine {
            Engine::Threads(t) if t.path().is_none() => {}
            _ => return None,
        }
        self.note_writes(batch);
        let items: Vec<(&ObjectKey, &[Slice])> =
            batch.iter().map(|i| (i.key, i.segments)).collect();
        let mut plan = self.transfer_plan(OpKind::Write, &items);
        // SAFETY: as in `read_checked`: `seal` outlives this call, and the plan's run ends
        // before the call does.
        unsafe { plan.seal_writes(seal) };
        let plan = Arc::new(plan);
        self.engine.run(plan.clone()).await;
        Some(collect(&plan, |o| match o {
            Outcome::Done => Some(()),
            _ => None,
        }))
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        let _reading = self.note_reads(batch);
        let items: Vec<(&ObjectKey, &[Slice])> =
            batch.iter().map(|i| (i.key, i.segments)).collect();
        let plan = Arc::new(self.transfer_plan(OpKind::Read, &items));
        self.engine.run(plan.clone()).await;
        collect(&plan, |o| match o {
            Outcome::Read(r) => Some(r),
            _ => None,
        })
    }

    async fn read_checked(
        &self,
        batch: &[ReadItem<'_>],
        check: &ReadCheck<'_>,
    ) -> Option<Vec<Result<ReadOutcome>>> {
        // The thread pool's own `preadv` into host memory only: a data path may move bytes
        // where the host cannot look (GPU memory), and io_uring completes reads on one
        // driver thread, where checks would queue.
        match &self.engine {
            Engine::Threads(t) if t.path().is_none() => {}
            _ => return None,
        }
        let _reading = self.note_reads(batch);
        let items: Vec<(&ObjectKey, &[Slice])> =
            batch.iter().map(|i| (i.key, i.segments)).collect();
        let mut plan = self.transfer_plan(OpKind::Read, &items);
        // SAFETY: `check` outlives this call, and the plan's run ends before the call does:
        // `run` completes when every item has ended, and dropping it waits for the items
        // running and skips the rest.
        unsafe { plan.check_reads(check) };
        let plan = Arc::new(plan);
        self.engine.run(plan.clone()).await;
        Some(collect(&plan, |o| match o {
            Outcome::Read(r) => Some(r),
            _ => None,
        }))
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        let Some(known) = self.known.as_ref().filter(|_| self.indexed.contains(&true)) else {
            let plan = Arc::new(self.key_plan(OpKind::Exists, keys));
            self.engine.run(plan.clone()).await;
            return collect(&plan, |o| match o {
                Outcome::Exists(b) => Some(b),
                _ => None,
            });
        };
        // Names the index knows are answered now (see `crate::known`); the rest are stat'ed,
        // and those found are added for the next call.
        known.refresh();
        let mut answers: Vec<Option<Result<bool>>> = Vec::with_capacity(keys.len());
        let mut asked = Vec::new();
        let mut plan = Plan::new(self.name, OpKind::Exists, self.sync, keys.len());
        for (i, key) in keys.iter().enumerate() {
            let (root, bucket) = self.route(key);
            let name = key.as_str().as_bytes();
            if self.indexed[root] && known.contains((root, bucket), name) {
                self.from_index
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                answers.push(Some(Ok(true)));
                continue;
            }
            answers.push(None);
            // A watched bucket costs no syscall here (a key that is not stored is asked
            // again and again): whether the watch still follows the bucket's handle is
            // checked after the stat, before anything found is recorded.
            let seen = match known.seen((root, bucket)) {
                seen if seen.is_watched() || !self.indexed[root] => seen,
                _ => match self.roots[root].dir.bucket(bucket) {
                    Ok(dir) => {
                        known.watch((root, bucket), dir.as_fd());
                        known.seen((root, bucket))
                    }
                    Err(_) => Seen::NONE,
                },
            };
            asked.push((i, (root, bucket), seen));
            plan.push(key.as_str(), (root, bucket), &[], None);
        }
        if !asked.is_empty() {
            let plan = Arc::new(plan);
            self.engine.run(plan.clone()).await;
            let found = collect(&plan, |o| match o {
                Outcome::Exists(b) => Some(b),
                _ => None,
            });
            for ((i, (root, bucket), seen), result) in asked.into_iter().zip(found) {
                // The stat may have recreated the bucket dir: the watch must follow it
                // before anything found there is recorded (see `KnownNames::watch`).
                if matches!(result, Ok(true))
                    && let Ok(dir) = self.roots[root].dir.bucket(bucket)
                {
                    known.watch((root, bucket), dir.as_fd());
                    known.insert((root, bucket), seen, keys[i].as_str().as_bytes());
                }
                answers[i] = Some(result);
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| Err(Error::backend(self.name, "exists: a key got no answer")))
            })
            .collect()
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        let plan = Arc::new(self.key_plan(OpKind::Remove, keys));
        self.engine.run(plan.clone()).await;
        collect(&plan, |o| match o {
            Outcome::Done => Some(()),
            _ => None,
        })
    }

    /// Walks the bucket dirs on the calling thread (a tool's operation, not a hot path:
    /// one page reads at most the bucket dirs up to its last object).
    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        crate::listing::list(&self.roots, prefix, cursor, limit)
    }

    async fn usage(&self) -> Result<Usage> {
        let mut total = 0u64;
        let mut free = 0u64;
        for r in &self.root_info {
            let (f, t) = fsinfo::space(&r.path)
                .map_err(|e| Error::io(self.name, "statvfs", Some(r.path.clone()), e))?;
            total += t;
            free += f;
        }
        Ok(Usage {
            total_bytes: Some(total),
            used_bytes: Some(total.saturating_sub(free)),
            available_bytes: Some(free),
        })
    }
}
