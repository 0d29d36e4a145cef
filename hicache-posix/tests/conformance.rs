//! The conformance suite for POSIX: ext4 (the system temp dir on this project's machines)
//! and tmpfs (`/dev/shm`), each with and without O_DIRECT and with both engines. The tmpfs
//! variants also cover `sync = data` and `sync = full` (flushes cost little there).

use std::sync::Arc;

use hicache_core::Error;
use hicache_core::raw::{DynBackend, StorageBackend};
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig, SyncMode};
use hicache_testkit::TrialEnv;

fn posix(
    direct_io: bool,
    engine: EngineChoice,
    sync: SyncMode,
) -> impl Fn(&TrialEnv) -> hicache_core::Result<DynBackend> {
    move |env| {
        let engine_choice = engine;
        let cfg = PosixConfig {
            dirs: vec![env.dir().join("store")],
            direct_io,
            engine,
            threads: 4,
            queue_depth: 128,
            sync,
            spare_bytes: 1 << 30,
            cleaner: None,
            file_mode: 0o600,
            dir_mode: 0o700,
        };
        let backend = PosixBackend::new(&cfg)?;
        // A variant runs what its name claims: a silent fallback (buffered I/O under a
        // "direct" name, threads under "uring") would pass cases it never ran.
        let runs_direct = backend.info().capability.direct_io;
        let engine = backend.engine_description();
        let want_engine = match engine_choice {
            EngineChoice::Uring => "io_uring",
            EngineChoice::Threads => "threads",
            EngineChoice::Auto => "",
        };
        if runs_direct != direct_io || !engine.starts_with(want_engine) {
            return Err(Error::backend(
                "POSIX conformance",
                format!(
                    "the variant asks for direct_io = {direct_io} on {want_engine} but the \
                     backend runs direct_io = {runs_direct} on {engine}"
                ),
            ));
        }
        Ok(Arc::new(backend) as DynBackend)
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
