//! POSIX plugin parameters, typed and validated.

use std::path::PathBuf;

use hicache_core::Setting;
use hicache_core::raw::{ParamSpec, PluginContext};
use hicache_core::{Error, Result};

use crate::NAME;

hicache_core::plugin_params! {
    /// Parameters accepted in `[plugin.posix]` (or the flat form).
    pub struct PosixParams {
        engine: OneOf["auto", "uring", "threads"] = "engine"
            => "I/O engine: io_uring, a thread pool, or auto (probes io_uring, runs the thread pool: it measured faster; see the crate README)",
            default("auto");
        threads: UInt = "threads"
            => "I/O threads of the thread-pool engine",
            default("32 on block filesystems, one per CPU on tmpfs/ramfs");
        queue_depth: UInt = "queue_depth"
            => "io_uring submission queue entries, a power of two in 8..=4096 (objects in flight: depth / 5)",
            default("256");
        use_uring: Bool = "use_uring"
            => "NIXL compatibility: true means engine = uring (use_uring, use_aio and use_posix_aio exclude each other)";
        use_aio: Bool = "use_aio"
            => "NIXL compatibility: accepted; Linux AIO is served by the thread-pool engine";
        use_posix_aio: Bool = "use_posix_aio"
            => "NIXL compatibility: accepted; POSIX AIO is served by the thread-pool engine";
    }
}

hicache_core::plugin_params! {
    /// The file layer's parameters: POSIX takes them, and so does every plugin built on the
    /// layer with its own data path (GDS, GDS_MT).
    pub struct FileLayerParams {
        sync: OneOf["none", "data", "full"] = "sync"
            => "what a write flushes before it returns: none (survives a process kill), data (fdatasync the file before publishing it), full (data, then fsync the bucket dir after the rename: the new object survives power loss)",
            default("none");
        spare_bytes: UInt = "spare_bytes"
            => "bytes of replaced or removed object files kept per dir for reuse (0 turns recycling off; raw pages never recycle)",
            default("2 GiB with enveloped pages");
        file_mode: UInt = "file_mode"
            => "permission bits of page files (pages come from users' prompts; the umask still applies)",
            default("0o600");
        dir_mode: UInt = "dir_mode" => "permission bits of the dirs hicache creates",
            default("0o700");
    }
}

/// The file layer's parameters (see [`FileLayerParams`]).
pub const FILE_LAYER_PARAMS: &[ParamSpec] = FileLayerParams::SPECS;

const ALL: [ParamSpec; PosixParams::SPECS.len() + FILE_LAYER_PARAMS.len()] =
    hicache_core::raw::join_params(PosixParams::SPECS, FILE_LAYER_PARAMS);

/// Parameters accepted in `[plugin.posix]` (or the flat form): [`PosixParams`], then the
/// file layer's.
pub const PARAMS: &[ParamSpec] = &ALL;

/// Which engine runs I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineChoice {
    /// The engine that measured faster here: the thread pool (see the crate docs).
    Auto,
    /// io_uring; an error when the kernel refuses it.
    Uring,
    /// The portable thread pool.
    Threads,
}

/// What a write flushes to stable storage before it returns.
///
/// Every mode publishes by rename, so a killed process never leaves a partial object under
/// a key. What differs is power loss (or a kernel crash): with `None` recent writes may be
/// lost, and on some filesystems a renamed file may come back empty or short (the envelope
/// check turns that into a miss); `Data` makes the file's bytes durable before the rename, so
/// the key holds the old or the new object, but the rename itself may be lost; `Full` also
/// syncs the bucket dir, so once the call returns the new object survives power loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Nothing is flushed (the page cache or the device's queue holds the write).
    #[default]
    None,
    /// `fdatasync` the file before it is renamed into place.
    Data,
    /// `fdatasync` the file, rename, then `fsync` the bucket dir.
    Full,
}

/// The validated configuration of one POSIX backend.
#[derive(Clone, Debug)]
pub struct PosixConfig {
    /// Storage dirs, in routing order.
    pub dirs: Vec<PathBuf>,
    /// Open objects with O_DIRECT (falls back per dir where the filesystem refuses it).
    pub direct_io: bool,
    /// Engine.
    pub engine: EngineChoice,
    /// Thread-pool size (0: chosen by filesystem).
    pub threads: usize,
    /// io_uring queue depth.
    pub queue_depth: u32,
    /// What a write flushes before it returns.
    pub sync: SyncMode,
    /// Bytes of spare files kept per dir for reuse (0: recycling off).
    pub spare_bytes: u64,
    /// Permission bits of page files.
    pub file_mode: u32,
    /// Permission bits of dirs hicache creates.
    pub dir_mode: u32,
    /// The capacity cleaner's settings; `None` runs none (see the crate README).
    pub cleaner: Option<hicache_core::capacity::CleanerSettings>,
}

