//! The `3FS` plugin: the POSIX file layer with USRBIO as its data path ([`crate::path`]).

use std::path::PathBuf;
use std::sync::Arc;

use hicache_core::raw::{
    BackendKind, DynBackend, ParamSpec, PluginContext, PluginDescriptor, Probe, join_params,
    priority,
};
use hicache_core::{Error, Result};
use hicache_posix::{FILE_LAYER_PARAMS, PosixBackend, PosixConfig};

use crate::error::UsrbioError;
use crate::path::{LaneShape, UsrbioPath};
use crate::usrbio::Usrbio;

/// The plugin's name.
pub const NAME: &str = "3FS";

hicache_core::plugin_params! {
    /// Parameters in `[plugin.3fs]` besides the file layer's.
    pub struct ThreeFsParams {
        usrbio_path: Str = "usrbio_path"
            => "3FS's USRBIO client library to load",
            default("libhf3fs_api_shared.so from the dynamic loader's search path");
        threads: UInt = "threads"
            => "worker threads; each uses one lane (an iov and a ring of each direction) at a time",
            default("16 on block filesystems, one per CPU on tmpfs/ramfs");
        iov_bytes: UInt = "iov_bytes"
            => "bytes of each lane's iov (shared memory the FUSE process maps), a multiple of 4096 from 64 KiB to 1 GiB; larger objects move in several windows",
            default("16 MiB");
        ring_entries: UInt = "ring_entries"
            => "slots of each ring, 1..=4096",
            default("64");
        io_batch: UInt = "io_batch"
            => "I/Os the FUSE process may gather into one batch (3FS's io_depth = -io_batch), 0..=ring_entries; 0 issues each at once",
            default("0");
        io_batch_timeout_ms: UInt = "io_batch_timeout_ms"
            => "milliseconds the FUSE process waits for a batch to fill (3FS's ring timeout), 0..=1000; only with io_batch > 0",
            default("0");
    }
}

const PARAMS: [ParamSpec; ThreeFsParams::SPECS.len() + FILE_LAYER_PARAMS.len()] =
    join_params(ThreeFsParams::SPECS, FILE_LAYER_PARAMS);

/// The 3FS plugin.
pub static DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    NAME,
    BackendKind::File,
    "DeepSeek 3FS through USRBIO rings and iovs, files with atomic publish",
    probe,
    build,
)
.with_priority(priority::THREEFS)
.with_params(&PARAMS);

hicache_core::register_plugin!(DESCRIPTOR);

/// The plugin's validated configuration.
#[derive(Clone, Debug)]
struct Settings {
    file: PosixConfig,
    usrbio_lib: Option<PathBuf>,
    iov_bytes: usize,
    entries: u32,
    io_batch: u32,
    io_batch_timeout_ms: u32,
}

impl Settings {
    fn from_context(ctx: &PluginContext<'_>) -> Result<Self> {
        let file = PosixConfig::from_context(ctx)?;
        let p = ThreeFsParams::from_params(ctx.params);
        let iov_bytes = match &p.iov_bytes {
            None => 16 << 20,
            Some(s) if (64 << 10..=1 << 30).contains(&s.value) && s.value % 4096 == 0 => s.value,
            Some(s) => {
                return Err(Error::invalid_config(
                    "iov_bytes",
                    s.source.to_string(),
                    format!("{} is not a multiple of 4096 in 64 KiB..=1 GiB", s.value),
                ));
            }
        };
        let entries = match &p.ring_entries {
            None => 64,
            Some(s) if (1..=4096).contains(&s.value) => s.value,
            Some(s) => {
                return Err(Error::invalid_config(
                    "ring_entries",
                    s.source.to_string(),
                    format!("{} is outside 1..=4096", s.value),
                ));
            }
        };
        let io_batch = match &p.io_batch {
            None => 0,
            Some(s) if s.value <= entries => s.value,
            Some(s) => {
                return Err(Error::invalid_config(
                    "io_batch",
                    s.source.to_string(),
                    format!("{} is more than ring_entries ({entries})", s.value),
                ));
            }
        };
        let io_batch_timeout_ms = match &p.io_batch_timeout_ms {
            None => 0,
            Some(s) if s.value > 1000 => {
                return Err(Error::invalid_config(
                    "io_batch_timeout_ms",
                    s.source.to_string(),
                    format!("{} is outside 0..=1000", s.value),
                ));
            }
            Some(s) if io_batch == 0 && s.value > 0 => {
                return Err(Error::invalid_config(
                    "io_batch_timeout_ms",
                    s.source.to_string(),
                    "applies only with io_batch > 0 (set io_batch, or drop this)",
                ));
            }
            Some(s) => s.value,
        };
        Ok(Settings {
            file,
            usrbio_lib: p.usrbio_path.map(|s| PathBuf::from(s.value)),
            iov_bytes: iov_bytes as usize,
            entries: entries as u32,
            io_batch: io_batch as u32,
            io_batch_timeout_ms: io_batch_timeout_ms as u32,
        })
    }
}

