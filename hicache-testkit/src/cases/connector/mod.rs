//! Cases through the connector (`HiCache`) over the plugin: layouts, modes, naming,
//! existence semantics, isolation, integrity and concurrency: the behaviours SGLang's
//! storage backends show its controller.
//!
//! The cases live in one submodule per theme and are re-exported here, so each is
//! `hicache_testkit::cases::connector::<name>` whichever file holds it.

mod batches;
mod concurrency;
mod exists;
mod integrity;
mod isolation;
mod layouts;
mod memory;
mod sglang;

pub use batches::*;
pub use concurrency::*;
pub use exists::*;
pub use integrity::*;
pub use isolation::*;
pub use layouts::*;
pub use memory::*;
pub use sglang::*;

use hicache_core::{ReadOutcome, SetOutcome};

/// Pages in the pools most cases register.
pub(super) const PAGES: u64 = 12;

fn all_hits(r: &[hicache_core::Result<ReadOutcome>]) -> bool {
    r.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit)))
}

pub(super) fn all_written(r: &[hicache_core::Result<SetOutcome>]) -> bool {
    r.iter().all(|r| matches!(r, Ok(SetOutcome::Written)))
}
