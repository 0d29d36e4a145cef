//! `hicache bench`: write, read back into another region, verify every byte, time each phase;
//! and the baselines it is compared with.
//!
//! - `shape`: page shapes of well-known models;
//! - `run`: the benchmark through a connector;
//! - `baselines`: the raw O_DIRECT loop (in place, or publishing each page by name) and the
//!   bare `object_store` client;
//! - `report`: the figures and their arithmetic;
//! - `alloc`: heap allocations and peak memory while it runs.

mod alloc;
mod baselines;
mod report;
mod run;
mod shape;

pub use alloc::CountingAllocator;
#[cfg(feature = "obj")]
pub use baselines::raw_object_store;
pub use baselines::{RawLoop, raw_baseline};
pub use report::{BenchReport, PhaseStats};
pub use run::{BenchOptions, run};
pub use shape::ModelShape;

/// The bytes of page `p` in the benchmark (cheap to generate, distinct per page).
fn page_pattern(len: u64, p: u64) -> Vec<u8> {
    let mut x = p.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len as usize);
    while out.len() < len as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len as usize);
    out
}
