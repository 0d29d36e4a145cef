//! The config reference: every key a config may hold, built from the two tables validation
//! checks against (hicache's top-level keys and each plugin's declared parameters), so the
//! reference cannot list a key the loader refuses or miss one it accepts.

use std::fmt::Write as _;

use serde::Serialize;

use crate::backend::BackendKind;
use crate::config::{Config, KEYS, KeySpec, Reader};
use crate::params::{ParamKind, ParamSpec};
use crate::registry::PluginDescriptor;

/// One key of the config reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ConfigKey {
    /// The key as a config file writes it: `storage_dir`, or `plugin.<name>.<param>` for a
    /// plugin parameter (which the flat form also accepts at the top level as `<param>`).
    pub key: String,
    /// The plugin whose parameter this is; `None` for hicache's own and SGLang's keys.
    pub plugin: Option<String>,
    /// What the value may be.
    pub ty: String,
    /// The value used when no source sets it; `None` when unset means absent.
    pub default: Option<String>,
    /// Environment variables read for it, highest precedence first. For hicache's keys they
    /// rank above config files; a plugin's fallbacks rank below every config source.
    pub env: Vec<String>,
    /// SGLang's name for the environment variable (read when hicache's is unset).
    pub sglang_env: Option<String>,
    /// What acts on the value.
    pub read_by: String,
    /// A credential: never logged or shown.
    pub secret: bool,
    /// What it means.
    pub doc: String,
}

/// Every key a config may hold in a build with `plugins`: hicache's top-level keys, SGLang's
/// engine keys, then each plugin's parameters in declaration order.
pub fn config_keys(plugins: &[&PluginDescriptor]) -> Vec<ConfigKey> {
    let file_plugins: Vec<&str> = plugins
        .iter()
        .filter(|p| p.kind == BackendKind::File)
        .map(|p| p.name)
        .collect();
    // Defaults as `config show` prints them: the reference cannot drift from the code.
    let defaults = Config::default().entries();
    let mut out: Vec<ConfigKey> = KEYS
        .iter()
        .map(|k| {
            let default = defaults
                .iter()
                .find(|e| e.key == k.name)
                .map(|e| e.value.clone());
            top_level(k, default, &file_plugins)
        })
        .collect();
    for plugin in plugins {
        out.extend(plugin.params.iter().map(|p| parameter(plugin, p)));
    }
    out
}

fn top_level(k: &KeySpec, default: Option<String>, file_plugins: &[&str]) -> ConfigKey {
    let read_by = match k.reader {
        Reader::Selection => "plugin selection".to_string(),
        Reader::Connector => "the connector, for every plugin".to_string(),
        Reader::FilePlugins if file_plugins.is_empty() => {
            "FILE plugins (none in this build)".to_string()
        }
        Reader::FilePlugins => format!("FILE plugins: {}", file_plugins.join(", ")),
        Reader::Exporter => "the metrics exporter (`hicache::start_metrics`)".to_string(),
        Reader::Engine(_) => "SGLang; never given to a plugin".to_string(),
    };
    ConfigKey {
        key: k.name.to_string(),
        plugin: None,
        ty: k.ty.to_string(),
        default,
        env: k.env.into_iter().map(str::to_string).collect(),
        sglang_env: k.sglang_env.map(str::to_string),
        read_by,
        secret: false,
        doc: k.doc.to_string(),
    }
}

fn parameter(plugin: &PluginDescriptor, p: &ParamSpec) -> ConfigKey {
    ConfigKey {
        key: format!("plugin.{}.{}", plugin.name.to_ascii_lowercase(), p.name),
        plugin: Some(plugin.name.to_string()),
        ty: kind_name(p.kind),
        default: p.default.map(str::to_string),
        env: p.env_fallback.iter().map(|v| v.to_string()).collect(),
        sglang_env: None,
        read_by: format!("plugin {}", plugin.name),
        secret: p.secret,
        doc: p.doc.to_string(),
    }
}

fn kind_name(kind: ParamKind) -> String {
    match kind {
        ParamKind::Bool => "bool".into(),
        ParamKind::UInt => "unsigned integer".into(),
        ParamKind::Float => "number".into(),
        ParamKind::Str => "string".into(),
        ParamKind::OneOf(choices) => {
            let quoted: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
            match quoted.split_last() {
                Some((last, rest)) if !rest.is_empty() => {
                    format!("{} or {last}", rest.join(", "))
                }
                _ => quoted.join(""),
            }
        }
    }
}

/// The reference as Markdown: one table of top-level keys, one per plugin.
pub fn config_keys_markdown(keys: &[ConfigKey]) -> String {
    let mut out = String::from(
        "# Config reference\n\n\
         Generated from the tables config validation checks against (`hicache config keys \
         --markdown`); a test fails when this file and the code disagree.\n\n\
         Precedence, lowest first: defaults, config files (in the order given), environment \
         variables, explicit settings (API and command-line flags). A plugin's environment \
         fallbacks rank below every config source. An unknown key is an error naming it and the \
         closest known key, if one is close: at load for a loader that knows the build's plugins \
         (`hicache::config()`), at plugin selection otherwise.\n\n\
         A config file is a regular `.toml` or `.json` file of at most 1 MiB (anything else, a \
         FIFO or a device say, is refused with its path). An empty environment variable counts \
         as unset; one whose value is not UTF-8 is an error naming it where hicache reads it \
         (others are ignored).\n\n\
         ## Top-level keys\n\n",
    );
    table(&mut out, keys.iter().filter(|k| k.plugin.is_none()));
    let mut plugins: Vec<&str> = keys.iter().filter_map(|k| k.plugin.as_deref()).collect();
    plugins.dedup();
    for plugin in plugins {
        let _ = write!(
            out,
            "\n## Plugin {plugin}\n\n\
             In `[plugin.{lower}]`, or at the top level (the flat form) when {plugin} is the \
             plugin in use.\n\n",
            lower = plugin.to_ascii_lowercase()
        );
        table(
            &mut out,
            keys.iter().filter(|k| k.plugin.as_deref() == Some(plugin)),
        );
    }
    out
}