/// Default permission bits of page files: owner only.
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o600;
/// Default permission bits of dirs: owner only.
pub(crate) const DEFAULT_DIR_MODE: u32 = 0o700;

impl PosixConfig {
    /// Reads the plugin context. A plugin that declares only the file layer's parameters
    /// (and perhaps `threads`) gets the thread-pool engine with defaults for the rest.
    pub fn from_context(ctx: &PluginContext<'_>) -> Result<Self> {
        let p = PosixParams::from_params(ctx.params);
        let f = FileLayerParams::from_params(ctx.params);
        let value = |s: &Option<Setting<bool>>| s.as_ref().is_some_and(|s| s.value);
        let nixl_modes = [
            value(&p.use_uring),
            value(&p.use_aio),
            value(&p.use_posix_aio),
        ];
        if nixl_modes.iter().filter(|b| **b).count() > 1 {
            return Err(Error::invalid_config(
                "use_uring/use_aio/use_posix_aio",
                "plugin parameters",
                "these NIXL modes are mutually exclusive",
            ));
        }
        let engine = match p.engine.as_ref().map(|s| s.value.as_str()) {
            Some("uring") => EngineChoice::Uring,
            Some("threads") => EngineChoice::Threads,
            Some(_) => EngineChoice::Auto,
            None if nixl_modes[0] => EngineChoice::Uring,
            None if nixl_modes[1] || nixl_modes[2] => EngineChoice::Threads,
            None => EngineChoice::Auto,
        };
        let threads = match &p.threads {
            None => 0,
            Some(s) if (1..=1024).contains(&s.value) => s.value,
            Some(s) => {
                return Err(Error::invalid_config(
                    "threads",
                    s.source.to_string(),
                    format!("{} is outside 1..=1024", s.value),
                ));
            }
        };
        let queue_depth = match &p.queue_depth {
            None => 256,
            Some(s) if (8..=4096).contains(&s.value) && s.value.is_power_of_two() => s.value,
            Some(s) => {
                return Err(Error::invalid_config(
                    "queue_depth",
                    s.source.to_string(),
                    format!("{} is not a power of two in 8..=4096", s.value),
                ));
            }
        };
        let mode = |name: &str, given: &Option<Setting<u64>>, default: u32| -> Result<u32> {
            match given {
                None => Ok(default),
                Some(s) if s.value <= 0o777 && s.value & 0o600 == 0o600 => Ok(s.value as u32),
                Some(s) => Err(Error::invalid_config(
                    name,
                    s.source.to_string(),
                    format!(
                        "{:#o} is not permission bits that leave the owner read and write access (0o600..=0o777)",
                        s.value
                    ),
                )),
            }
        };
        let file_mode = mode("file_mode", &f.file_mode, DEFAULT_FILE_MODE)?;
        let dir_mode = mode("dir_mode", &f.dir_mode, DEFAULT_DIR_MODE)?;
        if dir_mode & 0o100 == 0 {
            return Err(Error::invalid_config(
                "dir_mode",
                source(&f.dir_mode),
                format!("{dir_mode:#o} leaves the owner no search (x) permission on its own dirs"),
            ));
        }
        let spare_bytes = match (&f.spare_bytes, ctx.config.page_format.value) {
            (Some(s), hicache_core::PageFormat::Envelope) => s.value,
            (Some(s), hicache_core::PageFormat::Raw) if s.value > 0 => {
                return Err(Error::invalid_config(
                    "spare_bytes",
                    s.source.to_string(),
                    "recycling files needs enveloped pages (page_format = \"envelope\"): a raw page read while its file is reused could not be told from a torn one",
                ));
            }
            (_, hicache_core::PageFormat::Raw) => 0,
            (None, hicache_core::PageFormat::Envelope) => 2 << 30,
        };
        Ok(PosixConfig {
            file_mode,
            dir_mode,
            dirs: ctx.config.storage_dirs.value.clone(),
            direct_io: ctx.config.use_direct_io.value,
            engine,
            threads: threads as usize,
            queue_depth: queue_depth as u32,
            sync: match f.sync.as_ref().map(|s| s.value.as_str()) {
                Some("data") => SyncMode::Data,
                Some("full") => SyncMode::Full,
                _ => SyncMode::None,
            },
            spare_bytes,
            cleaner: ctx.config.cleaner(),
        })
    }
}

/// Where a parameter came from, or the plugin's name when it was not given.
fn source<T>(given: &Option<Setting<T>>) -> String {
    given
        .as_ref()
        .map(|s| s.source.to_string())
        .unwrap_or_else(|| NAME.into())
}
