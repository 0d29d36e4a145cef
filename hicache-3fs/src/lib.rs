#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod error;
pub mod probe;
pub mod usrbio;

pub use error::UsrbioError;