fn table<'a>(out: &mut String, keys: impl Iterator<Item = &'a ConfigKey>) {
    out.push_str("| key | type | default | environment | read by | meaning |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for k in keys {
        let name = k.key.rsplit('.').next().unwrap_or(&k.key);
        let mut env: Vec<String> = k.env.iter().map(|v| format!("`{v}`")).collect();
        if let Some(alias) = &k.sglang_env {
            env.push(format!("`{alias}` (SGLang)"));
        }
        let doc = if k.secret {
            format!("{} (secret: never shown)", k.doc)
        } else {
            k.doc.clone()
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} | {} | {} |",
            cell(&k.ty),
            k.default.as_deref().map_or("-".into(), cell),
            if env.is_empty() {
                "-".into()
            } else {
                env.join(", ")
            },
            cell(&k.read_by),
            cell(&doc),
        );
    }
}

/// Text safe inside a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigLoader;

    /// A value of the key's type, as a config file writes it.
    fn sample(k: &KeySpec) -> serde_json::Value {
        use crate::config::EngineKind;
        match (k.name, k.reader) {
            ("plugin", _) => "posix".into(),
            ("storage_dir", _) => "/tmp/reference-sample".into(),
            ("plugin_dirs", _) => "/tmp/reference-plugins".into(),
            ("naming", _) => "sglang".into(),
            ("page_format", _) => "raw".into(),
            ("transfer_mode", _) => "bounce".into(),
            ("l3_cleaner_high_watermark", _) => 90.into(),
            ("l3_cleaner_low_watermark", _) => 60.into(),
            ("l3_cleaner_max_bytes" | "max_size", _) => "10GiB".into(),
            ("l3_cleaner_min_free_bytes" | "min_free_space", _) => "1G".into(),
            ("l3_cleaner_interval_s" | "l3_cleaner_min_age_s", _) => 5.into(),
            ("l3_cleaner_max_removals_per_s", _) => 100.into(),
            ("l3_cleaner_scope", _) => "all".into(),
            ("metrics_listen", _) => "127.0.0.1:9464".into(),
            ("metrics_file", _) => "/tmp/reference-sample.prom".into(),
            ("metrics_file_interval_s", _) => 2.into(),
            (_, Reader::Engine(EngineKind::Int)) => 7.into(),
            (_, Reader::Engine(EngineKind::Number)) => 1.5.into(),
            (_, Reader::Engine(EngineKind::Str)) => "x".into(),
            _ => false.into(),
        }
    }

    /// Every key the reference lists is one the loader takes and shows with its source: a
    /// listed key the loader ignores, or one it refuses, fails here. (The other direction
    /// holds by construction: the loader looks a key up in the same table before reading
    /// it, and plugins read only the parameters they declare.)
    #[test]
    fn every_listed_key_is_read_and_shown_with_its_source() {
        for k in KEYS {
            let config = ConfigLoader::new()
                .set(k.name, sample(k))
                .load()
                .unwrap_or_else(|e| panic!("{}: {e}", k.name));
            let shown = match (k.reader, k.name) {
                (Reader::Engine(_), _) => format!("engine.{}", k.name),
                // SGLang's file backend names, shown under hicache's.
                (_, "max_size") => "l3_cleaner_max_bytes".into(),
                (_, "min_free_space") => "l3_cleaner_min_free_bytes".into(),
                _ => k.name.to_string(),
            };
            let entry = config
                .entries()
                .into_iter()
                .find(|e| e.key == shown)
                .unwrap_or_else(|| panic!("{} is not shown", k.name));
            assert_eq!(entry.source, crate::Source::Api, "{}", k.name);
        }
    }

    #[test]
    fn every_listed_environment_variable_is_read() {
        for k in KEYS {
            for var in k.env.iter().chain(k.sglang_env.iter()) {
                let value = match sample(k) {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                let env = crate::EnvSnapshot::from_pairs([(*var, value)]);
                let config = ConfigLoader::new().env(env).load().unwrap();
                let entry = config.entries().into_iter().find(|e| e.key == k.name);
                assert_eq!(
                    entry.map(|e| e.source),
                    Some(crate::Source::Env(var.to_string())),
                    "{var}"
                );
            }
        }
    }

    #[test]
    fn a_key_outside_the_table_is_unknown() {
        let e = ConfigLoader::new()
            .set("storage_dri", "/x")
            .load()
            .unwrap_err();
        assert!(e.to_string().contains("did you mean `storage_dir`"), "{e}");
    }

    #[test]
    fn markdown_lists_every_key_once() {
        let keys = config_keys(&[]);
        let md = config_keys_markdown(&keys);
        for k in KEYS {
            assert_eq!(
                md.matches(&format!("| `{}` |", k.name)).count(),
                1,
                "{}",
                k.name
            );
        }
        assert!(md.contains("FILE plugins (none in this build)"));
    }

    #[test]
    fn one_of_reads_as_a_list() {
        assert_eq!(
            kind_name(ParamKind::OneOf(&["a", "b", "c"])),
            "`a`, `b` or `c`"
        );
        assert_eq!(kind_name(ParamKind::OneOf(&["a"])), "`a`");
    }
}
