//! The environment snapshot and the loader that applies defaults, files, the environment
//! and explicit values in order.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;
use crate::error::{Error, Result};

/// A snapshot of environment variables (so tests never touch the process environment).
/// `Debug` shows only the counts: the environment holds credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvSnapshot {
    vars: BTreeMap<String, String>,
    /// Variables whose values are not UTF-8. hicache cannot read them; where it would read
    /// one, [`get_for`](Self::get_for) says so instead of taking the variable as unset.
    not_unicode: BTreeSet<String>,
}

impl fmt::Debug for EnvSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EnvSnapshot({} variables, {} not UTF-8)",
            self.vars.len(),
            self.not_unicode.len()
        )
    }
}

impl EnvSnapshot {
    /// The process environment. Values that are not UTF-8 never make this panic (as
    /// `std::env::vars()` would); reading one of hicache's variables that holds such a value
    /// is an error (see [`get_for`](Self::get_for)).
    pub fn from_process() -> Self {
        Self::from_os_pairs(std::env::vars_os())
    }

    /// A snapshot of pairs as the OS gives them (`std::env::vars_os()`). A variable whose
    /// name is not UTF-8 is left out: none of hicache's or its plugins' names is.
    pub fn from_os_pairs(pairs: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        let mut snapshot = EnvSnapshot::default();
        for (name, value) in pairs {
            let Ok(name) = name.into_string() else {
                continue;
            };
            match value.into_string() {
                Ok(value) => {
                    snapshot.not_unicode.remove(&name);
                    snapshot.vars.insert(name, value);
                }
                Err(_) => {
                    snapshot.vars.remove(&name);
                    snapshot.not_unicode.insert(name);
                }
            }
        }
        snapshot
    }

    /// A snapshot built from pairs: `[("HICACHE_STORAGE_DIR", "/data")]`.
    /// `EnvSnapshot::default()` is an empty environment.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        EnvSnapshot {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            not_unicode: BTreeSet::new(),
        }
    }

    /// A variable's value; empty values, and values that are not UTF-8, count as unset.
    /// Where a value is read for a setting, use [`get_for`](Self::get_for).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A variable's value for the setting `key`, as [`get`](Self::get), except that a value
    /// that is not UTF-8 is an [`Error::InvalidConfig`] naming the variable and `key`.
    pub fn get_for(&self, name: &str, key: &str) -> Result<Option<&str>> {
        if self.not_unicode.contains(name) {
            return Err(Error::InvalidConfig {
                key: key.to_string(),
                source_desc: Source::Env(name.to_string()).to_string(),
                reason: "the value is not valid UTF-8".into(),
                hint: Some(format!(
                    "set {name} to UTF-8 text: hicache takes names and paths in UTF-8 only"
                )),
            });
        }
        Ok(self.get(name))
    }
}

/// Builds a [`Config`] from its sources, in precedence order.
#[derive(Debug, Default)]
pub struct ConfigLoader {
    documents: Vec<(Source, Value)>,
    /// A config file was given ([`file`](Self::file) or `extra_config("@…")`): it wins over
    /// `HICACHE_CONFIG`.
    file_given: bool,
    env: Option<EnvSnapshot>,
    explicit: Vec<(String, Value, Source)>,
    errors: Vec<Error>,
    /// Set by [`plugins`](Self::plugins): plugin keys are checked at `load`.
    pub(crate) known_plugins: Option<KnownPlugins>,
}

impl ConfigLoader {
    /// A loader with only defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a config file (`.toml` or `.json`; a leading `@` is accepted and stripped).
    pub fn file(mut self, path: impl AsRef<Path>) -> Self {
        // On the path's bytes: a lossy conversion would name another file when the path is
        // not UTF-8.
        let path = path.as_ref();
        let path = match path.as_os_str().as_bytes().strip_prefix(b"@") {
            Some(rest) => PathBuf::from(OsStr::from_bytes(rest)),
            None => path.to_path_buf(),
        };
        self.file_given = true;
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

    /// Reads the environment from `env` (use [`EnvSnapshot::from_process`] in binaries):
    /// its hicache and SGLang variables, and `HICACHE_CONFIG`, the config file to read when
    /// no [`file`](Self::file) was given (the `hicache` command follows the same rule:
    /// `--config` wins over `HICACHE_CONFIG`).
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

    /// Applies every source and validates the result. With [`plugins`](Self::plugins), a
    /// plugin key that none of them takes is an error here, once; without, the check waits
    /// for plugin selection.
    pub fn load(self) -> Result<Config> {
        if let Some(e) = self.errors.into_iter().next() {
            return Err(e);
        }
        let mut cfg = Config::default();
        let mut fully_qualified_without_active = None;
        let mut documents = self.documents;
        if !self.file_given
            && let Some(path) = match self.env.as_ref() {
                Some(env) => env.get_for("HICACHE_CONFIG", "config file")?,
                None => None,
            }
        {
            let path = PathBuf::from(path);
            let doc = read_document(&path).map_err(|e| match e {
                Error::ConfigFile { path, reason } => Error::ConfigFile {
                    path,
                    reason: format!("{reason} (named by HICACHE_CONFIG)"),
                },
                other => other,
            })?;
            // Read before the other documents: a file ranks below inline config.
            documents.insert(0, (Source::File(path), doc));
        }
        for (source, doc) in documents {
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
        if let Some(plugins) = &self.known_plugins {
            check_plugin_keys(&cfg, plugins)?;
        }
        Ok(cfg)
    }
}

pub(super) fn source_path(source: &Source) -> PathBuf {
    match source {
        Source::File(p) => p.clone(),
        other => PathBuf::from(other.to_string()),
    }
}

/// The most bytes a config file may hold: a real one is a few KiB, and a larger one is a
/// wrong path (a log, a dump) better refused than read into memory.
pub(super) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a config file's text: only a regular file (a FIFO or a device would block or never
/// end) of at most [`MAX_CONFIG_BYTES`].
fn read_config_text(path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so opening a FIFO that has no writer returns at once and is refused
    // below; on a regular file the flag changes nothing.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file; give the path of a .toml or .json file".into());
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "the file holds {} bytes, more than a config's limit of {MAX_CONFIG_BYTES}; check the path",
            meta.len()
        ));
    }
    let mut text = String::new();
    // Bounded again while reading: the file may grow after the check.
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "the file grew past a config's limit of {MAX_CONFIG_BYTES} bytes while read; check the path"
        ));
    }
    Ok(text)
}

pub(super) fn read_document(path: &Path) -> Result<Value> {
    let err = |reason: String| Error::ConfigFile {
        path: path.to_path_buf(),
        reason,
    };
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let ext = match ext.as_deref() {
        Some(e @ ("toml" | "json")) => e,
        Some(other) => {
            return Err(err(format!(
                "unsupported config format `.{other}`; use a .toml or .json file"
            )));
        }
        None => {
            return Err(err(
                "the name has no extension; name the file .toml or .json by its format".into(),
            ));
        }
    };
    let text = read_config_text(path).map_err(err)?;
    if ext == "json" {
        serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))
    } else {
        let table: toml::Table = toml::from_str(&text).map_err(|e| err(toml_error(&text, &e)))?;
        serde_json::to_value(table).map_err(|e| err(e.to_string()))
    }
}

/// A TOML parse error by position and message only: the parser's own rendering quotes the
/// offending line, which may hold a secret (`secret_key = "…` with a missing quote).
pub(super) fn toml_error(text: &str, e: &toml::de::Error) -> String {
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
