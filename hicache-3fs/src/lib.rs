#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod error;
mod path;
mod plugin;
pub mod probe;
pub mod usrbio;

pub use error::UsrbioError;
pub use plugin::{DESCRIPTOR, NAME, ThreeFsParams};
