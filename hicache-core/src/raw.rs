//! The implementer's face: what a storage plugin implements and uses. Engines need none of
//! it; they use the crate root.
//!
//! A plugin implements [`StorageBackend`] over registered memory ([`RegionTable`] pins it,
//! no `unsafe` needed), declares its parameters with
//! [`plugin_params!`](crate::plugin_params), describes itself with a [`PluginDescriptor`]
//! whose probe returns a [`Probe`] (verdict, facts, and findings its build reuses), and
//! registers that with [`register_plugin!`](crate::register_plugin). The page envelope
//! and the dir routing are here for plugins and tools that read stored objects themselves.

pub use crate::backend::{
    BackendInfo, BackendKind, Capability, DynBackend, ListCursor, ListPage, ListWalk, Listed,
    ReadCheck, ReadItem, StorageBackend, Usage, WriteItem, WriteSeal, list_all,
};
pub use crate::error::SharedSource;
pub use crate::key::{MAX_OBJECT_KEY_LEN, MAX_PAGE_KEY_LEN, Namespace, ObjectKey};
pub use crate::memory::{
    Access, AlignedBuf, HostBytes, MemKind, MemoryOwner, MemoryRegion, RegionId, RegionTable,
    Slice, SourceSlice, TargetSlice, align_up, check_aligned, scatter_into,
};
pub use crate::params::{
    DeclaredParams, ParamKind, ParamSpec, ParamType, PluginParams, join_params,
};
pub use crate::plugin_name::PluginName;
pub use crate::probe::{Findings, Probe};
pub use crate::region_path::{CopyCounter, CopyReport, RegionPath};
pub use crate::registry::{
    LoadedPlugin, PluginContext, PluginDescriptor, PluginOrigin, Rejected, params_for, priority,
};

#[doc(hidden)]
pub use crate::registry::PluginRef;

/// The page envelope: header layout, checksum, lengths (for tools that read stored objects).
pub mod envelope {
    pub use crate::envelope::*;
}

/// Routing of object names to storage dirs and buckets (SGLang's hash).
pub mod routing {
    pub use crate::routing::*;
}
