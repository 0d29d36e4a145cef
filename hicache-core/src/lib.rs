#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod blocking;
pub mod capacity;
mod config;
mod connector;
mod display;
pub mod docs;
mod envelope;
mod error;
mod hash;
mod key;
mod memory;
mod memory_backend;
pub mod meters;
mod params;
mod plugin_name;
mod pool;
mod pool_builder;
mod probe;
pub mod raw;
mod reference;
mod region_id;
mod region_path;
mod registry;
mod routing;
mod staging;

// The engine's face: configure, open, register a pool, move pages.
pub use backend::{MissReason, ReadOutcome};
pub use blocking::BlockingHiCache;
pub use config::{
    Config, ConfigEntry, ConfigLoader, DEFAULT_STORAGE_DIR, EngineKeys, EnvSnapshot, Params,
    PluginChoice, PluginSection, RawValue, Setting, Source, TransferChoice,
};
pub use connector::{
    ExistsV2, HiCache, HiCacheOptions, HitPolicy, HostSlots, ModeRule, PayloadCheck, PoolId,
    PoolQuery, PoolReport, PoolTransfer, STORAGE_BATCH_SIZE, SetOutcome, Stats, TransferMode,
    choose_mode, decide_mode,
};
pub use display::ByteSize;
pub use envelope::PageFormat;
pub use error::{Component, Error, Result};
pub use key::{NamingScheme, PageKey, StorageIdentity};
pub use memory::{HostPages, MemKind, MemoryOwner, MemoryRegion, SHM_DIR, SharedFile};
pub use memory_backend::MemoryBackend;
pub use pool::{
    AnchorPool, AttentionKind, BufferLayout, Dtype, HostPool, Layout, MAX_POOL_NAME_LEN,
    MAX_SIDECAR_SPANS, MmapPool, PageSpans, PoolGeometry, PoolName, RegionPool, SidecarGeometry,
    SidecarPool, Span, gather_page, scatter_page,
};
pub use pool_builder::PoolGeometryBuilder;
pub use probe::{Fact, FactValue, Verdict};
pub use reference::{ConfigKey, config_keys, config_keys_markdown};
pub use region_path::{CopyCounter, CopyReport, RegionPath};
pub use registry::{Considered, PluginOrigin, PluginRegistry, Rejected, Selection};

#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
