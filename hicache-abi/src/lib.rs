#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod abi;
mod guest;
mod host;

#[doc(hidden)]
pub mod __guest {
    pub use crate::guest::{OpenFn, ProbeFn, Table, open, probe};
}

pub use host::{LoadError, Loaded, load_dirs, load_file};

/// The C header of the ABI, as shipped in `include/hicache_plugin.h`.
pub const HEADER: &str = include_str!("../include/hicache_plugin.h");

/// The example plugins' sources, for tests and tools that build them.
pub mod examples {
    /// `examples/c/cfile.c`: the C example plugin (CFILE). Its `HICACHE_BROKEN_*` macros
    /// build deliberately broken variants; `HICACHE_PLUGIN_NAME` renames it and
    /// `HICACHE_PLUGIN_PRIORITY` changes its priority.
    pub const CFILE_C: &str = include_str!("../examples/c/cfile.c");
}
