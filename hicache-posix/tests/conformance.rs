//! The conformance suite for POSIX: ext4 (the system temp dir on this project's machines)
//! and tmpfs (`/dev/shm`), each with and without O_DIRECT and with both engines.

use std::sync::Arc;

use hicache_core::DynBackend;
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig};
use hicache_testkit::TrialEnv;

fn posix(
    direct_io: bool,
    engine: EngineChoice,
) -> impl Fn(&TrialEnv) -> hicache_core::Result<DynBackend> {
    move |env| {
        let cfg = PosixConfig {
            dirs: vec![env.dir().join("store")],
            direct_io,
            engine,
            threads: 4,
            queue_depth: 128,
            sync: false,
            spare_bytes: 1 << 30,
            file_mode: 0o600,
            dir_mode: 0o700,
        };
        Ok(Arc::new(PosixBackend::new(&cfg)?) as DynBackend)
    }
}

hicache_testkit::conformance_suite!("POSIX", {
    "ext4_direct_uring" => posix(true, EngineChoice::Uring),
    "ext4_direct_threads" => posix(true, EngineChoice::Threads),
    "ext4_buffered_uring" => posix(false, EngineChoice::Uring),
    "ext4_buffered_threads" => posix(false, EngineChoice::Threads),
    "tmpfs_direct_uring" @ "/dev/shm/hicache-conformance" => posix(true, EngineChoice::Uring),
    "tmpfs_direct_threads" @ "/dev/shm/hicache-conformance" => posix(true, EngineChoice::Threads),
    "tmpfs_buffered_uring" @ "/dev/shm/hicache-conformance" => posix(false, EngineChoice::Uring),
    "tmpfs_buffered_threads" @ "/dev/shm/hicache-conformance" => posix(false, EngineChoice::Threads),
});
