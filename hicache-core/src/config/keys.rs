//! The keys a config may hold and how each source's keys are applied.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::*;
use crate::envelope::PageFormat;
use crate::error::{Error, Result, closest_match};
use crate::key::NamingScheme;

/// Kind of an engine key, for type checks.
#[derive(Clone, Copy)]
pub(super) enum EngineKind {
    Int,
    Number,
    Bool,
    Str,
}

pub(super) const ENGINE_KEYS: &[(&str, EngineKind)] = &[
    ("prefetch_threshold", EngineKind::Int),
    ("prefetch_timeout_base", EngineKind::Number),
    ("prefetch_timeout_per_ki_token", EngineKind::Number),
    ("hicache_storage_pass_prefix_keys", EngineKind::Bool),
    ("tp_lcm_size", EngineKind::Int),
    ("interface_v1", EngineKind::Bool),
    ("file_storage_path", EngineKind::Str),
];

/// hicache's own top-level keys.
pub(crate) const TOP_LEVEL_KEYS: &[&str] = &[
    "plugin",
    "storage_dir",
    "use_direct_io",
    "naming",
    "page_format",
    "transfer_mode",
    "l3_cleaner_enabled",
    "l3_cleaner_high_watermark",
    "l3_cleaner_low_watermark",
];

/// Environment variables read, each with its SGLang alias (the hicache name wins).
pub(crate) const ENV_VARS: &[(&str, &str, &str)] = &[
    (
        "plugin",
        "HICACHE_BACKEND_PLUGIN",
        "SGLANG_HICACHE_NIXL_BACKEND_PLUGIN",
    ),
    (
        "storage_dir",
        "HICACHE_STORAGE_DIR",
        "SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR",
    ),
    (
        "use_direct_io",
        "HICACHE_USE_DIRECT_IO",
        "SGLANG_HICACHE_NIXL_USE_DIRECT_IO",
    ),
    ("naming", "HICACHE_NAMING", ""),
    ("page_format", "HICACHE_PAGE_FORMAT", ""),
    ("transfer_mode", "HICACHE_TRANSFER_MODE", ""),
];

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

pub(super) fn known_top_level() -> impl Iterator<Item = &'static str> {
    TOP_LEVEL_KEYS
        .iter()
        .copied()
        .chain(ENGINE_KEYS.iter().map(|(k, _)| *k))
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

/// Applies a hicache or engine top-level key; returns false if the key is neither.
pub(super) fn apply_top_level(
    cfg: &mut Config,
    key: &str,
    value: &Value,
    source: &Source,
) -> Result<bool> {
    let src = source.clone();
    match key {
        "plugin" => {
            let s = string_value(key, value, source)?;
            cfg.plugin.offer(PluginChoice::parse(&s), src);
        }
        "storage_dir" => {
            // A list is taken verbatim (a dir may contain a comma); a string is SGLang's
            // comma-separated form.
            let dirs = match value {
                Value::Array(items) => check_dir_list(
                    items
                        .iter()
                        .map(|v| string_value(key, v, source).map(PathBuf::from))
                        .collect::<Result<Vec<_>>>()?,
                    source,
                )?,
                other => parse_dir_list(&string_value(key, other, source)?, source)?,
            };
            cfg.storage_dirs.offer(dirs, src);
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
        _ => {
            let Some((_, kind)) = ENGINE_KEYS.iter().find(|(k, _)| *k == key) else {
                return Ok(false);
            };
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
                Some(existing) => existing.offer(raw, src),
                None => {
                    cfg.engine.values.insert(
                        key.to_string(),
                        Setting {
                            value: raw,
                            source: src,
                            overridden: Vec::new(),
                        },
                    );
                }
            }
        }
    }
    Ok(true)
}

pub(super) fn apply_env(cfg: &mut Config, env: &EnvSnapshot) -> Result<()> {
    for (key, name, alias) in ENV_VARS {
        let primary = env.get(name);
        let secondary = (!alias.is_empty()).then(|| env.get(alias)).flatten();
        let (var, value) = match (primary, secondary) {
            (Some(p), Some(s)) => {
                if p != s {
                    cfg.warnings.push(format!(
                        "{name}={p:?} and its alias {alias}={s:?} disagree; using {name}"
                    ));
                }
                (*name, p)
            }
            (Some(p), None) => (*name, p),
            (None, Some(s)) => (*alias, s),
            (None, None) => continue,
        };
        let source = Source::Env(var.to_string());
        apply_top_level(cfg, key, &Value::String(value.to_string()), &source)?;
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
