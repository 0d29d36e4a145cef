#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod cuda;
pub mod cufile;
mod dynlib;
mod error;

pub use error::GdsError;
