//! The keys a config may hold and how each source's keys are applied.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::*;
use crate::envelope::PageFormat;
use crate::error::{Error, Result, closest_match};
use crate::key::NamingScheme;

/// Kind of an engine key, for type checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EngineKind {
    Int,
    Number,
    Bool,
    Str,
}

/// Who acts on a top-level key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    /// Plugin selection.
    Selection,
    /// The connector (`HiCache`), for every plugin.
    Connector,
    /// FILE plugins (POSIX today).
    FilePlugins,
    /// The metrics exporter a program starts (`hicache::start_metrics`).
    Exporter,
    /// SGLang's own knob of this type: accepted so SGLang configs load, never given to a
    /// plugin.
    Engine(EngineKind),
}

/// One top-level key: the table the loader accepts keys from (a key missing here is
/// "unknown", whatever the code below would do with it) and the config reference lists.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeySpec {
    pub name: &'static str,
    /// The value's type, as the reference shows it.
    pub ty: &'static str,
    /// hicache's environment variable.
    pub env: Option<&'static str>,
    /// SGLang's name for the same environment variable (the hicache name wins).
    pub sglang_env: Option<&'static str>,
    pub reader: Reader,
    pub doc: &'static str,
}

const fn key(name: &'static str, ty: &'static str, reader: Reader, doc: &'static str) -> KeySpec {
    KeySpec {
        name,
        ty,
        env: None,
        sglang_env: None,
        reader,
        doc,
    }
}

impl KeySpec {
    const fn env(mut self, var: &'static str) -> Self {
        self.env = Some(var);
        self
    }

    const fn sglang_env(mut self, var: &'static str) -> Self {
        self.sglang_env = Some(var);
        self
    }
}

const fn engine(name: &'static str, kind: EngineKind, doc: &'static str) -> KeySpec {
    let ty = match kind {
        EngineKind::Int => "integer",
        EngineKind::Number => "number",
        EngineKind::Bool => "bool",
        EngineKind::Str => "string",
    };
    key(name, ty, Reader::Engine(kind), doc)
}

