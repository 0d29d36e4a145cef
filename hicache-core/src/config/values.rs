//! Values as written in a config (before a plugin types them), plugin sections, engine
//! keys and the value checks shared by every source.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::*;
use crate::error::{Error, Result};

/// A config value: what the user wrote for a plugin parameter or an engine key, and, once
/// a plugin's spec has checked it, the parameter's value in the spec's kind (an unsigned
/// parameter is a non-negative `Int`). The one value type of config and plugin parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RawValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
}

impl fmt::Display for RawValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawValue::Bool(b) => write!(f, "{b}"),
            RawValue::Int(i) => write!(f, "{i}"),
            RawValue::Float(x) => write!(f, "{x}"),
            RawValue::Str(s) => f.write_str(s),
        }
    }
}

/// Plugin parameters in the order given. `Debug` redacts values of credential-like names.
#[derive(Clone, Default, PartialEq)]
pub struct Params(pub Vec<(String, Setting<RawValue>)>);

impl fmt::Debug for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, s)| {
                let shown = redact_if_secret(k, &s.value.to_string());
                (k, format!("{shown} ({})", s.source))
            }))
            .finish()
    }
}

impl Params {
    /// The setting of `key`.
    pub fn get(&self, key: &str) -> Option<&Setting<RawValue>> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, s)| s)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates (name, setting).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Setting<RawValue>)> {
        self.0.iter().map(|(k, s)| (k.as_str(), s))
    }

    pub(super) fn push(&mut self, key: String, value: RawValue, source: Source) {
        let secret = looks_secret(&key);
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, setting)) => {
                setting.offer(value, source);
                if secret {
                    for (_, shown) in &mut setting.overridden {
                        *shown = "***".into();
                    }
                }
            }
            None => self.0.push((
                key,
                Setting {
                    value,
                    source,
                    overridden: Vec::new(),
                },
            )),
        }
    }
}

/// The parameters given for one plugin section.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginSection {
    /// `active = …` of the section, if given.
    pub active: Option<bool>,
    /// Parameters in file order.
    pub params: Params,
}

/// Engine-side keys SGLang pops from `extra_config`: type-checked, kept, never forwarded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineKeys {
    /// Each key with its value and source.
    pub values: BTreeMap<String, Setting<RawValue>>,
}

pub(super) fn type_error(key: &str, value: &Value, source: &Source, want: &str) -> Error {
    Error::invalid_config(
        key,
        source.to_string(),
        format!("expected {want}, got {value}"),
    )
}

pub(super) fn one_of(key: &str, got: &str, source: &Source, allowed: &[&str]) -> Error {
    Error::InvalidConfig {
        key: key.to_string(),
        source_desc: source.to_string(),
        reason: format!("`{got}` is not one of {}", allowed.join(", ")),
        hint: None,
    }
}

pub(super) fn string_value(key: &str, value: &Value, source: &Source) -> Result<String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => Err(type_error(key, other, source, "a string")),
    }
}

/// Strict boolean: true/false, 1/0, yes/no, on/off (any case), or a real boolean.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "on" => Some(true),
        "false" | "0" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

pub(super) fn strict_bool(key: &str, value: &Value, source: &Source) -> Result<bool> {
    let parsed = match value {
        Value::Bool(b) => Some(*b),
        Value::String(s) => parse_bool(s),
        Value::Number(n) => match n.as_i64() {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        },
        _ => None,
    };
    parsed.ok_or_else(|| Error::InvalidConfig {
        key: key.to_string(),
        source_desc: source.to_string(),
        reason: format!("`{}` is not a boolean", render(value)),
        hint: Some("use true or false".into()),
    })
}

