//! The suite against the reference in-memory backend: once without an alignment rule and
//! once enforcing 4096-byte direct-I/O alignment (so bounce and misalignment cases run).

use std::sync::Arc;

use hicache_core::MemoryBackend;
use hicache_core::raw::DynBackend;
use hicache_testkit::per_trial;

fn memory(align: u64) -> impl Fn(&hicache_testkit::TrialEnv) -> hicache_core::Result<DynBackend> {
    per_trial(move || Ok(Arc::new(MemoryBackend::with_alignment(align)) as DynBackend))
}

hicache_testkit::conformance_suite!("MEMORY", {
    "memory" => memory(1),
    "memory_aligned" => memory(4096),
});