/// Every top-level key, hicache's own first, then SGLang's engine keys.
pub(crate) const KEYS: &[KeySpec] = &[
    key(
        "plugin",
        "`auto` or a plugin name",
        Reader::Selection,
        "the plugin to use; `auto` probes every plugin in this build and takes the best usable one",
    )
    .env("HICACHE_BACKEND_PLUGIN")
    .sglang_env("SGLANG_HICACHE_NIXL_BACKEND_PLUGIN"),
    key(
        "storage_dir",
        "list of paths, or one string split at commas",
        Reader::FilePlugins,
        "storage dirs in routing order (the order is part of where each page lives)",
    )
    .env("HICACHE_STORAGE_DIR")
    .sglang_env("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR"),
    key(
        "plugin_dirs",
        "list of paths, or one string split at commas",
        Reader::Selection,
        "dirs whose `.so` files are loaded as dynamic plugins (the C plugin ABI); only these dirs are searched",
    )
    .env("HICACHE_PLUGIN_DIR"),
    key(
        "use_direct_io",
        "bool",
        Reader::FilePlugins,
        "bypass the page cache (O_DIRECT) where the filesystem allows it",
    )
    .env("HICACHE_USE_DIRECT_IO")
    .sglang_env("SGLANG_HICACHE_NIXL_USE_DIRECT_IO"),
    key(
        "naming",
        "`hicache` or `sglang`",
        Reader::Connector,
        "object names: hicache's (namespaced by everything that changes a page's bytes) or SGLang's",
    )
    .env("HICACHE_NAMING"),
    key(
        "page_format",
        "`envelope` or `raw`",
        Reader::Connector,
        "object framing: a checksummed envelope, or the page bytes alone (SGLang's format)",
    )
    .env("HICACHE_PAGE_FORMAT"),
    key(
        "transfer_mode",
        "`auto` or `bounce`",
        Reader::Connector,
        "zero-copy where the pool allows it (`auto`), or always through staging (`bounce`)",
    )
    .env("HICACHE_TRANSFER_MODE"),
    key(
        "l3_cleaner_enabled",
        "bool",
        Reader::FilePlugins,
        "run the capacity cleaner: one per storage dir among every process sharing it, evicting least recently used pages",
    ),
    key(
        "l3_cleaner_high_watermark",
        "percent (0-100)",
        Reader::FilePlugins,
        "usage (of the filesystem, or of `l3_cleaner_max_bytes`) at which the cleaner starts; must exceed the low watermark",
    ),
    key(
        "l3_cleaner_low_watermark",
        "percent (0-100)",
        Reader::FilePlugins,
        "usage down to which the cleaner evicts",
    ),
    key(
        "l3_cleaner_max_bytes",
        "bytes, or a size such as `500G` / `1.5TiB`; 0 = off",
        Reader::FilePlugins,
        "a budget per storage dir: the watermarks apply to the bytes of stored objects against it instead of the filesystem",
    )
    .env("HICACHE_CLEANER_MAX_BYTES")
    .sglang_env("SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"),
    key(
        "max_size",
        "bytes, or a size such as `500G` / `1.5TiB`; 0 = off",
        Reader::FilePlugins,
        "SGLang's file backend name for `l3_cleaner_max_bytes`",
    ),
    key(
        "l3_cleaner_min_free_bytes",
        "bytes, or a size such as `20G`; 0 = off",
        Reader::FilePlugins,
        "free space the cleaner keeps on each storage dir's filesystem; below it, it evicts until this plus the watermark band is free",
    )
    .env("HICACHE_CLEANER_MIN_FREE_BYTES")
    .sglang_env("SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE"),
    key(
        "min_free_space",
        "bytes, or a size such as `20G`; 0 = off",
        Reader::FilePlugins,
        "SGLang's file backend name for `l3_cleaner_min_free_bytes`",
    ),
    key(
        "l3_cleaner_interval_s",
        "seconds (0.05-86400)",
        Reader::FilePlugins,
        "time between cleaner passes (also how often recorded reads reach the files' access times)",
    ),
    key(
        "l3_cleaner_min_age_s",
        "seconds (0-86400)",
        Reader::FilePlugins,
        "pages written or read more recently than this are never evicted (they may be in flight in another process)",
    ),
    key(
        "l3_cleaner_max_removals_per_s",
        "integer (1-1000000)",
        Reader::FilePlugins,
        "most files the cleaner removes per second (its I/O bound)",
    ),
    key(
        "l3_cleaner_scope",
        "`hicache` or `all`",
        Reader::FilePlugins,
        "what the cleaner may evict: pages under hicache naming only, or every object in the bucket dirs (SGLang-named ones too)",
    ),
    key(
        "metrics_listen",
        "loopback `host:port`; empty = off",
        Reader::Exporter,
        "serve Prometheus text at `http://<addr>/metrics` (loopback only: the exporter has no authentication)",
    )
    .env("HICACHE_METRICS_LISTEN"),
    key(
        "metrics_file",
        "path; empty = off",
        Reader::Exporter,
        "rewrite this file with Prometheus text every `metrics_file_interval_s` (for node_exporter's textfile collector)",
    )
    .env("HICACHE_METRICS_FILE"),
    key(
        "metrics_file_interval_s",
        "seconds (0.1-86400)",
        Reader::Exporter,
        "time between rewrites of `metrics_file`",
    ),
    engine(
        "prefetch_threshold",
        EngineKind::Int,
        "SGLang: the fewest tokens worth prefetching (SGLang's default 256)",
    ),
    engine(
        "prefetch_timeout_base",
        EngineKind::Number,
        "SGLang: base of the prefetch timeout, seconds (SGLang's default 1)",
    ),
    engine(
        "prefetch_timeout_per_ki_token",
        EngineKind::Number,
        "SGLang: prefetch timeout added per 1024 tokens, seconds (SGLang's default 0.25)",
    ),
    engine(
        "hicache_storage_pass_prefix_keys",
        EngineKind::Bool,
        "SGLang: pass the keys of the preceding pages to the storage backend (SGLang's default false)",
    ),
    engine(
        "tp_lcm_size",
        EngineKind::Int,
        "SGLang: a tensor-parallel size its controller removes from the config before a backend sees it",
    ),
    engine(
        "interface_v1",
        EngineKind::Bool,
        "SGLang: drive a `dynamic` backend through the v1 batch interface",
    ),
    engine(
        "backend_name",
        EngineKind::Str,
        "SGLang: the name of a `dynamic` storage backend (hicache's package: `hicache`)",
    ),
    engine(
        "module_path",
        EngineKind::Str,
        "SGLang: the Python module of a `dynamic` storage backend (`hicache.sglang`)",
    ),
    engine(
        "class_name",
        EngineKind::Str,
        "SGLang: the class of a `dynamic` storage backend (`HiCacheBackend`)",
    ),
    engine(
        "file_storage_path",
        EngineKind::Str,
        "SGLang: the HiCacheFile backend's dir (hicache's is `storage_dir`)",
    ),
];