pub(super) fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A number as an error shows it: in exponent form when plain digits would run long
/// (`1e300`, not 301 digits; `1e-300`, not 300 zeros).
fn shown(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-6..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

pub(super) fn percent(key: &str, value: &Value, source: &Source) -> Result<f64> {
    let x = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match x {
        Some(x) if (0.0..=100.0).contains(&x) => Ok(x),
        Some(x) => Err(Error::invalid_config(
            key,
            source.to_string(),
            format!("{} is outside 0..=100 (percent of disk)", shown(x)),
        )),
        None => Err(type_error(key, value, source, "a number (percent)")),
    }
}

/// A byte count: a non-negative integer, or a size with SI or IEC units as SGLang's file
/// backend takes them (`500G`, `1.5 TiB`, `0` = off).
pub(super) fn size(key: &str, value: &Value, source: &Source) -> Result<u64> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| type_error(key, value, source, "a byte count (0 or more)")),
        Value::String(s) => parse_size::parse_size(s.trim()).map_err(|e| Error::InvalidConfig {
            key: key.to_string(),
            source_desc: source.to_string(),
            reason: format!("`{s}` is not a size ({e})"),
            hint: Some("write bytes, or a number with a unit: 500G, 1.5TiB, 20 GB".into()),
        }),
        _ => Err(type_error(key, value, source, "a byte count or a size")),
    }
}

/// Seconds: a finite number from `min` to one day.
pub(super) fn seconds(key: &str, value: &Value, source: &Source, min: f64) -> Result<f64> {
    let x = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match x {
        Some(x) if (min..=86_400.0).contains(&x) => Ok(x),
        Some(x) => Err(Error::invalid_config(
            key,
            source.to_string(),
            format!("{} is outside {min}..=86400 (seconds)", shown(x)),
        )),
        None => Err(type_error(key, value, source, "a number of seconds")),
    }
}

/// An integer within `range`, given as a number or as digits in a string.
pub(super) fn uint_in(
    key: &str,
    value: &Value,
    source: &Source,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if range.contains(&n) => Ok(n),
        Some(n) => Err(Error::invalid_config(
            key,
            source.to_string(),
            format!("{n} is outside {}..={}", range.start(), range.end()),
        )),
        None => Err(type_error(key, value, source, "a whole number")),
    }
}

pub(super) fn raw_value(key: &str, value: &Value, source: &Source) -> Result<RawValue> {
    Ok(match value {
        Value::Bool(b) => RawValue::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => RawValue::Int(i),
            None => RawValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => RawValue::Str(s.clone()),
        other => {
            return Err(Error::invalid_config(
                key,
                source.to_string(),
                format!("plugin parameters are scalars, got {other}"),
            ));
        }
    })
}

/// A loopback `host:port` to serve metrics on, or `""` for none. Other hosts are refused:
/// the exporter has no authentication, so it stays on this machine (a scraper elsewhere
/// reaches it through a sidecar or the file exporter).
pub(super) fn loopback_addr(
    key: &str,
    value: &Value,
    source: &Source,
) -> Result<Option<std::net::SocketAddr>> {
    let s = string_value(key, value, source)?;
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let refuse = |reason: String| Error::InvalidConfig {
        key: key.to_string(),
        source_desc: source.to_string(),
        reason,
        hint: Some("write a loopback address with a port: 127.0.0.1:9464 or [::1]:9464".into()),
    };
    let addr: std::net::SocketAddr = s
        .parse()
        .map_err(|_| refuse(format!("`{s}` is not an IP address and port")))?;
    if !addr.ip().is_loopback() {
        return Err(refuse(format!(
            "{} is not a loopback address (the exporter has no authentication)",
            addr.ip()
        )));
    }
    if addr.port() == 0 {
        return Err(refuse(
            "port 0 would pick a port no scraper knows".to_string(),
        ));
    }
    Ok(Some(addr))
}

/// A file path, or `""` for none.
pub(super) fn optional_path(
    key: &str,
    value: &Value,
    source: &Source,
) -> Result<Option<std::path::PathBuf>> {
    let s = string_value(key, value, source)?;
    if s.trim().is_empty() {
        return Ok(None);
    }
    if s.contains('\0') {
        return Err(Error::invalid_config(
            key,
            source.to_string(),
            "a path cannot hold a NUL byte",
        ));
    }
    Ok(Some(s.into()))
}
