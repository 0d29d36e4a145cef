//! One typed configuration, filled from defaults → config file → environment → explicit
//! values, where every value remembers where it came from.
//!
//! Both of SGLang's `extra_config` forms are accepted:
//! - fully qualified: `[plugin.posix] active = true …` (the first active section, in file
//!   order, picks the plugin; its keys are that plugin's parameters);
//! - flat: top-level keys; the ones that are not hicache's own are parameters of the chosen
//!   plugin, checked against what that plugin accepts.
//!
//! Unlike SGLang: booleans are strict (`"false"` is false, `"maybe"` is an error), unknown keys
//! are errors with a suggestion, engine-only keys (`prefetch_threshold`, `interface_v1`, …)
//! never reach a plugin, `active` is not forwarded, and a fully-qualified config with no active
//! section is a clear error.

mod dirs;
mod display;
mod keys;
mod loader;
mod source;
mod values;

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::envelope::PageFormat;
use crate::key::NamingScheme;

use dirs::render_dirs;
use display::redact_if_secret;
use keys::{apply_document, apply_env, apply_explicit};
use values::{
    loopback_addr, one_of, optional_path, percent, raw_value, seconds, size, strict_bool,
    string_value, type_error, uint_in,
};

pub(crate) use dirs::{check_dir_list, parse_dir_list};
pub use display::ConfigEntry;
pub(crate) use display::looks_secret;
#[cfg(test)]
pub(crate) use keys::EngineKind;
pub(crate) use keys::{KEYS, KeySpec, KnownPlugins, Reader, check_plugin_keys, known_top_level};
pub use loader::{ConfigLoader, EnvSnapshot};
pub use source::{Setting, Source};
pub(crate) use values::parse_bool;
pub use values::{EngineKeys, Params, PluginSection, RawValue};

/// Default storage dir (SGLang's NIXL default).
pub const DEFAULT_STORAGE_DIR: &str = "/tmp/hicache_storage";

/// Which plugin to use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginChoice {
    /// Probe plugins and take the best usable one.
    Auto,
    /// This plugin, or an error saying why it cannot be used. Stored upper-case.
    Named(String),
}

impl PluginChoice {
    /// Parses a plugin name; `auto` in any case means auto.
    pub fn parse(s: &str) -> Self {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") || s.is_empty() {
            PluginChoice::Auto
        } else {
            PluginChoice::Named(s.to_ascii_uppercase())
        }
    }
}

impl fmt::Display for PluginChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginChoice::Auto => f.write_str("auto"),
            PluginChoice::Named(n) => f.write_str(n),
        }
    }
}

/// How the connector may move a pool's pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransferChoice {
    /// Zero-copy where the pool's spans meet the plugin's alignment and segment limits,
    /// bounce through staging otherwise (the default).
    #[default]
    Auto,
    /// Always through staging: for plugins or storage that mishandle scattered segments,
    /// and so that tests exercise the bounce path on every backend.
    Bounce,
}

impl std::fmt::Display for TransferChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransferChoice::Auto => "auto",
            TransferChoice::Bounce => "bounce",
        })
    }
}

/// The effective configuration. `Debug` never shows credentials.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Which plugin.
    pub plugin: Setting<PluginChoice>,
    /// Storage dirs of FILE plugins, in routing order (order is part of routing).
    pub storage_dirs: Setting<Vec<PathBuf>>,
    /// Directories dynamic plugins (`.so` files exporting the C plugin ABI) are loaded from;
    /// empty: none are loaded.
    pub plugin_dirs: Setting<Vec<PathBuf>>,
    /// Bypass the page cache.
    pub use_direct_io: Setting<bool>,
    /// Object naming scheme.
    pub naming: Setting<NamingScheme>,
    /// Object framing.
    pub page_format: Setting<PageFormat>,
    /// Whether aligned pools may move zero-copy (`auto`) or always go through staging
    /// (`bounce`).
    pub transfer_mode: Setting<TransferChoice>,
    /// Capacity cleaner on/off.
    pub cleaner_enabled: Setting<bool>,
    /// Cleaner starts above this disk usage, percent.
    pub cleaner_high_watermark: Setting<f64>,
    /// Cleaner stops below this disk usage, percent.
    pub cleaner_low_watermark: Setting<f64>,
    /// Bytes of objects a storage dir may hold (0: no budget; the filesystem's size counts).
    pub cleaner_max_bytes: Setting<u64>,
    /// Free bytes the cleaner keeps on each storage dir's filesystem (0: none).
    pub cleaner_min_free_bytes: Setting<u64>,
    /// Seconds between cleaner passes.
    pub cleaner_interval_s: Setting<f64>,
    /// Seconds after its last use during which a page is never evicted.
    pub cleaner_min_age_s: Setting<f64>,
    /// Most files the cleaner removes per second.
    pub cleaner_max_removals_per_s: Setting<u64>,
    /// Which objects the cleaner may evict.
    pub cleaner_scope: Setting<crate::capacity::CleanerScope>,
    /// Loopback address the Prometheus exporter serves `/metrics` on.
    pub metrics_listen: Setting<Option<std::net::SocketAddr>>,
    /// File the Prometheus exporter rewrites with the current metrics.
    pub metrics_file: Setting<Option<PathBuf>>,
    /// Seconds between rewrites of `metrics_file`.
    pub metrics_file_interval_s: Setting<f64>,
    /// Fully-qualified plugin sections, keyed upper-case, in file order.
    pub plugin_sections: Vec<(String, PluginSection)>,
    /// Flat-form parameters for whichever plugin is chosen.
    pub flat_params: Params,
    /// Engine keys (not forwarded to plugins).
    pub engine: EngineKeys,
    /// Things worth telling the user (alias conflicts, several active sections, …).
    pub warnings: Vec<String>,
    /// The environment the config was loaded with (for plugin env fallbacks).
    env: EnvSnapshot,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            plugin: Setting::default_value(PluginChoice::Auto),
            storage_dirs: Setting::default_value(vec![PathBuf::from(DEFAULT_STORAGE_DIR)]),
            plugin_dirs: Setting::default_value(Vec::new()),
            use_direct_io: Setting::default_value(true),
            naming: Setting::default_value(NamingScheme::Hicache),
            page_format: Setting::default_value(PageFormat::Envelope),
            transfer_mode: Setting::default_value(TransferChoice::Auto),
            cleaner_enabled: Setting::default_value(true),
            cleaner_high_watermark: Setting::default_value(80.0),
            cleaner_low_watermark: Setting::default_value(70.0),
            cleaner_max_bytes: Setting::default_value(0),
            cleaner_min_free_bytes: Setting::default_value(0),
            cleaner_interval_s: Setting::default_value(30.0),
            cleaner_min_age_s: Setting::default_value(60.0),
            cleaner_max_removals_per_s: Setting::default_value(2000),
            cleaner_scope: Setting::default_value(crate::capacity::CleanerScope::Hicache),
            metrics_listen: Setting::default_value(None),
            metrics_file: Setting::default_value(None),
            metrics_file_interval_s: Setting::default_value(10.0),
            plugin_sections: Vec::new(),
            flat_params: Params::default(),
            engine: EngineKeys::default(),
            warnings: Vec::new(),
            env: EnvSnapshot::default(),
        }
    }
}

#[cfg(test)]
mod tests;
