//! The conformance suite for POSIX: ext4 (the system temp dir on this project's machines)
//! and tmpfs (`/dev/shm`), each with and without O_DIRECT and with both engines. The tmpfs
//! variants also cover `sync = data` and `sync = full` (flushes cost little there).

use std::sync::Arc;

use hicache_core::DynBackend;
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig, SyncMode};
use hicache_testkit::TrialEnv;

fn posix(
    direct_io: bool,
    engine: EngineChoice,
    sync: SyncMode,
) -> impl Fn(&TrialEnv) -> hicache_core::Result<DynBackend> {
    move |env| {
        let cfg = PosixConfig {
            dirs: vec![env.dir().join("store")],
            direct_io,
            engine,
            threads: 4,
            queue_depth: 128,
            sync,
            spare_bytes: 1 << 30,
            file_mode: 0o600,
            dir_mode: 0o700,
        };
        Ok(Arc::new(PosixBackend::new(&cfg)?) as DynBackend)
    }
}

hicache_testkit::conformance_suite!("POSIX", {
    "ext4_direct_uring" => posix(true, EngineChoice::Uring, SyncMode::None),
    "ext4_direct_threads" => posix(true, EngineChoice::Threads, SyncMode::None),
    "ext4_buffered_uring" => posix(false, EngineChoice::Uring, SyncMode::None),
    "ext4_buffered_threads" => posix(false, EngineChoice::Threads, SyncMode::None),
    "tmpfs_direct_uring_sync_full" @ "/dev/shm/hicache-conformance" => posix(true, EngineChoice::Uring, SyncMode::Full),
    "tmpfs_direct_threads_sync_data" @ "/dev/shm/hicache-conformance" => posix(true, EngineChoice::Threads, SyncMode::Data),
    "tmpfs_buffered_uring_sync_data" @ "/dev/shm/hicache-conformance" => posix(false, EngineChoice::Uring, SyncMode::Data),
    "tmpfs_buffered_threads_sync_full" @ "/dev/shm/hicache-conformance" => posix(false, EngineChoice::Threads, SyncMode::Full),
});
