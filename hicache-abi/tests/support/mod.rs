//! Building the example plugins for tests: the C one with the system's C compiler, the
//! Rust one by cargo (as an example of this crate).

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hicache_core::raw::{DynBackend, PluginContext, PluginDescriptor, params_for};
use hicache_core::{ConfigLoader, Result};

fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"))
        .path()
}

/// The C example compiled with `defines` (`HICACHE_BROKEN_COUNT`, `HICACHE_PLUGIN_NAME="X"`)
/// into a dir of its own, as `<dir>/lib<name>.so`; the dir is returned with the file.
pub fn c_plugin(name: &str, defines: &[&str]) -> (PathBuf, PathBuf) {
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    let files = [
        ("hicache_plugin.h", hicache_abi::HEADER),
        ("cfile.c", hicache_abi::examples::CFILE_C),
    ];
    hicache_testkit::cc::shared_library(&files, defines, &out).unwrap();
    (dir, out)
}

/// A Rust example plugin (`kvdir`, `panicky`), copied into a dir of its own.
pub fn rust_plugin(example: &str) -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/examples/lib<example>.so
    let built = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("examples").join(format!("lib{example}.so")))
        .unwrap();
    assert!(
        built.is_file(),
        "{} is missing: `cargo test -p hicache-abi` builds it (or `cargo build -p hicache-abi --example {example}`)",
        built.display()
    );
    let dir = scratch().join(format!("rust-{example}"));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("lib{example}.so"));
    if !out.exists() {
        std::fs::copy(&built, &out).unwrap();
    }
    (dir, out)
}

/// Opens `plugin` over `dir` the way selection does: params checked, probe run, build.
pub fn open(plugin: &'static PluginDescriptor, dir: &Path) -> Result<DynBackend> {
    let config = ConfigLoader::new()
        .set("storage_dir", dir.to_str().unwrap())
        .set("use_direct_io", false)
        .load()?;
    let params = params_for(plugin, &config)?;
    let ctx = PluginContext::new(&config, &params);
    let probe = plugin.probe(&ctx);
    assert!(probe.verdict().is_usable(), "{}", probe.verdict());
    plugin.build(&ctx)
}

/// A factory for the conformance suite.
pub fn factory(
    plugin: &'static PluginDescriptor,
) -> impl Fn(&hicache_testkit::TrialEnv) -> Result<DynBackend> + Send + Sync + 'static {
    move |env| open(plugin, env.dir())
}
