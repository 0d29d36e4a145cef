//! The whole conformance suite against the C example plugin, compiled with the system's
//! C compiler and loaded from a plugin dir at run time.

mod support;

hicache_testkit::conformance_suite!("CFILE", |env: &hicache_testkit::TrialEnv| {
    static PLUGIN: std::sync::OnceLock<&'static hicache_core::raw::PluginDescriptor> =
        std::sync::OnceLock::new();
    let plugin = PLUGIN.get_or_init(|| {
        let (_, file) = support::c_plugin("cfile", &[]);
        hicache_abi::load_file(&file).expect("the C example loads")
    });
    support::open(plugin, env.dir())
});
