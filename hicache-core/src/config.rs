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

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::envelope::PageFormat;
use crate::error::{Error, Result, closest_match};
use crate::key::NamingScheme;

/// Default storage dir (SGLang's NIXL default).
pub const DEFAULT_STORAGE_DIR: &str = "/tmp/hicache_storage";

/// Where an effective value came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "lowercase")]
pub enum Source {
    /// Built-in default.
    Default,
    /// A config file.
    File(PathBuf),
    /// An inline JSON config string (SGLang's `--hicache-storage-backend-extra-config`).
    Inline,
    /// An environment variable, by name.
    Env(String),
    /// Set explicitly through the API.
    Api,
    /// A command-line flag, as the user wrote it (`--dir`).
    Flag(String),
}

impl Source {
    /// Precedence rank: higher wins.
    fn rank(&self) -> u8 {
        match self {
            Source::Default => 0,
            Source::File(_) | Source::Inline => 1,
            Source::Env(_) => 2,
            Source::Api | Source::Flag(_) => 3,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Inline => f.write_str("inline config"),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Api => f.write_str("api"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A value and the source it came from, plus the lower-precedence values it replaced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Setting<T> {
    /// The effective value.
    pub value: T,
    /// Where it came from.
    pub source: Source,
    /// Values from other sources that lost to this one (source, rendered value).
    pub overridden: Vec<(Source, String)>,
}

impl<T: fmt::Debug> Setting<T> {
    fn default_value(value: T) -> Self {
        Setting {
            value,
            source: Source::Default,
            overridden: Vec::new(),
        }
    }

    /// Applies `value` from `source` if it ranks at least as high as the current source.
    fn offer(&mut self, value: T, source: Source) {
        if source.rank() >= self.source.rank() {
            if self.source != Source::Default {
                let old = std::mem::replace(&mut self.source, source);
                self.overridden.push((old, format!("{:?}", self.value)));
            } else {
                self.source = source;
            }
            self.value = value;
        } else {
            self.overridden.push((source, format!("{value:?}")));
        }
    }
}

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

/// A plugin parameter value as written by the user (typed later, by the plugin's spec).
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

    fn push(&mut self, key: String, value: RawValue, source: Source) {
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

/// Kind of an engine key, for type checks.
#[derive(Clone, Copy)]
enum EngineKind {
    Int,
    Number,
    Bool,
    Str,
}

const ENGINE_KEYS: &[(&str, EngineKind)] = &[
    ("prefetch_threshold", EngineKind::Int),
    ("prefetch_timeout_base", EngineKind::Number),
    ("prefetch_timeout_per_ki_token", EngineKind::Number),
    ("hicache_storage_pass_prefix_keys", EngineKind::Bool),
    ("tp_lcm_size", EngineKind::Int),
    ("interface_v1", EngineKind::Bool),
    ("file_storage_path", EngineKind::Str),
];

/// hicache's own top-level keys.
pub const TOP_LEVEL_KEYS: &[&str] = &[
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
pub const ENV_VARS: &[(&str, &str, &str)] = &[
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
            use_direct_io: Setting::default_value(true),
            naming: Setting::default_value(NamingScheme::Hicache),
            page_format: Setting::default_value(PageFormat::Envelope),
            transfer_mode: Setting::default_value(TransferChoice::Auto),
            cleaner_enabled: Setting::default_value(true),
            cleaner_high_watermark: Setting::default_value(80.0),
            cleaner_low_watermark: Setting::default_value(70.0),
            plugin_sections: Vec::new(),
            flat_params: Params::default(),
            engine: EngineKeys::default(),
            warnings: Vec::new(),
            env: EnvSnapshot::default(),
        }
    }
}

/// A snapshot of environment variables (so tests never touch the process environment).
/// `Debug` shows only the count: the environment holds credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvSnapshot(BTreeMap<String, String>);

impl fmt::Debug for EnvSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EnvSnapshot({} variables)", self.0.len())
    }
}

impl EnvSnapshot {
    /// The process environment.
    pub fn from_process() -> Self {
        EnvSnapshot(std::env::vars().collect())
    }

    /// A snapshot built from pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        EnvSnapshot(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// A variable's value; empty values count as unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Builds a [`Config`] from its sources, in precedence order.
#[derive(Debug, Default)]
pub struct ConfigLoader {
    documents: Vec<(Source, Value)>,
    env: Option<EnvSnapshot>,
    explicit: Vec<(String, Value, Source)>,
    errors: Vec<Error>,
}

impl ConfigLoader {
    /// A loader with only defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a config file (`.toml` or `.json`; a leading `@` is accepted and stripped).
    pub fn file(mut self, path: impl AsRef<Path>) -> Self {
        let raw = path.as_ref().to_string_lossy();
        let path = PathBuf::from(raw.strip_prefix('@').unwrap_or(&raw));
        match read_document(&path) {
            Ok(doc) => self.documents.push((Source::File(path), doc)),
            Err(e) => self.errors.push(e),
        }
        self
    }

    /// Adds SGLang's `extra_config` argument: `@path` for a file, otherwise inline JSON.
    pub fn extra_config(self, arg: &str) -> Self {
        let arg = arg.trim();
        if arg.starts_with('@') {
            return self.file(arg);
        }
        let mut this = self;
        match serde_json::from_str::<Value>(arg) {
            Ok(doc) => this.documents.push((Source::Inline, doc)),
            Err(e) => this.errors.push(Error::ConfigFile {
                path: PathBuf::from("<inline>"),
                reason: format!("not valid JSON: {e}"),
            }),
        }
        this
    }

    /// Reads the environment from `env` (use [`EnvSnapshot::from_process`] in binaries).
    pub fn env(mut self, env: EnvSnapshot) -> Self {
        self.env = Some(env);
        self
    }

    /// Sets a value explicitly (highest precedence). Keys are the config file's keys;
    /// `plugin.<name>.<param>` sets a plugin parameter.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.explicit.push((key.into(), value.into(), Source::Api));
        self
    }

    /// Like [`set`](Self::set), for a value given by a command-line `flag` (`--dir`): the
    /// value ranks the same, and its source is shown as the flag.
    pub fn set_flag(
        mut self,
        flag: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Self {
        self.explicit
            .push((key.into(), value.into(), Source::Flag(flag.into())));
        self
    }

    /// Applies every source and validates the result.
    pub fn load(self) -> Result<Config> {
        if let Some(e) = self.errors.into_iter().next() {
            return Err(e);
        }
        let mut cfg = Config::default();
        let mut fully_qualified_without_active = None;
        for (source, doc) in self.documents {
            let Value::Object(map) = doc else {
                return Err(Error::ConfigFile {
                    path: source_path(&source),
                    reason: "the top level must be a table / object".into(),
                });
            };
            if apply_document(&mut cfg, map, &source)? {
                fully_qualified_without_active = Some(source);
            }
        }
        if let Some(env) = self.env {
            apply_env(&mut cfg, &env)?;
            cfg.env = env;
        }
        for (key, value, source) in self.explicit {
            apply_explicit(&mut cfg, &key, value, &source)?;
        }
        if let Some(source) = fully_qualified_without_active
            && cfg.plugin.source.rank() <= Source::Inline.rank()
        {
            let names: Vec<String> = cfg
                .plugin_sections
                .iter()
                .map(|(n, _)| format!("[plugin.{}]", n.to_ascii_lowercase()))
                .collect();
            return Err(Error::InvalidConfig {
                key: "plugin.*.active".into(),
                source_desc: source.to_string(),
                reason: format!("no plugin section is active among {}", names.join(", ")),
                hint: Some("set `active = true` in the section of the plugin to use, or set HICACHE_BACKEND_PLUGIN".into()),
            });
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

fn source_path(source: &Source) -> PathBuf {
    match source {
        Source::File(p) => p.clone(),
        other => PathBuf::from(other.to_string()),
    }
}

fn read_document(path: &Path) -> Result<Value> {
    let err = |reason: String| Error::ConfigFile {
        path: path.to_path_buf(),
        reason,
    };
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if ext != "toml" && ext != "json" {
        return Err(err(format!(
            "unsupported config format `.{ext}`; use a .toml or .json file"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    if ext == "json" {
        serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))
    } else {
        let table: toml::Table = toml::from_str(&text).map_err(|e| err(toml_error(&text, &e)))?;
        serde_json::to_value(table).map_err(|e| err(e.to_string()))
    }
}

/// A TOML parse error by position and message only: the parser's own rendering quotes the
/// offending line, which may hold a secret (`secret_key = "…` with a missing quote).
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let position = e.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!(" at line {line}, column {column}")
    });
    format!(
        "invalid TOML{}: {}",
        position.unwrap_or_default(),
        e.message()
    )
}

/// Applies one document. Returns true when it is fully qualified with no active section.
fn apply_document(cfg: &mut Config, map: Map<String, Value>, source: &Source) -> Result<bool> {
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

fn known_top_level() -> impl Iterator<Item = &'static str> {
    TOP_LEVEL_KEYS
        .iter()
        .copied()
        .chain(ENGINE_KEYS.iter().map(|(k, _)| *k))
}

/// Applies `[plugin.<name>]` sections; returns whether one of them is active.
fn apply_plugin_sections(cfg: &mut Config, value: Value, source: &Source) -> Result<bool> {
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
fn apply_top_level(cfg: &mut Config, key: &str, value: &Value, source: &Source) -> Result<bool> {
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

fn apply_env(cfg: &mut Config, env: &EnvSnapshot) -> Result<()> {
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

fn apply_explicit(cfg: &mut Config, key: &str, value: Value, source: &Source) -> Result<()> {
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

fn type_error(key: &str, value: &Value, source: &Source, want: &str) -> Error {
    Error::invalid_config(
        key,
        source.to_string(),
        format!("expected {want}, got {value}"),
    )
}

fn one_of(key: &str, got: &str, source: &Source, allowed: &[&str]) -> Error {
    Error::InvalidConfig {
        key: key.to_string(),
        source_desc: source.to_string(),
        reason: format!("`{got}` is not one of {}", allowed.join(", ")),
        hint: None,
    }
}

fn string_value(key: &str, value: &Value, source: &Source) -> Result<String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => Err(type_error(key, other, source, "a string")),
    }
}

/// Strict boolean: true/false, 1/0, yes/no, on/off (any case), or a real boolean.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" | "on" => Some(true),
        "false" | "0" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

fn strict_bool(key: &str, value: &Value, source: &Source) -> Result<bool> {
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

fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn percent(key: &str, value: &Value, source: &Source) -> Result<f64> {
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
            format!("{x} is outside 0..=100 (percent of disk)"),
        )),
        None => Err(type_error(key, value, source, "a number (percent)")),
    }
}

fn raw_value(key: &str, value: &Value, source: &Source) -> Result<RawValue> {
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

/// Storage dirs for humans: SGLang's comma form, or a JSON list when a dir holds a comma
/// (the comma form would read as two dirs).
fn render_dirs(dirs: &[PathBuf]) -> String {
    let names: Vec<String> = dirs.iter().map(|p| p.display().to_string()).collect();
    if names.iter().any(|n| n.contains(',')) {
        serde_json::to_string(&names).unwrap_or_default()
    } else {
        names.join(",")
    }
}

/// Parses a comma list of storage dirs (SGLang's form): entries trimmed, empty ones dropped,
/// order kept, duplicates (same real path, e.g. through a symlink) rejected.
pub fn parse_dir_list(list: &str, source: &Source) -> Result<Vec<PathBuf>> {
    check_dir_list(
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(PathBuf::from)
            .collect(),
        source,
    )
}

/// Checks a list of storage dirs taken verbatim: not empty, no entry empty, no duplicates
/// (same real path, e.g. through a symlink).
///
/// A relative entry from a config file is relative to the file's directory, not to the
/// process's working directory. Two entries are the same dir when their real paths match or,
/// for dirs that exist, their device and inode do (a bind mount has another path).
pub fn check_dir_list(list: Vec<PathBuf>, source: &Source) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut real: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    for path in list {
        if path.as_os_str().is_empty() {
            return Err(Error::invalid_config(
                "storage_dir",
                source.to_string(),
                "an entry of the list is empty",
            ));
        }
        let path = match source {
            Source::File(file) if path.is_relative() => file
                .parent()
                .map_or_else(|| path.clone(), |dir| dir.join(&path)),
            _ => path,
        };
        let canonical = real_path(&path);
        let identity = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
        if let Some(i) = real
            .iter()
            .position(|(r, id)| *r == canonical || (identity.is_some() && *id == identity))
        {
            return Err(Error::InvalidConfig {
                key: "storage_dir".into(),
                source_desc: source.to_string(),
                reason: format!(
                    "duplicate path {} (same as {})",
                    path.display(),
                    dirs[i].display()
                ),
                hint: Some("list each storage dir once; two entries resolving to the same directory would route pages twice".into()),
            });
        }
        dirs.push(path);
        real.push((canonical, identity));
    }
    if dirs.is_empty() {
        return Err(Error::invalid_config(
            "storage_dir",
            source.to_string(),
            "the list has no directory",
        ));
    }
    Ok(dirs)
}

/// The real path of `path`: canonical for the longest existing ancestor, the rest appended.
fn real_path(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

impl Config {
    /// Cross-field checks.
    fn validate(&self) -> Result<()> {
        let (low, high) = (
            self.cleaner_low_watermark.value,
            self.cleaner_high_watermark.value,
        );
        if low >= high {
            return Err(Error::InvalidConfig {
                key: "l3_cleaner_low_watermark".into(),
                source_desc: self.cleaner_low_watermark.source.to_string(),
                reason: format!(
                    "low watermark {low} must be lower than high watermark {high} (from {})",
                    self.cleaner_high_watermark.source
                ),
                hint: None,
            });
        }
        Ok(())
    }

    /// A variable of the environment the config was loaded with.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env.get(name)
    }

    /// The section of `plugin` (case-insensitive), if the config has one.
    pub fn section(&self, plugin: &str) -> Option<&PluginSection> {
        self.plugin_sections
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(plugin))
            .map(|(_, s)| s)
    }

    /// Every effective setting as (key, rendered value, source), secrets redacted — what
    /// `hicache config show` prints.
    pub fn entries(&self) -> Vec<ConfigEntry> {
        let mut out = Vec::new();
        let mut push =
            |key: String, value: String, source: &Source, overridden: &[(Source, String)]| {
                out.push(ConfigEntry {
                    key,
                    value,
                    source: source.clone(),
                    overridden: overridden.to_vec(),
                })
            };
        push(
            "plugin".into(),
            self.plugin.value.to_string(),
            &self.plugin.source,
            &self.plugin.overridden,
        );
        push(
            "storage_dir".into(),
            render_dirs(&self.storage_dirs.value),
            &self.storage_dirs.source,
            &self.storage_dirs.overridden,
        );
        push(
            "use_direct_io".into(),
            self.use_direct_io.value.to_string(),
            &self.use_direct_io.source,
            &self.use_direct_io.overridden,
        );
        push(
            "naming".into(),
            self.naming.value.to_string(),
            &self.naming.source,
            &self.naming.overridden,
        );
        push(
            "page_format".into(),
            self.page_format.value.to_string(),
            &self.page_format.source,
            &self.page_format.overridden,
        );
        push(
            "transfer_mode".into(),
            self.transfer_mode.value.to_string(),
            &self.transfer_mode.source,
            &self.transfer_mode.overridden,
        );
        push(
            "l3_cleaner_enabled".into(),
            self.cleaner_enabled.value.to_string(),
            &self.cleaner_enabled.source,
            &self.cleaner_enabled.overridden,
        );
        push(
            "l3_cleaner_high_watermark".into(),
            self.cleaner_high_watermark.value.to_string(),
            &self.cleaner_high_watermark.source,
            &self.cleaner_high_watermark.overridden,
        );
        push(
            "l3_cleaner_low_watermark".into(),
            self.cleaner_low_watermark.value.to_string(),
            &self.cleaner_low_watermark.source,
            &self.cleaner_low_watermark.overridden,
        );
        for (name, section) in &self.plugin_sections {
            for (k, s) in section.params.iter() {
                let shown = redact_if_secret(k, &s.value.to_string());
                push(
                    format!("plugin.{}.{k}", name.to_ascii_lowercase()),
                    shown,
                    &s.source,
                    &[],
                );
            }
        }
        for (k, s) in self.flat_params.iter() {
            push(
                k.to_string(),
                redact_if_secret(k, &s.value.to_string()),
                &s.source,
                &[],
            );
        }
        for (k, s) in &self.engine.values {
            push(
                format!("engine.{k}"),
                s.value.to_string(),
                &s.source,
                &s.overridden,
            );
        }
        out
    }
}

/// One row of `config show`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigEntry {
    /// The key.
    pub key: String,
    /// The rendered value (secrets as `***`).
    pub value: String,
    /// Where it came from.
    pub source: Source,
    /// Lower-precedence values it replaced.
    pub overridden: Vec<(Source, String)>,
}

/// Whether a parameter name looks like a credential (used where no plugin spec says so).
pub fn looks_secret(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "secret",
        "password",
        "token",
        "access_key",
        "credential",
        "private",
    ]
    .iter()
    .any(|s| n.contains(s))
}

fn redact_if_secret(name: &str, value: &str) -> String {
    if looks_secret(name) {
        "***".into()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        p
    }

    #[test]
    fn defaults() {
        let cfg = ConfigLoader::new().load().unwrap();
        assert_eq!(cfg.plugin.value, PluginChoice::Auto);
        assert_eq!(
            cfg.storage_dirs.value,
            vec![PathBuf::from(DEFAULT_STORAGE_DIR)]
        );
        assert!(cfg.use_direct_io.value);
        assert_eq!(cfg.use_direct_io.source, Source::Default);
    }

    #[test]
    fn precedence_file_env_api_with_provenance() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "c.toml",
            "use_direct_io = true\nplugin = \"posix\"\nstorage_dir = \"/a\"\n",
        );
        let env = EnvSnapshot::from_pairs([
            ("HICACHE_USE_DIRECT_IO", "false"),
            ("HICACHE_STORAGE_DIR", "/b, /c"),
        ]);
        let cfg = ConfigLoader::new()
            .file(&file)
            .env(env)
            .set("storage_dir", "/d")
            .load()
            .unwrap();
        assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
        assert_eq!(cfg.plugin.source, Source::File(file.clone()));
        assert!(!cfg.use_direct_io.value);
        assert_eq!(
            cfg.use_direct_io.source,
            Source::Env("HICACHE_USE_DIRECT_IO".into())
        );
        assert_eq!(
            cfg.use_direct_io.overridden,
            vec![(Source::File(file), "true".into())]
        );
        assert_eq!(cfg.storage_dirs.value, vec![PathBuf::from("/d")]);
        assert_eq!(cfg.storage_dirs.source, Source::Api);
        assert_eq!(cfg.storage_dirs.overridden.len(), 2);

        let cfg = ConfigLoader::new()
            .env(EnvSnapshot::from_pairs([("HICACHE_STORAGE_DIR", "/b")]))
            .set_flag("--dir", "storage_dir", "/d")
            .load()
            .unwrap();
        assert_eq!(cfg.storage_dirs.value, vec![PathBuf::from("/d")]);
        assert_eq!(cfg.storage_dirs.source, Source::Flag("--dir".into()));
        assert_eq!(cfg.storage_dirs.source.to_string(), "flag --dir");
    }

