#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod client;
mod config;
mod errors;
mod probe;
#[cfg(feature = "aws-sdk")]
mod sdk;
mod tls;

pub use backend::ObjBackend;
pub use config::{ClientKind, ObjConfig, ObjParams, PARAMS, Target};
pub use probe::ObjFindings;

use hicache_core::Result;
use hicache_core::raw::{BackendKind, DynBackend, PluginContext, PluginDescriptor, priority};

/// The plugin's name.
pub const NAME: &str = "OBJ";

/// The OBJ plugin.
pub static DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    NAME,
    BackendKind::Object,
    "S3-compatible object storage (object_store), memory:// and file:// for embedded use",
    probe::probe,
    build,
)
.with_priority(priority::OBJ)
.with_params(PARAMS);

hicache_core::register_plugin!(DESCRIPTOR);

fn build(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    // After selection, the probe has validated the config (and proved it with a round trip).
    let config = match ctx.findings::<ObjFindings>() {
        Some(found) => found.config.clone(),
        None => ObjConfig::from_context(ctx)?,
    };
    Ok(std::sync::Arc::new(ObjBackend::new(config)?))
}
