//! The two plugins, `GDS` and `GDS_MT`: their parameters, probe and build. Both are the
//! POSIX file layer with cuFile as its data path ([`crate::path`]); they differ in how the
//! bytes are submitted.

use std::path::PathBuf;
use std::sync::Arc;

use hicache_core::raw::{
    BackendKind, DynBackend, ParamSpec, PluginContext, PluginDescriptor, Probe, join_params,
    priority,
};
use hicache_core::{Error, Result};
use hicache_posix::{FILE_LAYER_PARAMS, PosixBackend, PosixConfig};

use crate::cufile::CuFile;
use crate::error::GdsError;
use crate::path::{CuFilePath, Submit};
use crate::probe::Mode;

/// The batch plugin's name.
pub const GDS: &str = "GDS";
/// The thread-pool plugin's name.
pub const GDS_MT: &str = "GDS_MT";

hicache_core::plugin_params! {
    /// Parameters both plugins take besides the file layer's.
    pub struct CuFileParams {
        cufile_path: Str = "cufile_path"
            => "the cuFile library to load",
            default("libcufile.so.0 from the dynamic loader's search path, then /usr/local/cuda/lib64/libcufile.so.0");
        threads: UInt = "threads"
            => "worker threads: for GDS_MT each moves one object at a time with cuFileRead/cuFileWrite; for GDS each runs up to batch_limit objects together, their transfers in one cuFile batch",
            default("16 on block filesystems, one per CPU on tmpfs/ramfs");
    }
}

hicache_core::plugin_params! {
    /// GDS's batch parameters.
    pub struct BatchParams {
        batch_limit: UInt = "batch_limit"
            => "cuFile requests per batch, 1..=1024: at most cufile.json's io_batchsize (128 by default), which the probe checks by setting a batch up",
            default("128");
        max_request_size: UInt = "max_request_size"
            => "bytes per cuFile request, a multiple of 4096 up to 1 GiB; larger segments are split (keep it at or below cufile.json's max_direct_io_size_kb)",
            default("16 MiB");
    }
}

const MT_PARAMS: [ParamSpec; CuFileParams::SPECS.len() + FILE_LAYER_PARAMS.len()] =
    join_params(CuFileParams::SPECS, FILE_LAYER_PARAMS);
const BATCH_PARAMS: [ParamSpec; MT_PARAMS.len() + BatchParams::SPECS.len()] =
    join_params(&MT_PARAMS, BatchParams::SPECS);

/// The GDS plugin: cuFile's batch API.
pub static GDS_DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    GDS,
    BackendKind::File,
    "GPUDirect Storage through cuFile's batch API: host or GPU memory to O_DIRECT files, atomic publish",
    probe_batch,
    build_batch,
)
.with_priority(priority::GDS)
.with_params(&BATCH_PARAMS);

/// The GDS_MT plugin: `cuFileRead`/`cuFileWrite` on a thread pool.
pub static GDS_MT_DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    GDS_MT,
    BackendKind::File,
    "GPUDirect Storage through cuFileRead/cuFileWrite on a thread pool: host or GPU memory to O_DIRECT files, atomic publish",
    probe_threads,
    build_threads,
)
.with_priority(priority::GDS_MT)
.with_params(&MT_PARAMS);

hicache_core::register_plugin!(GDS_DESCRIPTOR);
hicache_core::register_plugin!(GDS_MT_DESCRIPTOR);

/// Default requests per batch: cuFile's default `io_batchsize`.
const DEFAULT_BATCH_LIMIT: u64 = 128;
/// Default bytes per request (NIXL's GDS default).
const DEFAULT_MAX_REQUEST: u64 = 16 << 20;

/// Which plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavor {
    Batch,
    Threads,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::Batch => GDS,
            Flavor::Threads => GDS_MT,
        }
    }

    fn section(self) -> &'static str {
        match self {
            Flavor::Batch => "[plugin.gds]",
            Flavor::Threads => "[plugin.gds_mt]",
        }
    }
}

/// A plugin's validated configuration.
#[derive(Clone, Debug)]
struct Settings {
    file: PosixConfig,
    cufile_path: Option<PathBuf>,
    submit: Submit,
}

impl Settings {
    fn from_context(ctx: &PluginContext<'_>, flavor: Flavor) -> Result<Self> {
        let file = PosixConfig::from_context(ctx)?;
        let own = CuFileParams::from_params(ctx.params);
        let submit = match flavor {
            Flavor::Threads => Submit::Sync,
            Flavor::Batch => {
                let p = BatchParams::from_params(ctx.params);
                let limit = match &p.batch_limit {
                    None => DEFAULT_BATCH_LIMIT,
                    Some(s) if (1..=1024).contains(&s.value) => s.value,
                    Some(s) => {
                        return Err(Error::invalid_config(
                            "batch_limit",
                            s.source.to_string(),
                            format!("{} is outside 1..=1024", s.value),
                        ));
                    }
                };
                let max_request = match &p.max_request_size {
                    None => DEFAULT_MAX_REQUEST,
                    Some(s) if s.value > 0 && s.value % 4096 == 0 && s.value <= 1 << 30 => s.value,
                    Some(s) => {
                        return Err(Error::invalid_config(
                            "max_request_size",
                            s.source.to_string(),
                            format!("{} is not a multiple of 4096 in 4096..=1 GiB", s.value),
                        ));
                    }
                };
                Submit::Batch {
                    limit: limit as u32,
                    max_request: max_request as usize,
                }
            }
        };
        Ok(Settings {
            file,
            cufile_path: own.cufile_path.map(|s| PathBuf::from(s.value)),
            submit,
        })
    }
}

