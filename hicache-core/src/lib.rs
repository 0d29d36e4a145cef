#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod backend;
pub mod config;
pub mod connector;
mod display;
pub mod docs;
pub mod envelope;
pub mod error;
pub mod key;
pub mod memory;
pub mod memory_backend;
pub mod params;
pub mod pool;
pub mod registry;
pub mod routing;
mod staging;

pub use backend::{
    BackendInfo, BackendKind, Capability, DynBackend, MissReason, ReadItem, ReadOutcome,
    StorageBackend, Usage, WriteItem,
};
pub use config::{Config, ConfigLoader, EnvSnapshot, PluginChoice, Source, TransferChoice};
pub use connector::{
    BlockingHiCache, HiCache, HiCacheOptions, HostSlots, PoolReport, STORAGE_BATCH_SIZE,
    SetOutcome, Stats, TransferMode, choose_mode, decide_mode,
};
pub use display::ByteSize;
pub use envelope::PageFormat;
pub use error::{Error, Result};
pub use key::{Namespace, NamingScheme, ObjectKey, PageKey, StorageIdentity};
pub use memory::{
    Access, AlignedBuf, HostBytes, MemKind, MemoryRegion, RegionId, RegionTable, Slice,
    SourceSlice, TargetSlice,
};
pub use memory_backend::MemoryBackend;
pub use params::{DeclaredParams, ParamKind, ParamSpec, ParamType, ParamValue, PluginParams};
pub use pool::{AnchorPool, AttentionKind, Dtype, HostPool, Layout, MmapPool, PoolGeometry};
pub use registry::{PluginContext, PluginDescriptor, PluginRegistry, Selection, Verdict, priority};

#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
