//! The effective configuration as entries for humans and JSON, secrets redacted.

use serde::Serialize;

use super::*;
use crate::error::{Error, Result};

impl Config {
    /// Cross-field checks.
    pub(super) fn validate(&self) -> Result<()> {
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

    /// The capacity cleaner's settings, or `None` when `l3_cleaner_enabled` is false. The loader
    /// has checked every value and that the low watermark is below the high one.
    pub fn cleaner(&self) -> Option<crate::capacity::CleanerSettings> {
        if !self.cleaner_enabled.value {
            return None;
        }
        let nonzero = |n: u64| (n > 0).then_some(n);
        Some(crate::capacity::CleanerSettings {
            high_watermark: self.cleaner_high_watermark.value,
            low_watermark: self.cleaner_low_watermark.value,
            max_bytes: nonzero(self.cleaner_max_bytes.value),
            min_free_bytes: nonzero(self.cleaner_min_free_bytes.value),
            interval: std::time::Duration::from_secs_f64(self.cleaner_interval_s.value),
            min_age: std::time::Duration::from_secs_f64(self.cleaner_min_age_s.value),
            max_removals_per_s: u32::try_from(self.cleaner_max_removals_per_s.value)
                .unwrap_or(u32::MAX),
            scope: self.cleaner_scope.value,
        })
    }

    /// The same config with the capacity cleaner off, its source naming `why`: for one-off
    /// commands (a tool's round trip, a benchmark, a scrub) that open a plugin but must never
    /// start evicting pages from a shared dir.
    pub fn without_cleaner(&self, why: &str) -> Config {
        let mut config = self.clone();
        config
            .cleaner_enabled
            .offer(false, Source::Flag(why.to_string()));
        config
    }

    /// A variable of the environment the config was loaded with; unset when empty or not
    /// UTF-8.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env.get(name)
    }

    /// A variable of the environment the config was loaded with, read for the setting `key`:
    /// a value that is not UTF-8 is an error naming both ([`EnvSnapshot::get_for`]).
    pub fn env_var_for(&self, name: &str, key: &str) -> Result<Option<&str>> {
        self.env.get_for(name, key)
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
            "plugin_dirs".into(),
            render_dirs(&self.plugin_dirs.value),
            &self.plugin_dirs.source,
            &self.plugin_dirs.overridden,
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
        push(
            "l3_cleaner_max_bytes".into(),
            self.cleaner_max_bytes.value.to_string(),
            &self.cleaner_max_bytes.source,
            &self.cleaner_max_bytes.overridden,
        );
        push(
            "l3_cleaner_min_free_bytes".into(),
            self.cleaner_min_free_bytes.value.to_string(),
            &self.cleaner_min_free_bytes.source,
            &self.cleaner_min_free_bytes.overridden,
        );
        push(
            "l3_cleaner_interval_s".into(),
            self.cleaner_interval_s.value.to_string(),
            &self.cleaner_interval_s.source,
            &self.cleaner_interval_s.overridden,
        );
        push(
            "l3_cleaner_min_age_s".into(),
            self.cleaner_min_age_s.value.to_string(),
            &self.cleaner_min_age_s.source,
            &self.cleaner_min_age_s.overridden,
        );
        push(
            "l3_cleaner_max_removals_per_s".into(),
            self.cleaner_max_removals_per_s.value.to_string(),
            &self.cleaner_max_removals_per_s.source,
            &self.cleaner_max_removals_per_s.overridden,
        );
        push(
            "l3_cleaner_scope".into(),
            self.cleaner_scope.value.to_string(),
            &self.cleaner_scope.source,
            &self.cleaner_scope.overridden,
        );
        push(
            "metrics_listen".into(),
            self.metrics_listen
                .value
                .map_or_else(String::new, |a| a.to_string()),
            &self.metrics_listen.source,
            &self.metrics_listen.overridden,
        );
        push(
            "metrics_file".into(),
            self.metrics_file
                .value
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
            &self.metrics_file.source,
            &self.metrics_file.overridden,
        );
        push(
            "metrics_file_interval_s".into(),
            self.metrics_file_interval_s.value.to_string(),
            &self.metrics_file_interval_s.source,
            &self.metrics_file_interval_s.overridden,
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
pub(crate) fn looks_secret(name: &str) -> bool {
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

pub(super) fn redact_if_secret(name: &str, value: &str) -> String {
    if looks_secret(name) {
        "***".into()
    } else {
        value.to_string()
    }
}
