#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod broken;
pub mod cases;
pub mod cc;
pub mod check;
pub mod fault;
pub mod fixtures;
pub mod memory;
pub mod params;
pub mod s3;
pub mod standins;
mod suite;
mod trial;

pub use check::{CaseError, CaseResult, skip};
pub use fault::{FaultPlan, FaultyBackend, Injected};
pub use suite::{Suite, broken_suite};
pub use trial::{Case, CaseFuture, Factory, Proof, TrialEnv, open_probed, per_trial};