/// The spec of top-level key `name`.
pub(crate) fn key_spec(name: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|k| k.name == name)
}

/// Applies one document. Returns true when it is fully qualified with no active section.
pub(super) fn apply_document(
    cfg: &mut Config,
    map: Map<String, Value>,
    source: &Source,
) -> Result<bool> {
    let fully_qualified = matches!(map.get("plugin"), Some(Value::Object(_)));
    let mut no_active = false;
    for (key, value) in map {
        if key == "plugin" && fully_qualified {
            no_active = !apply_plugin_sections(cfg, value, source)?;
            continue;
        }
        if apply_top_level(cfg, &key, &value, source)? {
            continue;
        }
        if fully_qualified {
            return Err(Error::UnknownConfigKey {
                suggestion: closest_match(&key, known_top_level()),
                key,
                context: format!("the top level of {source}"),
            });
        }
        let raw = raw_value(&key, &value, source)?;
        cfg.flat_params.push(key, raw, source.clone());
    }
    Ok(no_active)
}

pub(crate) fn known_top_level() -> impl Iterator<Item = &'static str> + Clone {
    KEYS.iter().map(|k| k.name)
}

/// Applies `[plugin.<name>]` sections; returns whether one of them is active.
pub(super) fn apply_plugin_sections(
    cfg: &mut Config,
    value: Value,
    source: &Source,
) -> Result<bool> {
    let Value::Object(sections) = value else {
        unreachable!("checked by the caller")
    };
    let mut chosen: Option<String> = None;
    for (name, section) in sections {
        let Value::Object(entries) = section else {
            return Err(Error::invalid_config(
                format!("plugin.{name}"),
                source.to_string(),
                "a plugin section must be a table of parameters",
            ));
        };
        let upper = name.to_ascii_uppercase();
        let mut sec = PluginSection::default();
        for (k, v) in entries {
            if k == "active" {
                let active = strict_bool(&format!("plugin.{name}.active"), &v, source)?;
                sec.active = Some(active);
                if active {
                    match &chosen {
                        None => chosen = Some(upper.clone()),
                        Some(first) => cfg.warnings.push(format!(
                            "{source}: plugin sections {first} and {upper} are both active; using {first} (the first in file order)"
                        )),
                    }
                }
                continue;
            }
            let raw = raw_value(&k, &v, source)?;
            sec.params.push(k, raw, source.clone());
        }
        match cfg.plugin_sections.iter_mut().find(|(n, _)| *n == upper) {
            Some((_, existing)) => {
                if sec.active.is_some() {
                    existing.active = sec.active;
                }
                for (k, s) in sec.params.0 {
                    existing.params.push(k, s.value, s.source);
                }
            }
            None => cfg.plugin_sections.push((upper, sec)),
        }
    }
    if let Some(name) = &chosen {
        cfg.plugin
            .offer(PluginChoice::Named(name.clone()), source.clone());
    }
    Ok(chosen.is_some())
}

/// A list of dirs: a list is taken verbatim (a dir may contain a comma); a string is
/// SGLang's comma-separated form.
fn dir_list(key: &str, value: &Value, source: &Source) -> Result<Vec<PathBuf>> {
    match value {
        Value::Array(items) => check_dir_list(
            key,
            items
                .iter()
                .map(|v| string_value(key, v, source).map(PathBuf::from))
                .collect::<Result<Vec<_>>>()?,
            source,
        ),
        other => parse_dir_list(key, &string_value(key, other, source)?, source),
    }
}

