//! The whole conformance suite against the Rust example plugin (`examples/kvdir.rs`,
//! exported with `export_plugin!`), loaded from a plugin dir at run time.

mod support;

hicache_testkit::conformance_suite!("KVDIR", |env: &hicache_testkit::TrialEnv| {
    static PLUGIN: std::sync::OnceLock<&'static hicache_core::raw::PluginDescriptor> =
        std::sync::OnceLock::new();
    let plugin = PLUGIN.get_or_init(|| {
        let (_, file) = support::rust_plugin("kvdir");
        hicache_abi::load_file(&file).expect("the Rust example loads")
    });
    support::open(plugin, env.dir())
});
