#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod cuda;
pub mod cufile;
mod dynlib;
mod error;
pub mod probe;

pub use error::GdsError;