/// What the probe hands to the build.
#[derive(Debug)]
struct Findings {
    settings: Settings,
    usrbio: Arc<Usrbio>,
    mount: PathBuf,
}

/// Config valid; the library loads; every storage dir lies under one 3FS mount, where an
/// iov and rings can be created and a block round-trips (dirs that do not exist yet are
/// judged by the mount their path lies under, and created when the plugin opens).
fn probe(ctx: &PluginContext<'_>) -> Probe {
    let settings = match Settings::from_context(ctx) {
        Ok(s) => s,
        Err(e) => return Probe::unusable(e.to_string(), "fix the [plugin.3fs] parameters"),
    };
    let (existing, missing): (Vec<PathBuf>, Vec<PathBuf>) = settings
        .file
        .dirs
        .iter()
        .cloned()
        .partition(|d| std::fs::symlink_metadata(d).is_ok());
    let found = match crate::probe::probe(&existing, settings.usrbio_lib.as_deref()) {
        Ok(found) => found,
        Err(e) => {
            let hint = match (&e.source, &e.dir) {
                (UsrbioError::NotFound { .. } | UsrbioError::MissingSymbol { .. }, _) => {
                    "install the 3FS client, or set usrbio_path in [plugin.3fs]"
                }
                (UsrbioError::NotOn3fs { .. }, _) => {
                    "storage_dir must lie under a 3FS mount (hf3fs_fuse); use POSIX for other filesystems"
                }
                _ => "fix what the reason names for that dir, or leave it out of storage_dir",
            };
            return Probe::unusable(e.to_string(), hint);
        }
    };
    let mut mounts: Vec<PathBuf> = found.dirs.iter().map(|(_, m)| m.clone()).collect();
    for d in &missing {
        match found.usrbio.mount_point(d) {
            Ok(m) => mounts.push(m),
            Err(e) => {
                return Probe::unusable(
                    format!("{}: {e}", d.display()),
                    "storage_dir must lie under a 3FS mount (hf3fs_fuse); use POSIX for other filesystems",
                );
            }
        }
    }
    mounts.dedup();
    let mount = match &mounts[..] {
        [one] => one.clone(),
        [] => {
            return Probe::unusable("no storage dir given", "set storage_dir");
        }
        several => {
            return Probe::unusable(
                format!(
                    "the storage dirs lie under {} different 3FS mounts ({})",
                    several.len(),
                    several
                        .iter()
                        .map(|m| m.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "list dirs of one 3FS mount in storage_dir",
            );
        }
    };
    let mut summary = vec![format!(
        "USRBIO {}{} on mount {}",
        found.loaded_from.display(),
        if found.stand_in {
            " (the test stand-in)"
        } else {
            ""
        },
        mount.display()
    )];
    summary.extend(found.dirs.iter().map(|(d, _)| {
        format!(
            "{}: iov and rings created, block written and read back",
            d.display()
        )
    }));
    summary.extend(missing.iter().map(|d| {
        format!(
            "{}: does not exist yet, created when the plugin opens",
            d.display()
        )
    }));
    let mut probe = Probe::usable(summary.join("; "))
        .fact(NAME, "library", found.loaded_from.display().to_string())
        .fact(NAME, "stand-in", found.stand_in)
        .fact(NAME, "mount", mount.display().to_string());
    for (d, _) in &found.dirs {
        probe = probe.fact(d.display().to_string(), "USRBIO round trip", true);
    }
    let usrbio = found.usrbio;
    probe.with_findings(Findings {
        settings,
        usrbio,
        mount,
    })
}

fn build(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    let (settings, usrbio, mount) = match ctx.findings::<Findings>() {
        Some(f) => (f.settings.clone(), f.usrbio.clone(), f.mount.clone()),
        None => {
            let settings = Settings::from_context(ctx)?;
            let usrbio = Arc::new(
                Usrbio::load(settings.usrbio_lib.as_deref()).map_err(|e| to_error(e, None))?,
            );
            let first = settings.file.dirs.first().ok_or_else(|| {
                Error::invalid_config("storage_dir", NAME, "no storage dir given")
            })?;
            let mount = usrbio
                .mount_point(first)
                .map_err(|e| to_error(e, Some(first.clone())))?;
            (settings, usrbio, mount)
        }
    };
    let shape = LaneShape {
        iov_bytes: settings.iov_bytes,
        entries: settings.entries,
        io_batch: settings.io_batch,
        io_batch_timeout_ms: settings.io_batch_timeout_ms,
    };
    let path = UsrbioPath::new(NAME, usrbio, mount, shape);
    Ok(Arc::new(PosixBackend::with_data_path(
        NAME,
        &settings.file,
        Arc::new(path),
    )?))
}

fn to_error(e: UsrbioError, path: Option<PathBuf>) -> Error {
    match path {
        Some(p) => Error::PluginUnusable {
            plugin: NAME.into(),
            reason: format!("{}: {e}", p.display()),
            hint: Some("storage_dir must lie under a 3FS mount".into()),
        },
        None => Error::backend(NAME, e.to_string()),
    }
}
