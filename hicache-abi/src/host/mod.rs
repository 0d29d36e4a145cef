//! The host side: loading plugin files and driving them through their tables.

mod backend;
mod config;
mod listing;
mod load;
mod plugin;

pub(crate) use load::bounded_c_str;
pub use load::{LoadError, Loaded, load_dirs, load_file};
