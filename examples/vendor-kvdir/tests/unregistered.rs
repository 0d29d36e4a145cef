//! The linking trap, proven and reported: this test program has KVDIR as a dependency (it
//! is in `Cargo.toml`, with its `register_plugin!`) but never names it, so the linker drops
//! it. A config that asks for KVDIR then gets a warning or an error that names the cause
//! and the fix, never a silent switch to another plugin.

use hicache_core::{ConfigLoader, PluginRegistry};

#[test]
fn a_dependency_never_named_is_reported_when_the_config_asks_for_it() {
    let registry = PluginRegistry::new(&[]).unwrap();
    assert!(
        registry.get("KVDIR").is_none(),
        "KVDIR was linked although nothing names it; this test no longer shows the trap"
    );

    let dir = tempfile::tempdir().unwrap();
    let config = ConfigLoader::new()
        .set("storage_dir", dir.path().to_str().unwrap())
        .set("plugin.kvdir.sync", false)
        .load()
        .unwrap();
    let warnings = registry.unregistered_sections(&config);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("[plugin.kvdir]")
            && warnings[0].contains("dropped by the linker")
            && warnings[0].contains("DESCRIPTOR"),
        "{}",
        warnings[0]
    );

    let named = ConfigLoader::new()
        .set("storage_dir", dir.path().to_str().unwrap())
        .set("plugin", "kvdir")
        .load()
        .unwrap();
    let e = registry.select(&named).unwrap_err().to_string();
    assert!(
        e.contains("unknown plugin `KVDIR`") && e.contains("dropped by the linker"),
        "{e}"
    );
}
