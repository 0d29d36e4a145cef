//! The whole conformance suite for 3FS through the real FFI path, against the testkit's
//! USRBIO stand-in (built with the system's C compiler): each trial's dir is marked as a
//! "mount" and the plugin is opened as selection opens it — config, parameters, probe,
//! build. Small iovs (64 KiB) and rings (4 slots) make larger objects move in several
//! windows and rounds. This proves the plugin's FFI path and bookkeeping, not a 3FS cluster.

use std::path::PathBuf;
use std::sync::OnceLock;

use hicache_core::raw::{DynBackend, PluginContext, params_for};
use hicache_core::{ConfigLoader, Error, Result};
use hicache_testkit::TrialEnv;
use hicache_testkit::standins::USRBIO_MOUNT_MARKER;

fn library() -> &'static PathBuf {
    static BUILT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &BUILT
        .get_or_init(|| {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let lib = hicache_testkit::standins::usrbio(dir.path()).unwrap();
            (dir, lib)
        })
        .1
}

fn open(env: &TrialEnv) -> Result<DynBackend> {
    let marker = env.dir().join(USRBIO_MOUNT_MARKER);
    if !marker.exists() {
        std::fs::write(&marker, b"")
            .map_err(|e| Error::io("3FS conformance", "mark the mount", Some(marker), e))?;
    }
    let plugin = &hicache_3fs::DESCRIPTOR;
    let config = ConfigLoader::new()
        .set("storage_dir", env.dir().join("store").display().to_string())
        .set("plugin.3fs.usrbio_path", library().display().to_string())
        .set("plugin.3fs.threads", 4)
        .set("plugin.3fs.iov_bytes", 65536)
        .set("plugin.3fs.ring_entries", 4)
        .load()?;
    let params = params_for(plugin, &config)?;
    let ctx = PluginContext::new(&config, &params);
    let probe = plugin.probe(&ctx);
    if !probe.verdict().is_usable() {
        return Err(Error::backend(
            plugin.name,
            format!("the probe said {}", probe.verdict()),
        ));
    }
    plugin.build(&ctx.with_findings(probe.findings()))
}

hicache_testkit::conformance_suite!("3FS", open);