/// What the probe hands to the build: the settings and the loaded library.
#[derive(Debug)]
struct Findings {
    settings: Settings,
    cufile: Arc<CuFile>,
}

fn probe_batch(ctx: &PluginContext<'_>) -> Probe {
    probe(ctx, Flavor::Batch)
}

fn probe_threads(ctx: &PluginContext<'_>) -> Probe {
    probe(ctx, Flavor::Threads)
}

fn build_batch(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    build(ctx, Flavor::Batch)
}

fn build_threads(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    build(ctx, Flavor::Threads)
}

/// Config valid; cuFile loads, its driver opens, and in every storage dir that exists a
/// file is registered and a block written and read back through cuFile; for GDS a batch of
/// `batch_limit` requests can be set up.
fn probe(ctx: &PluginContext<'_>, flavor: Flavor) -> Probe {
    let name = flavor.name();
    let settings = match Settings::from_context(ctx, flavor) {
        Ok(s) => s,
        Err(e) => {
            return Probe::unusable(
                e.to_string(),
                format!("fix the {} parameters", flavor.section()),
            );
        }
    };
    // A probe creates nothing: dirs that do not exist yet are created, and first used by
    // cuFile, when the plugin opens.
    let (existing, missing): (Vec<PathBuf>, Vec<PathBuf>) = settings
        .file
        .dirs
        .iter()
        .cloned()
        .partition(|d| std::fs::symlink_metadata(d).is_ok());
    let found = match crate::probe::probe(&existing, settings.cufile_path.as_deref()) {
        Ok(found) => found,
        Err(e) => {
            let hint = match (&e.source, &e.dir) {
                (GdsError::NotFound { .. } | GdsError::MissingSymbol { .. }, _) => format!(
                    "install NVIDIA GPUDirect Storage, or set cufile_path in {}",
                    flavor.section()
                ),
                (_, Some(_)) => {
                    "fix what the reason names for that dir, or leave it out of storage_dir".into()
                }
                (_, None) => {
                    "cuFile's driver would not open: see cufile.log (CUFILE_LOGFILE_PATH) for why"
                        .into()
                }
            };
            return Probe::unusable(e.to_string(), hint);
        }
    };
    if let Submit::Batch { limit, .. } = settings.submit {
        let batch = found
            .cufile
            .open_driver()
            .and_then(|()| found.cufile.batch(limit).map(drop));
        let _ = found.cufile.close_driver();
        if let Err(e) = batch {
            return Probe::unusable(
                format!("a cuFile batch of {limit} requests cannot be set up: {e}"),
                "lower batch_limit to cufile.json's io_batchsize (128 by default), or use GDS_MT",
            );
        }
    }
    let mode = match (found.stand_in, found.mode) {
        (true, _) => "the test stand-in (POSIX I/O on host memory)",
        (false, Mode::P2p) => "P2P (nvidia-fs loaded: DMA between GPU and storage)",
        (false, Mode::Compat) => {
            "compat (no nvidia-fs: cuFile moves data through host bounce buffers)"
        }
    };
    let mut summary = vec![format!(
        "cuFile {} in {mode} mode",
        found.loaded_from.display()
    )];
    summary.extend(found.dirs.iter().map(|d| {
        format!(
            "{}: file registered, block written and read back",
            d.display()
        )
    }));
    summary.extend(missing.iter().map(|d| {
        format!(
            "{}: does not exist yet, created when the plugin opens (cuFile not tried there yet)",
            d.display()
        )
    }));
    let mut probe = Probe::usable(summary.join("; "))
        .fact(name, "library", found.loaded_from.display().to_string())
        .fact(name, "stand-in", found.stand_in)
        .fact(
            name,
            "mode",
            match found.mode {
                Mode::P2p => "P2P",
                Mode::Compat => "compat",
            },
        );
    for d in &found.dirs {
        probe = probe.fact(d.display().to_string(), "cuFile round trip", true);
    }
    for d in &missing {
        probe = probe.fact(
            d.display().to_string(),
            "state",
            "missing: created when the plugin opens",
        );
    }
    let cufile = found.cufile;
    probe.with_findings(Findings { settings, cufile })
}

fn build(ctx: &PluginContext<'_>, flavor: Flavor) -> Result<DynBackend> {
    let name = flavor.name();
    let (settings, cufile) = match ctx.findings::<Findings>() {
        Some(f) => (f.settings.clone(), f.cufile.clone()),
        None => {
            let settings = Settings::from_context(ctx, flavor)?;
            let cufile =
                CuFile::load(settings.cufile_path.as_deref()).map_err(|e| e.into_error(name))?;
            (settings, Arc::new(cufile))
        }
    };
    let path = CuFilePath::open(name, cufile, settings.submit).map_err(|e| e.into_error(name))?;
    Ok(Arc::new(PosixBackend::with_data_path(
        name,
        &settings.file,
        Arc::new(path),
    )?))
}
