#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod bench;
pub mod doctor;
pub mod scrub;
