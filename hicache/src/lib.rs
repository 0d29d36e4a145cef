#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub use hicache_core::*;

mod exporter;
pub use exporter::{MetricsExporter, start_metrics, start_rank_metrics};

#[cfg(feature = "3fs")]
pub use hicache_3fs as threefs;
#[cfg(feature = "dynamic")]
pub use hicache_abi as abi;
#[cfg(feature = "gds")]
pub use hicache_gds as gds;
#[cfg(feature = "obj")]
pub use hicache_obj as obj;
#[cfg(feature = "posix")]
pub use hicache_posix as posix;

/// Every plugin compiled into this build, named directly.
///
/// Naming each descriptor forces its crate to be linked (inventory entries of an rlib that
/// nothing references are dropped) and serves callers where static constructors do not run.
pub fn builtin_plugins() -> Vec<&'static raw::PluginDescriptor> {
    [
        #[cfg(feature = "posix")]
        &hicache_posix::DESCRIPTOR,
        #[cfg(feature = "gds")]
        &hicache_gds::GDS_MT_DESCRIPTOR,
        #[cfg(feature = "gds")]
        &hicache_gds::GDS_DESCRIPTOR,
        #[cfg(feature = "3fs")]
        &hicache_3fs::DESCRIPTOR,
        #[cfg(feature = "obj")]
        &hicache_obj::DESCRIPTOR,
    ]
    .into_iter()
    .collect()
}

/// The registry of this process without a config: the built-in plugins, any registered
/// through inventory, and the dynamic plugins of the dirs in `HICACHE_PLUGIN_DIR` (comma
/// separated). With a config, use [`registry_for`], which honours its `plugin_dirs`.
pub fn registry() -> Result<PluginRegistry> {
    let dirs: Vec<std::path::PathBuf> = EnvSnapshot::from_process()
        .get_for("HICACHE_PLUGIN_DIR", "plugin_dirs")?
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(Into::into)
        .collect();
    with_dynamic(PluginRegistry::new(&builtin_plugins())?, &dirs)
}

/// The registry for `config`: the built-in plugins, any registered through inventory, and
/// the dynamic plugins of its `plugin_dirs` (which `HICACHE_PLUGIN_DIR` sets). Plugin
/// files that could not be loaded are in [`PluginRegistry::rejected`], each with its
/// reason.
pub fn registry_for(config: &Config) -> Result<PluginRegistry> {
    registry_with(config, &[])
}

/// [`registry_for`] with `extra` plugins beside this build's: what a program that links
/// its own plugin in (a vendor's `hicache` command) selects from.
pub fn registry_with(
    config: &Config,
    extra: &[&'static raw::PluginDescriptor],
) -> Result<PluginRegistry> {
    let mut builtin = builtin_plugins();
    builtin.extend_from_slice(extra);
    with_dynamic(PluginRegistry::new(&builtin)?, &config.plugin_dirs.value)
}

/// A config loader that knows this build's plugins and `extra` ones (see [`config`]).
pub fn config_with(extra: &[&'static raw::PluginDescriptor]) -> ConfigLoader {
    let mut plugins = match registry() {
        Ok(registry) => registry.plugins().to_vec(),
        Err(_) => builtin_plugins(),
    };
    for e in extra {
        if !plugins.iter().any(|p| std::ptr::eq(*p, *e)) {
            plugins.push(e);
        }
    }
    ConfigLoader::new().plugins(&plugins)
}

/// `registry` plus the plugins loaded from `dirs`.
#[cfg(feature = "dynamic")]
fn with_dynamic(registry: PluginRegistry, dirs: &[std::path::PathBuf]) -> Result<PluginRegistry> {
    if dirs.is_empty() {
        return Ok(registry);
    }
    let loaded = hicache_abi::load_dirs(dirs, registry.plugins());
    let rejected = loaded.rejected.iter().map(hicache_abi::LoadError::rejected);
    for r in loaded.rejected.iter() {
        tracing::warn!("{r}");
    }
    Ok(
        PluginRegistry::from_descriptors(registry.plugins().iter().copied().chain(loaded.plugins))?
            .with_rejected(rejected),
    )
}

/// Without the `dynamic` feature, each plugin dir is reported, not silently ignored.
#[cfg(not(feature = "dynamic"))]
fn with_dynamic(registry: PluginRegistry, dirs: &[std::path::PathBuf]) -> Result<PluginRegistry> {
    Ok(registry.with_rejected(dirs.iter().map(|dir| raw::Rejected {
        path: dir.clone(),
        reason: "this build cannot load dynamic plugins; enable the `dynamic` feature of the `hicache` crate".into(),
    })))
}

/// A config loader that knows this build's plugins: a key that is neither hicache's own
/// nor a parameter of one of them fails [`ConfigLoader::load`] with one error naming it
/// and the closest known key. Add sources as on [`ConfigLoader::new`].
///
/// ```
/// let config = hicache::config().set("storage_dri", "/data").load();
/// assert!(config.unwrap_err().to_string().contains("did you mean `storage_dir`"));
/// ```
pub fn config() -> ConfigLoader {
    // Two plugins under one name: `open` reports it; keys are checked against the
    // built-ins meanwhile.
    config_with(&[])
}

/// The config reference of this build: hicache's keys and every compiled plugin's
/// parameters (what `hicache config keys` prints). The reference for every plugin is
/// [`config_reference`].
pub fn reference() -> Vec<ConfigKey> {
    config_keys(&builtin_plugins())
}

#[doc = include_str!("../CONFIG.md")]
pub mod config_reference {}

/// Selects and builds a plugin for `config` (from [`registry_for`] it) and returns the
/// connector; starts the metrics exporter the config asks for first
/// ([`start_rank_metrics`] for the options' identity).
pub fn open(config: Config, options: HiCacheOptions) -> Result<HiCache> {
    start_rank_metrics(&config, &options.identity)?;
    HiCache::open(&registry_for(&config)?, config, options)
}

#[cfg(test)]
mod tests {
    /// CONFIG.md is the reference of a build with every plugin that exists; a change to a
    /// key table or a plugin's parameters that is not carried into it fails here.
    #[test]
    #[cfg(all(feature = "posix", feature = "obj", feature = "gds", feature = "3fs"))]
    fn config_md_is_the_generated_reference() {
        let generated = crate::config_keys_markdown(&super::reference());
        let committed = include_str!("../CONFIG.md");
        if generated != committed {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/CONFIG.md");
            panic!(
                "{path} is out of date; regenerate it with\n  cargo run -p hicache-cli --features obj,gds,3fs -- config keys --markdown > hicache/CONFIG.md\n\ngenerated:\n{generated}"
            );
        }
    }

    #[test]
    fn every_enabled_feature_registers_its_plugin() {
        let registry = super::registry().unwrap();
        let names: Vec<&str> = registry.plugins().iter().map(|p| p.name).collect();
        if cfg!(feature = "posix") {
            assert!(names.contains(&"POSIX"), "{names:?}");
        }
        if cfg!(feature = "obj") {
            assert!(names.contains(&"OBJ"), "{names:?}");
        }
        if cfg!(feature = "3fs") {
            assert!(names.contains(&"3FS"), "{names:?}");
        }
        if cfg!(feature = "gds") {
            assert!(
                names.contains(&"GDS") && names.contains(&"GDS_MT"),
                "{names:?}"
            );
        }
    }
}