    #[test]
    fn transfer_mode_is_auto_or_bounce() {
        assert_eq!(
            ConfigLoader::new().load().unwrap().transfer_mode.value,
            TransferChoice::Auto
        );
        let env = EnvSnapshot::from_pairs([("HICACHE_TRANSFER_MODE", "Bounce")]);
        let cfg = ConfigLoader::new().env(env).load().unwrap();
        assert_eq!(cfg.transfer_mode.value, TransferChoice::Bounce);
        assert_eq!(
            cfg.transfer_mode.source,
            Source::Env("HICACHE_TRANSFER_MODE".into())
        );
        let err = ConfigLoader::new()
            .set("transfer_mode", "zerocopy")
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("transfer_mode") && err.contains("bounce"),
            "{err}"
        );
    }

    #[test]
    fn sglang_env_aliases_and_conflicts() {
        let env = EnvSnapshot::from_pairs([
            ("SGLANG_HICACHE_NIXL_BACKEND_PLUGIN", "posix"),
            ("SGLANG_HICACHE_NIXL_USE_DIRECT_IO", "false"),
            ("HICACHE_STORAGE_DIR", "/x"),
            ("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR", "/y"),
        ]);
        let cfg = ConfigLoader::new().env(env).load().unwrap();
        assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
        assert_eq!(
            cfg.plugin.source,
            Source::Env("SGLANG_HICACHE_NIXL_BACKEND_PLUGIN".into())
        );
        assert!(!cfg.use_direct_io.value, "the string false must mean false");
        assert_eq!(cfg.storage_dirs.value, vec![PathBuf::from("/x")]);
        assert!(
            cfg.warnings.iter().any(|w| w.contains("disagree")),
            "{:?}",
            cfg.warnings
        );
        let cfg = ConfigLoader::new()
            .env(EnvSnapshot::from_pairs([(
                "HICACHE_BACKEND_PLUGIN",
                "AUTO",
            )]))
            .load()
            .unwrap();
        assert_eq!(cfg.plugin.value, PluginChoice::Auto);
    }

    #[test]
    fn strict_booleans() {
        for (text, want) in [
            ("true", true),
            ("False", false),
            ("0", false),
            ("yes", true),
            ("off", false),
        ] {
            let cfg = ConfigLoader::new()
                .set("use_direct_io", text)
                .load()
                .unwrap();
            assert_eq!(cfg.use_direct_io.value, want, "{text}");
        }
        let err = ConfigLoader::new()
            .env(EnvSnapshot::from_pairs([(
                "HICACHE_USE_DIRECT_IO",
                "maybe",
            )]))
            .load()
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("use_direct_io")
                && msg.contains("HICACHE_USE_DIRECT_IO")
                && msg.contains("maybe"),
            "{msg}"
        );
        assert!(
            ConfigLoader::new()
                .set("l3_cleaner_enabled", 2)
                .load()
                .is_err()
        );
    }

    #[test]
    fn fully_qualified_form() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "c.toml",
            "use_direct_io = false\n[plugin.obj]\nactive = false\nbucket = \"b\"\n[plugin.posix]\nactive = true\nuse_uring = \"true\"\n[plugin.gds]\nactive = true\n",
        );
        let cfg = ConfigLoader::new().file(&file).load().unwrap();
        assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
        let posix = cfg.section("posix").unwrap();
        assert_eq!(posix.params.len(), 1, "active is not a parameter");
        assert!(posix.params.get("use_uring").is_some());
        assert!(cfg.warnings.iter().any(|w| w.contains("both active")));
        assert!(!cfg.use_direct_io.value);
    }

    #[test]
    fn relative_dirs_in_a_file_are_relative_to_the_file_and_bind_mounts_are_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "c.toml",
            "storage_dir = [\"pages\", \"/abs\"]\n",
        );
        let cfg = ConfigLoader::new().file(&file).load().unwrap();
        assert_eq!(
            cfg.storage_dirs.value,
            vec![dir.path().join("pages"), PathBuf::from("/abs")]
        );
        for hostile in [
            "storage_dir = [\"\"]\n",
            "storage_dir = []\n",
            "storage_dir = [1]\n",
        ] {
            let file = write(dir.path(), "h.toml", hostile);
            let err = ConfigLoader::new().file(&file).load().unwrap_err();
            assert!(err.to_string().contains("storage_dir"), "{hostile}: {err}");
        }
        // The same dir under two names that no path resolution merges: a bind mount.
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let src = std::ffi::CString::new(a.to_str().unwrap()).unwrap();
        let dst = std::ffi::CString::new(b.to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated paths; a bind mount of one temp dir onto another.
        let mounted = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        } == 0;
        if mounted {
            let err = check_dir_list(vec![a.clone(), b.clone()], &Source::Api);
            // SAFETY: unmounting what was mounted above.
            unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
            assert!(
                err.is_err(),
                "a bind mount of the same dir was accepted twice"
            );
        } else {
            eprintln!("skipped the bind-mount half: mount needs root");
        }
    }

    #[test]
    fn all_inactive_is_a_clear_error_unless_env_picks() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "c.json",
            r#"{"plugin": {"posix": {"active": false}, "obj": {}}}"#,
        );
        let err = ConfigLoader::new().file(&file).load().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("no plugin section is active") && msg.contains("[plugin.posix]"),
            "{msg}"
        );
        let cfg = ConfigLoader::new()
            .file(&file)
            .env(EnvSnapshot::from_pairs([(
                "HICACHE_BACKEND_PLUGIN",
                "posix",
            )]))
            .load()
            .unwrap();
        assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
    }

    #[test]
    fn unknown_keys_get_suggestions() {
        let err = ConfigLoader::new()
            .set("use_directio", true)
            .load()
            .unwrap_err();
        assert!(
            err.to_string().contains("did you mean `use_direct_io`"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "c.toml",
            "storage_dirr = \"/a\"\n[plugin.posix]\nactive = true\n",
        );
        let err = ConfigLoader::new().file(&file).load().unwrap_err();
        assert!(
            err.to_string().contains("did you mean `storage_dir`"),
            "{err}"
        );
        let bad = write(dir.path(), "bad.toml", "[plugin]\nposix = 3\n");
        assert!(ConfigLoader::new().file(&bad).load().is_err());
    }

    #[test]
    fn flat_form_keeps_engine_keys_out_of_plugin_params() {
        let cfg = ConfigLoader::new()
            .extra_config(r#"{"use_uring": "true", "use_direct_io": false, "prefetch_threshold": 512, "interface_v1": true}"#)
            .load()
            .unwrap();
        assert_eq!(cfg.flat_params.len(), 1);
        assert_eq!(
            cfg.flat_params.get("use_uring").unwrap().source,
            Source::Inline
        );
        assert!(!cfg.use_direct_io.value);
        assert_eq!(
            cfg.engine.values["prefetch_threshold"].value,
            RawValue::Int(512)
        );
        let err = ConfigLoader::new()
            .extra_config(r#"{"prefetch_threshold": "lots"}"#)
            .load()
            .unwrap_err();
        assert!(err.to_string().contains("integer"), "{err}");
    }

    #[test]
    fn file_formats() {
        let dir = tempfile::tempdir().unwrap();
        let json = write(dir.path(), "c.json", r#"{"use_direct_io": "false"}"#);
        assert!(
            !ConfigLoader::new()
                .file(format!("@{}", json.display()))
                .load()
                .unwrap()
                .use_direct_io
                .value
        );
        let ini = write(dir.path(), "c.ini", "x=1");
        let err = ConfigLoader::new().file(&ini).load().unwrap_err();
        assert!(
            err.to_string().contains("unsupported config format"),
            "{err}"
        );
        let leaky = write(
            dir.path(),
            "s.toml",
            "[plugin.obj]\naccess_key = \"AKIA\"\nsecret_key = \"hunter2-very-secret\nbucket = \"b\"\n",
        );
        let err = ConfigLoader::new()
            .file(&leaky)
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid TOML at line"), "{err}");
        assert!(
            !err.contains("hunter2"),
            "a parse error echoed a secret: {err}"
        );
        let broken = write(dir.path(), "b.toml", "use_direct_io = ");
        assert!(
            ConfigLoader::new()
                .file(&broken)
                .load()
                .unwrap_err()
                .to_string()
                .contains("invalid TOML")
        );
        assert!(
            ConfigLoader::new()
                .file(dir.path().join("missing.toml"))
                .load()
                .is_err()
        );
        assert!(
            ConfigLoader::new()
                .extra_config("{not json")
                .load()
                .is_err()
        );
    }

    #[test]
    fn dir_lists() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let list = format!(" {}, ,{} ", a.display(), dir.path().join("b").display());
        let dirs = parse_dir_list(&list, &Source::Api).unwrap();
        assert_eq!(dirs, vec![a.clone(), dir.path().join("b")]);
        let dup = format!("{},{}", a.display(), link.display());
        let err = parse_dir_list(&dup, &Source::Api).unwrap_err();
        assert!(err.to_string().contains("duplicate path"), "{err}");
        let dup2 = format!("{}/x,{}/x", a.display(), link.display());
        assert!(
            parse_dir_list(&dup2, &Source::Api).is_err(),
            "missing dirs under the same real parent"
        );
        assert!(parse_dir_list(" , ", &Source::Api).is_err());
    }

    #[test]
    fn watermarks() {
        assert!(
            ConfigLoader::new()
                .set("l3_cleaner_low_watermark", "85")
                .load()
                .is_err()
        );
        let cfg = ConfigLoader::new()
            .set("l3_cleaner_high_watermark", "90.5")
            .load()
            .unwrap();
        assert_eq!(cfg.cleaner_high_watermark.value, 90.5);
        assert!(
            ConfigLoader::new()
                .set("l3_cleaner_high_watermark", 150)
                .load()
                .is_err()
        );
    }

    #[test]
    fn entries_redact_secrets() {
        let cfg = ConfigLoader::new()
            .set("plugin.obj.secret_key", "hunter2")
            .set("plugin.obj.bucket", "b")
            .load()
            .unwrap();
        let entries = cfg.entries();
        let secret = entries
            .iter()
            .find(|e| e.key == "plugin.obj.secret_key")
            .unwrap();
        assert_eq!(secret.value, "***");
        assert!(!format!("{entries:?}").contains("hunter2"));
        assert!(!format!("{cfg:?}").contains("hunter2"));
        assert!(
            entries
                .iter()
                .any(|e| e.key == "plugin.obj.bucket" && e.value == "b")
        );
    }
}
