//! Where a value came from, and a value with its provenance.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

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
    pub(super) fn rank(&self) -> u8 {
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
    pub(super) fn default_value(value: T) -> Self {
        Setting {
            value,
            source: Source::Default,
            overridden: Vec::new(),
        }
    }

    /// Applies `value` from `source` if it ranks at least as high as the current source.
    pub(super) fn offer(&mut self, value: T, source: Source) {
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
