//! The USRBIO stand-in the tests load, built once per test binary.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::path::Path;
use std::sync::OnceLock;

/// The stand-in library (under the build's tmp dir: a static is never dropped).
pub fn library() -> &'static Path {
    static BUILT: OnceLock<(tempfile::TempDir, std::path::PathBuf)> = OnceLock::new();
    &BUILT
        .get_or_init(|| {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let lib = hicache_testkit::standins::usrbio(dir.path()).unwrap();
            (dir, lib)
        })
        .1
}