/// Applies a hicache or engine top-level key; returns false if the key is neither.
pub(super) fn apply_top_level(
    cfg: &mut Config,
    key: &str,
    value: &Value,
    source: &Source,
) -> Result<bool> {
    let Some(spec) = key_spec(key) else {
        return Ok(false);
    };
    let src = source.clone();
    if let Reader::Engine(kind) = spec.reader {
        apply_engine_key(cfg, key, kind, value, source)?;
        return Ok(true);
    }
    match key {
        "plugin" => {
            let s = string_value(key, value, source)?;
            cfg.plugin.offer(PluginChoice::parse(&s), src);
        }
        "storage_dir" => {
            cfg.storage_dirs.offer(dir_list(key, value, source)?, src);
        }
        "plugin_dirs" => {
            cfg.plugin_dirs.offer(dir_list(key, value, source)?, src);
        }
        "use_direct_io" => {
            let b = strict_bool(key, value, source)?;
            cfg.use_direct_io.offer(b, src);
        }
        "naming" => {
            let s = string_value(key, value, source)?;
            let scheme = match s.to_ascii_lowercase().as_str() {
                "hicache" => NamingScheme::Hicache,
                "sglang" => NamingScheme::Sglang,
                _ => return Err(one_of(key, &s, source, &["hicache", "sglang"])),
            };
            cfg.naming.offer(scheme, src);
        }
        "page_format" => {
            let s = string_value(key, value, source)?;
            let format = match s.to_ascii_lowercase().as_str() {
                "envelope" => PageFormat::Envelope,
                "raw" => PageFormat::Raw,
                _ => return Err(one_of(key, &s, source, &["envelope", "raw"])),
            };
            cfg.page_format.offer(format, src);
        }
        "transfer_mode" => {
            let s = string_value(key, value, source)?;
            let choice = match s.to_ascii_lowercase().as_str() {
                "auto" => TransferChoice::Auto,
                "bounce" => TransferChoice::Bounce,
                _ => return Err(one_of(key, &s, source, &["auto", "bounce"])),
            };
            cfg.transfer_mode.offer(choice, src);
        }
        "l3_cleaner_enabled" => {
            let b = strict_bool(key, value, source)?;
            cfg.cleaner_enabled.offer(b, src);
        }
        "l3_cleaner_high_watermark" => {
            let x = percent(key, value, source)?;
            cfg.cleaner_high_watermark.offer(x, src);
        }
        "l3_cleaner_low_watermark" => {
            let x = percent(key, value, source)?;
            cfg.cleaner_low_watermark.offer(x, src);
        }
        "l3_cleaner_max_bytes" | "max_size" => {
            let n = size(key, value, source)?;
            cfg.cleaner_max_bytes.offer(n, src);
        }
        "l3_cleaner_min_free_bytes" | "min_free_space" => {
            let n = size(key, value, source)?;
            cfg.cleaner_min_free_bytes.offer(n, src);
        }
        "l3_cleaner_interval_s" => {
            let x = seconds(key, value, source, 0.05)?;
            cfg.cleaner_interval_s.offer(x, src);
        }
        "l3_cleaner_min_age_s" => {
            let x = seconds(key, value, source, 0.0)?;
            cfg.cleaner_min_age_s.offer(x, src);
        }
        "l3_cleaner_max_removals_per_s" => {
            let n = uint_in(key, value, source, 1..=1_000_000)?;
            cfg.cleaner_max_removals_per_s.offer(n, src);
        }
        "l3_cleaner_scope" => {
            let s = string_value(key, value, source)?;
            let scope = match s.to_ascii_lowercase().as_str() {
                "hicache" => crate::capacity::CleanerScope::Hicache,
                "all" => crate::capacity::CleanerScope::All,
                _ => return Err(one_of(key, &s, source, &["hicache", "all"])),
            };
            cfg.cleaner_scope.offer(scope, src);
        }
        "metrics_listen" => {
            let addr = loopback_addr(key, value, source)?;
            cfg.metrics_listen.offer(addr, src);
        }
        "metrics_file" => {
            let path = optional_path(key, value, source)?;
            cfg.metrics_file.offer(path, src);
        }
        "metrics_file_interval_s" => {
            let x = seconds(key, value, source, 0.1)?;
            cfg.metrics_file_interval_s.offer(x, src);
        }
        _ => {
            // A key in the table with no arm above: a bug here, not in the user's config.
            return Err(Error::invalid_config(
                key,
                source.to_string(),
                "hicache lists this key but does not read it (a bug in hicache; please report it)",
            ));
        }
    }
    Ok(true)
}

