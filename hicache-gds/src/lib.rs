#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod cuda;
pub mod cufile;
mod dynlib;
mod error;
mod path;
mod plugin;
pub mod probe;

pub use error::GdsError;
pub use plugin::{BatchParams, CuFileParams, GDS, GDS_DESCRIPTOR, GDS_MT, GDS_MT_DESCRIPTOR};
