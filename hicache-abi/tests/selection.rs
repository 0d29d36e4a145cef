//! A loaded plugin joins selection exactly like a built-in one: `auto` probes it in
//! priority order, a config names it, its parameters are checked, and the registry opens it.

mod support;

use hicache_core::raw::{
    BackendKind, DynBackend, PluginContext, PluginDescriptor, PluginOrigin, Probe,
};
use hicache_core::{ConfigLoader, Error, PluginRegistry, Result};

fn builtin_unusable(_: &PluginContext<'_>) -> Probe {
    Probe::unusable("not on this machine", "none")
}

fn builtin_build(_: &PluginContext<'_>) -> Result<DynBackend> {
    Err(Error::backend("BUILTIN", "never built"))
}

static BUILTIN: PluginDescriptor = PluginDescriptor::new(
    "BUILTIN",
    BackendKind::File,
    "a built-in plugin of this test, unusable here",
    builtin_unusable,
    builtin_build,
)
.with_priority(300);

#[test]
fn auto_selects_a_loaded_plugin_by_priority_and_opens_it() {
    let (_, file) = support::c_plugin(
        "selected",
        &[
            "HICACHE_PLUGIN_NAME=\"SELECTED\"",
            "HICACHE_PLUGIN_PRIORITY=350",
        ],
    );
    let loaded = hicache_abi::load_file(&file).unwrap();
    assert_eq!(loaded.priority, 350);
    assert!(matches!(loaded.origin, PluginOrigin::File(p) if p == file));
    let registry = PluginRegistry::from_descriptors([&BUILTIN, loaded]).unwrap();
    assert_eq!(
        registry.plugins()[0].name,
        "SELECTED",
        "higher priority is tried first"
    );

    let store = tempfile::tempdir().unwrap();
    let config = ConfigLoader::new()
        .set("storage_dir", store.path().to_str().unwrap())
        .load()
        .unwrap();
    let (backend, selection) = registry.open(&config).unwrap();
    assert_eq!(selection.plugin.name, "SELECTED");
    assert_eq!(backend.info().name, "SELECTED");
    assert!(
        backend.info().location.ends_with("cfile"),
        "{}",
        backend.info().location
    );

    // Named, with a parameter of the wrong type: refused before the plugin is asked.
    let bad = ConfigLoader::new()
        .set("storage_dir", store.path().to_str().unwrap())
        .set("plugin", "selected")
        .set("plugin.selected.fsync", "sometimes")
        .load()
        .unwrap();
    let e = registry.open(&bad).unwrap_err();
    assert!(e.to_string().contains("fsync"), "{e}");

    // A storage dir C cannot carry (a NUL byte) makes the plugin unusable, not a panic.
    let nul = ConfigLoader::new()
        .set("storage_dir", "/tmp/a\u{0}b")
        .set("plugin", "selected")
        .load()
        .unwrap();
    let e = registry.open(&nul).unwrap_err();
    assert!(e.to_string().contains("NUL byte"), "{e}");

    // A probe that fails says why, in the plugin's words.
    let missing = ConfigLoader::new()
        .set("storage_dir", "/proc/no-such-dir/kv")
        .set("plugin", "selected")
        .load()
        .unwrap();
    let e = registry.open(&missing).unwrap_err();
    assert!(
        matches!(&e, Error::PluginUnusable { reason, .. } if reason.contains("/proc/no-such-dir/kv")),
        "{e:?}"
    );
}
