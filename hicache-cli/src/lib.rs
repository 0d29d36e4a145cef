#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod bench;
mod cmd;
pub mod doctor;
mod progress;
pub mod scrub;
pub mod usage;

pub use cmd::Commands;
