#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub use hicache_core::*;

#[cfg(feature = "3fs")]
pub use hicache_3fs as threefs;
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
        #[cfg(feature = "obj")]
        &hicache_obj::DESCRIPTOR,
    ]
    .into_iter()
    .collect()
}

/// The registry of this build: the built-in plugins plus any registered through inventory.
pub fn registry() -> Result<PluginRegistry> {
    PluginRegistry::new(&builtin_plugins())
}

/// Selects and builds a plugin for `config` and returns the connector.
pub fn open(config: Config, options: HiCacheOptions) -> Result<HiCache> {
    HiCache::open(&registry()?, config, options)
}

#[cfg(test)]
mod tests {
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
    }
}
