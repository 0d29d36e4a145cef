#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod bench;
pub mod doctor;
mod progress;
pub mod scrub;
