//! The whole conformance suite for 3FS through the real FFI path, against the testkit's
//! USRBIO stand-in (built with the system's C compiler): each trial's dir is made a
//! "mount" and the plugin is opened as selection opens it — config, parameters, probe,
//! build. Small iovs (64 KiB) and rings (4 slots) make larger objects move in several
//! windows and rounds. This proves the plugin's FFI path and bookkeeping, not a 3FS cluster.
//!
//! Two variants: `bounce` moves ordinary host memory through the plugin's bounce iovs;
//! `in_place` gives every case memory and pools in shared-memory files, which the plugin
//! wraps as iovs and the stand-in reaches through its own mapping of each file, as 3FS's
//! FUSE process does.

mod support;

use hicache_core::raw::DynBackend;
use hicache_core::{ConfigLoader, Error, Result};
use std::sync::Arc;

use hicache_testkit::memory::SharedHostMemory;
use hicache_testkit::standins::{USRBIO_MOUNT_MARKER, make_usrbio_mount};
use hicache_testkit::{Suite, TrialEnv};

fn open(env: &TrialEnv) -> Result<DynBackend> {
    if !env.dir().join(USRBIO_MOUNT_MARKER).exists() {
        make_usrbio_mount(env.dir()).map_err(|e| {
            Error::io(
                "3FS conformance",
                "make the mount",
                Some(env.dir().to_path_buf()),
                e,
            )
        })?;
    }
    let plugin = &hicache_3fs::DESCRIPTOR;
    let config = ConfigLoader::new()
        .set("storage_dir", env.dir().join("store").display().to_string())
        .set(
            "plugin.3fs.usrbio_path",
            support::library().display().to_string(),
        )
        .set("plugin.3fs.threads", 4)
        .set("plugin.3fs.iov_bytes", 65536)
        .set("plugin.3fs.ring_entries", 4)
        .load()?;
    hicache_testkit::open_probed(plugin, &config)
}

fn main() -> std::process::ExitCode {
    Suite::new("3FS")
        .variant("bounce", None, open)
        .variant("in_place", None, open)
        .memory(Arc::new(SharedHostMemory))
        .run_main()
}
