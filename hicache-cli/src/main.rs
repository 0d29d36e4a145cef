//! The `hicache` command: which plugins this build has, what they can do here, and what the
//! effective configuration is.

use std::process::ExitCode;

/// Counts heap allocations, so `hicache bench` can report them per page.
#[global_allocator]
static ALLOCATOR: hicache_cli::bench::CountingAllocator = hicache_cli::bench::CountingAllocator;

fn main() -> ExitCode {
    ALLOCATOR.installed();
    hicache_cli::Commands::new().main()
}
