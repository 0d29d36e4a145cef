//! POSIX plugin parameters, typed and validated.

use std::path::PathBuf;

use hicache_core::{Error, ParamKind, ParamSpec, PluginContext, Result};

use crate::NAME;

/// Parameters accepted in `[plugin.posix]` (or the flat form).
pub const PARAMS: &[ParamSpec] = &[
    ParamSpec::new(
        "engine",
        ParamKind::OneOf(&["auto", "uring", "threads"]),
        "I/O engine: io_uring, a thread pool, or auto (io_uring when the kernel allows it)",
    ),
    ParamSpec::new(
        "threads",
        ParamKind::UInt,
        "I/O threads of the thread-pool engine (default: 16 on block filesystems, one per CPU on tmpfs/ramfs)",
    ),
    ParamSpec::new(
        "queue_depth",
        ParamKind::UInt,
        "io_uring submission queue entries (default 256)",
    ),
    ParamSpec::new(
        "sync",
        ParamKind::OneOf(&["none", "data", "full"]),
        "what a write flushes before it returns: none (survives a process kill; default), data (fdatasync the file before publishing it), full (data, then fsync the bucket dir after the rename: the new object survives power loss)",
    ),
    ParamSpec::new(
        "spare_bytes",
        ParamKind::UInt,
        "bytes of replaced or removed object files kept per dir for reuse (default 2 GiB with enveloped pages; 0 turns recycling off; raw pages never recycle)",
    ),
    ParamSpec::new(
        "file_mode",
        ParamKind::UInt,
        "permission bits of page files (default 0o600: pages come from users' prompts; the umask still applies)",
    ),
    ParamSpec::new(
        "dir_mode",
        ParamKind::UInt,
        "permission bits of the dirs hicache creates (default 0o700)",
    ),
    ParamSpec::new(
        "use_uring",
        ParamKind::Bool,
        "NIXL compatibility: true means engine = uring",
    ),
    ParamSpec::new(
        "use_aio",
        ParamKind::Bool,
        "NIXL compatibility: accepted; Linux AIO is served by the thread-pool engine",
    ),
    ParamSpec::new(
        "use_posix_aio",
        ParamKind::Bool,
        "NIXL compatibility: accepted; POSIX AIO is served by the thread-pool engine",
    ),
];

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
}

/// Default permission bits of page files: owner only.
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o600;
/// Default permission bits of dirs: owner only.
pub(crate) const DEFAULT_DIR_MODE: u32 = 0o700;

impl PosixConfig {
    /// Reads the plugin context.
    pub fn from_context(ctx: &PluginContext<'_>) -> Result<Self> {
        let p = ctx.params;
        let mut engine = match p.str("engine") {
            Some("uring") => EngineChoice::Uring,
            Some("threads") => EngineChoice::Threads,
            _ => EngineChoice::Auto,
        };
        let nixl_modes = [
            p.bool("use_uring").unwrap_or(false),
            p.bool("use_aio").unwrap_or(false),
            p.bool("use_posix_aio").unwrap_or(false),
        ];
        if nixl_modes.iter().filter(|b| **b).count() > 1 {
            return Err(Error::invalid_config(
                "use_uring/use_aio/use_posix_aio",
                "plugin parameters",
                "these NIXL modes are mutually exclusive",
            ));
        }
        if p.str("engine").is_none() {
            if nixl_modes[0] {
                engine = EngineChoice::Uring;
            } else if nixl_modes[1] || nixl_modes[2] {
                engine = EngineChoice::Threads;
            }
        }
        let threads = p.uint("threads").unwrap_or(0);
        if threads > 1024 || (threads == 0 && p.uint("threads").is_some()) {
            return Err(Error::invalid_config(
                "threads",
                source(ctx, "threads"),
                format!("{threads} is outside 1..=1024"),
            ));
        }
        let queue_depth = p.uint("queue_depth").unwrap_or(256);
        if !(8..=4096).contains(&queue_depth) || !queue_depth.is_power_of_two() {
            return Err(Error::invalid_config(
                "queue_depth",
                source(ctx, "queue_depth"),
                format!("{queue_depth} is not a power of two in 8..=4096"),
            ));
        }
        let mode = |name: &str, default: u32| -> Result<u32> {
            match p.uint(name) {
                None => Ok(default),
                Some(m) if m <= 0o777 && m & 0o600 == 0o600 => Ok(m as u32),
                Some(m) => Err(Error::invalid_config(
                    name,
                    source(ctx, name),
                    format!(
                        "{m:#o} is not permission bits that leave the owner read and write access (0o600..=0o777)"
                    ),
                )),
            }
        };
        let file_mode = mode("file_mode", DEFAULT_FILE_MODE)?;
        let dir_mode = mode("dir_mode", DEFAULT_DIR_MODE)?;
        if dir_mode & 0o100 == 0 {
            return Err(Error::invalid_config(
                "dir_mode",
                source(ctx, "dir_mode"),
                format!("{dir_mode:#o} leaves the owner no search (x) permission on its own dirs"),
            ));
        }
        Ok(PosixConfig {
            file_mode,
            dir_mode,
            dirs: ctx.config.storage_dirs.value.clone(),
            direct_io: ctx.config.use_direct_io.value,
            engine,
            threads: threads as usize,
            queue_depth: queue_depth as u32,
            sync: match p.str("sync") {
                Some("data") => SyncMode::Data,
                Some("full") => SyncMode::Full,
                _ => SyncMode::None,
            },
            spare_bytes: match (p.uint("spare_bytes"), ctx.config.page_format.value) {
                (Some(n), hicache_core::PageFormat::Envelope) => n,
                (Some(n), hicache_core::PageFormat::Raw) if n > 0 => {
                    return Err(Error::invalid_config(
                        "spare_bytes",
                        source(ctx, "spare_bytes"),
                        "recycling files needs enveloped pages (page_format = \"envelope\"): a raw page read while its file is reused could not be told from a torn one",
                    ));
                }
                (_, hicache_core::PageFormat::Raw) => 0,
                (None, hicache_core::PageFormat::Envelope) => 2 << 30,
            },
        })
    }
}

fn source(ctx: &PluginContext<'_>, name: &str) -> String {
    ctx.params
        .source(name)
        .map(ToString::to_string)
        .unwrap_or_else(|| NAME.into())
}
