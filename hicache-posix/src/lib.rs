#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod beneath;
mod cleaner;
mod config;
pub mod data_path;
mod flight;
mod fsinfo;
mod inspect;
mod io;
mod known;
mod listing;
mod name;
mod plan;
mod probe;
mod protocol;
mod root;
mod spare;
mod threads;
mod uring;
mod uses;

pub use backend::{Flushes, PosixBackend, RootInfo};
pub use cleaner::{CLEANER_FILE, CleanerDir, CleanerPass, CleanerRecord, CleanerSeen, cleaner_of};
pub use config::{
    EngineChoice, FILE_LAYER_PARAMS, FileLayerParams, PARAMS, PosixConfig, PosixParams, SyncMode,
};
pub use fsinfo::{FALLBACK_ALIGN, FsInfo, fs_info, space};
pub use inspect::{RootContents, inspect_root};
pub use name::is_spare_name;
pub use probe::{DirProbe, DirProblem, PosixFindings, probe_dir};

use hicache_core::Result;
use hicache_core::raw::{BackendKind, DynBackend, PluginContext, PluginDescriptor, priority};

/// The plugin's name.
pub const NAME: &str = "POSIX";

/// The POSIX plugin.
pub static DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    NAME,
    BackendKind::File,
    "files on a local or shared filesystem, O_DIRECT, atomic publish",
    probe::probe,
    build,
)
.with_priority(priority::POSIX)
.with_params(PARAMS);

hicache_core::register_plugin!(DESCRIPTOR);

fn build(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    // After selection, the probe has validated the config and examined each existing dir.
    if let Some(found) = ctx.findings::<PosixFindings>() {
        // The cleaner follows the config the plugin is built with, which may differ from
        // the one it was probed with (a tool turns the cleaner off).
        let mut config = found.config.clone();
        config.cleaner = ctx.config.cleaner();
        return Ok(std::sync::Arc::new(PosixBackend::open(
            &config,
            &found.dirs,
        )?));
    }
    let cfg = PosixConfig::from_context(ctx)?;
    Ok(std::sync::Arc::new(PosixBackend::new(&cfg)?))
}
