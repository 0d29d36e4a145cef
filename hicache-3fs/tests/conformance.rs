//! The whole conformance suite for 3FS through the real FFI path, against the testkit's
//! USRBIO stand-in (built with the system's C compiler): each trial's dir is marked as a
//! "mount" and the plugin is opened as selection opens it — config, parameters, probe,
//! build. Small iovs (64 KiB) and rings (4 slots) make larger objects move in several
//! windows and rounds. This proves the plugin's FFI path and bookkeeping, not a 3FS cluster.

mod support;

use hicache_core::raw::DynBackend;
use hicache_core::{ConfigLoader, Error, Result};
use hicache_testkit::TrialEnv;
use hicache_testkit::standins::USRBIO_MOUNT_MARKER;

fn open(env: &TrialEnv) -> Result<DynBackend> {
    let marker = env.dir().join(USRBIO_MOUNT_MARKER);
    if !marker.exists() {
        std::fs::write(&marker, b"")
            .map_err(|e| Error::io("3FS conformance", "mark the mount", Some(marker), e))?;
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

hicache_testkit::conformance_suite!("3FS", open);