/// Stores one of SGLang's engine keys after checking its type; it never reaches a plugin.
fn apply_engine_key(
    cfg: &mut Config,
    key: &str,
    kind: EngineKind,
    value: &Value,
    source: &Source,
) -> Result<()> {
    let raw = match kind {
        EngineKind::Int => match value {
            Value::Number(n) if n.is_i64() => RawValue::Int(n.as_i64().unwrap_or(0)),
            _ => return Err(type_error(key, value, source, "an integer")),
        },
        EngineKind::Number => match value.as_f64() {
            Some(x) => RawValue::Float(x),
            None => return Err(type_error(key, value, source, "a number")),
        },
        EngineKind::Bool => RawValue::Bool(strict_bool(key, value, source)?),
        EngineKind::Str => RawValue::Str(string_value(key, value, source)?),
    };
    match cfg.engine.values.get_mut(key) {
        Some(existing) => existing.offer(raw, source.clone()),
        None => {
            cfg.engine.values.insert(
                key.to_string(),
                Setting {
                    value: raw,
                    source: source.clone(),
                    overridden: Vec::new(),
                },
            );
        }
    }
    Ok(())
}

pub(super) fn apply_env(cfg: &mut Config, env: &EnvSnapshot) -> Result<()> {
    for spec in KEYS {
        let Some(name) = spec.env else { continue };
        let alias = spec.sglang_env.unwrap_or_default();
        let primary = env.get_for(name, spec.name)?;
        let secondary = match spec.sglang_env {
            Some(a) => env.get_for(a, spec.name)?,
            None => None,
        };
        let (var, value) = match (primary, secondary) {
            (Some(p), Some(s)) => {
                if p != s {
                    cfg.warnings.push(format!(
                        "{name}={p:?} and its alias {alias}={s:?} disagree; using {name}"
                    ));
                }
                (name, p)
            }
            (Some(p), None) => (name, p),
            (None, Some(s)) => (alias, s),
            (None, None) => continue,
        };
        let source = Source::Env(var.to_string());
        apply_top_level(cfg, spec.name, &Value::String(value.to_string()), &source)?;
    }
    Ok(())
}

pub(super) fn apply_explicit(
    cfg: &mut Config,
    key: &str,
    value: Value,
    source: &Source,
) -> Result<()> {
    if let Some(rest) = key.strip_prefix("plugin.")
        && let Some((plugin, param)) = rest.split_once('.')
    {
        let mut section = Map::new();
        section.insert(param.to_string(), value);
        let mut sections = Map::new();
        sections.insert(plugin.to_string(), Value::Object(section));
        apply_plugin_sections(cfg, Value::Object(sections), source)?;
        return Ok(());
    }
    if !apply_top_level(cfg, key, &value, source)? {
        return Err(Error::UnknownConfigKey {
            key: key.to_string(),
            context: "explicit settings".into(),
            suggestion: closest_match(key, known_top_level()),
        });
    }
    Ok(())
}

/// The plugins keys are checked against: each plugin's name and parameter names.
pub(crate) type KnownPlugins = Vec<(&'static str, Vec<&'static str>)>;

/// Checks every plugin key against the plugins of this build: a flat (top-level) key must
/// be a parameter of one of them, and a `[plugin.<name>]` section of one of them may hold
/// only that plugin's parameters. A section of a plugin this build lacks is left alone (a
/// shared config may carry sections for other builds); selecting that plugin fails later,
/// naming the Cargo feature.
pub(crate) fn check_plugin_keys(cfg: &Config, plugins: &KnownPlugins) -> Result<()> {
    let takes = |key: &str| plugins.iter().any(|(_, params)| params.contains(&key));
    if let Some((key, setting)) = cfg.flat_params.iter().find(|(key, _)| !takes(key)) {
        let names: Vec<&str> = plugins.iter().map(|(name, _)| *name).collect();
        let every_param = plugins
            .iter()
            .flat_map(|(_, params)| params.iter().copied());
        return Err(Error::UnknownConfigKey {
            key: key.to_string(),
            context: format!(
                "the top level of {} (neither a hicache key nor a parameter of a plugin in this build: {})",
                setting.source,
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
            suggestion: closest_match(key, known_top_level().chain(every_param)),
        });
    }
    for (section_name, section) in &cfg.plugin_sections {
        let Some((plugin, params)) = plugins
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(section_name))
        else {
            continue;
        };
        if let Some((key, setting)) = section.params.iter().find(|(k, _)| !params.contains(k)) {
            return Err(Error::UnknownConfigKey {
                key: key.to_string(),
                context: format!(
                    "[plugin.{}] of {} (plugin {plugin} accepts: {})",
                    section_name.to_ascii_lowercase(),
                    setting.source,
                    params.join(", ")
                ),
                suggestion: closest_match(key, params.iter().copied()),
            });
        }
    }
    Ok(())
}
