//! Plugin descriptors, their registration, and deterministic, explained selection.
//!
//! A plugin crate declares one `pub static DESCRIPTOR: PluginDescriptor` and registers it
//! with [`register_plugin!`](crate::register_plugin). The facade also names every enabled
//! descriptor directly, because inventory entries in an rlib nothing references are dropped
//! by the linker; [`PluginRegistry::new`] merges both lists and de-duplicates by identity.
//!
//! Selection never trusts presence: `auto` runs each plugin's *functional* probe in priority
//! order (FILE `3FS > POSIX > GDS_MT > GDS`, then OBJ) and takes the first usable one; a
//! plugin named explicitly is probed too, and an unusable one is an error that says why —
//! never a silent switch to another plugin.

mod descriptor;

pub use descriptor::{
    LoadedPlugin, PluginContext, PluginDescriptor, PluginOrigin, PluginRef, priority,
};

use serde::Serialize;

use crate::backend::{BackendKind, DynBackend};
use crate::config::{Config, PluginChoice};
use crate::config::{
    ConfigLoader, KnownPlugins, RawValue, Setting, Source, check_plugin_keys, known_top_level,
};
use crate::error::closest_match;
use crate::error::{Error, Result};
use crate::params::{PluginParams, typed};
use crate::probe::{Fact, Findings, Probe, Verdict};

/// One plugin as selection saw it.
#[derive(Clone, Debug, Serialize)]
pub struct Considered {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: BackendKind,
    /// Priority.
    pub priority: i32,
    /// Compiled in, or the file it was loaded from.
    pub origin: PluginOrigin,
    /// Probe verdict (or why it was not probed).
    pub verdict: Verdict,
    /// What the probe established (none when it did not run).
    pub facts: Vec<Fact>,
    /// What the probe handed to the plugin's build (opaque except to tools that know the
    /// plugin).
    #[serde(skip)]
    pub findings: Findings,
    /// Whether a probe ran (false: not needed, a higher-priority plugin was usable).
    pub probed: bool,
}

/// The outcome of selection: which plugin, with what parameters, and why.
#[derive(Debug)]
pub struct Selection {
    /// The chosen plugin.
    pub plugin: &'static PluginDescriptor,
    /// Its validated parameters.
    pub params: PluginParams,
    /// What its probe handed to its build.
    pub findings: Findings,
    /// What was asked for.
    pub requested: PluginChoice,
    /// Every plugin considered, in the order tried.
    pub considered: Vec<Considered>,
    /// Config sections that name no plugin of this registry (see
    /// [`PluginRegistry::unregistered_sections`]); `open` logs them.
    pub warnings: Vec<String>,
}

impl Selection {
    /// The one INFO line selection logs.
    pub fn summary(&self) -> String {
        let considered: Vec<String> = self
            .considered
            .iter()
            .map(|c| format!("{} [{}]", c.name, c.verdict))
            .collect();
        format!(
            "selected plugin {} (requested: {}) with params {}; considered: {}",
            self.plugin.name,
            self.requested,
            self.params,
            considered.join(", ")
        )
    }
}

/// A plugin file that was not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejected {
    /// The file.
    pub path: std::path::PathBuf,
    /// Why it was not loaded, with what to do about it.
    pub reason: String,
}

/// All plugins of this process, in selection order.
#[derive(Debug, Clone)]
pub struct PluginRegistry {
    plugins: Vec<&'static PluginDescriptor>,
    rejected: Vec<Rejected>,
}

impl PluginRegistry {
    /// The inventory-registered plugins merged with `builtin` (the facade's explicit list).
    pub fn new(builtin: &[&'static PluginDescriptor]) -> Result<Self> {
        let collected = inventory::iter::<PluginRef>.into_iter().map(|r| r.0);
        Self::from_descriptors(builtin.iter().copied().chain(collected))
    }

    /// A registry of exactly these descriptors (tests, embedding).
    pub fn from_descriptors(
        descriptors: impl IntoIterator<Item = &'static PluginDescriptor>,
    ) -> Result<Self> {
        let mut plugins: Vec<&'static PluginDescriptor> = Vec::new();
        for d in descriptors {
            if plugins.iter().any(|p| std::ptr::eq(*p, d)) {
                continue;
            }
            if plugins.iter().any(|p| p.name.eq_ignore_ascii_case(d.name)) {
                return Err(Error::DuplicatePlugin {
                    name: d.name.to_string(),
                });
            }
            plugins.push(d);
        }
        // FILE before OBJ, then priority, then name: deterministic whatever the link order.
        plugins.sort_by(|a, b| {
            (a.kind, -a.priority, a.name.to_ascii_uppercase()).cmp(&(
                b.kind,
                -b.priority,
                b.name.to_ascii_uppercase(),
            ))
        });
        Ok(PluginRegistry {
            plugins,
            rejected: Vec::new(),
        })
    }

    /// With these plugin files recorded as not loaded (shown by `hicache plugins` and
    /// `doctor`).
    pub fn with_rejected(mut self, rejected: impl IntoIterator<Item = Rejected>) -> Self {
        self.rejected.extend(rejected);
        self
    }

    /// Plugins in selection order.
    pub fn plugins(&self) -> &[&'static PluginDescriptor] {
        &self.plugins
    }

    /// Plugin files found in the plugin dirs that were not loaded, with the reason.
    pub fn rejected(&self) -> &[Rejected] {
        &self.rejected
    }

    /// A plugin by name (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&'static PluginDescriptor> {
        self.plugins
            .iter()
            .copied()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }

    fn unknown(&self, name: &str) -> Error {
        Error::unknown_plugin(name, self.plugins.iter().map(|p| p.name))
    }

    /// Probes every plugin (for `hicache plugins` / `doctor`). Hand the result to
    /// [`select_probed`](Self::select_probed) to choose without probing again.
    pub fn probe_all(&self, config: &Config) -> Vec<Considered> {
        self.plugins
            .iter()
            .map(|p| considered(p, probe_one(p, config), true))
            .collect()
    }

    /// Chooses a plugin for `config` (see the module docs), probing as it goes.
    pub fn select(&self, config: &Config) -> Result<Selection> {
        self.select_excluding(config, &[])
    }

    /// Chooses as [`select`](Self::select) does, from probes already run by
    /// [`probe_all`](Self::probe_all): no plugin is probed again (one missing from
    /// `probed` is probed now).
    pub fn select_probed(&self, config: &Config, probed: &[Considered]) -> Result<Selection> {
        self.choose(config, &[], Some(probed))
    }

    /// Selection that treats `failed` plugins (name, reason) as unusable: used when building
    /// an auto-selected plugin failed, so auto moves on to the next one.
    pub fn select_excluding(
        &self,
        config: &Config,
        failed: &[(String, String)],
    ) -> Result<Selection> {
        self.choose(config, failed, None)
    }

    fn choose(
        &self,
        config: &Config,
        failed: &[(String, String)],
        probed: Option<&[Considered]>,
    ) -> Result<Selection> {
        self.check_flat_keys(config)?;
        let probe = |plugin: &PluginDescriptor| {
            let recorded = probed
                .into_iter()
                .flatten()
                .find(|c| c.probed && c.name == plugin.name);
            match recorded {
                Some(c) => {
                    Probe::from_parts(c.verdict.clone(), c.facts.clone(), c.findings.clone())
                }
                None => probe_one(plugin, config),
            }
        };
        let requested = config.plugin.value.clone();
        match &requested {
            PluginChoice::Named(name) => {
                let plugin = self.get(name).ok_or_else(|| self.unknown(name))?;
                let params = params_for(plugin, config)?;
                let found = probe(plugin);
                if let Verdict::Unusable { reason, hint } = found.verdict() {
                    return Err(Error::PluginUnusable {
                        plugin: plugin.name.to_string(),
                        reason: reason.clone(),
                        hint: hint.clone(),
                    });
                }
                let seen = considered(plugin, found, true);
                Ok(Selection {
                    plugin,
                    params,
                    findings: seen.findings.clone(),
                    requested,
                    considered: vec![seen],
                    warnings: self.unregistered_sections(config),
                })
            }
            PluginChoice::Auto => {
                let mut seen: Vec<Considered> = Vec::new();
                let mut chosen = None;
                for plugin in &self.plugins {
                    if chosen.is_some() {
                        seen.push(considered(
                            plugin,
                            Verdict::Unusable {
                                reason: "not probed: a higher-priority plugin is usable".into(),
                                hint: None,
                            }
                            .into(),
                            false,
                        ));
                        continue;
                    }
                    let found = match failed.iter().find(|(n, _)| n == plugin.name) {
                        Some((_, reason)) => Verdict::Unusable {
                            reason: format!("build failed: {reason}"),
                            hint: None,
                        }
                        .into(),
                        None => probe(plugin),
                    };
                    if found.verdict().is_usable() {
                        chosen = Some((*plugin, seen.len()));
                    }
                    seen.push(considered(plugin, found, true));
                }
                let Some((plugin, at)) = chosen else {
                    return Err(Error::NoUsablePlugin {
                        tried: seen
                            .into_iter()
                            .map(|c| (c.name, c.verdict.to_string()))
                            .collect(),
                    });
                };
                let params = params_for(plugin, config)?;
                Ok(Selection {
                    plugin,
                    params,
                    findings: seen[at].findings.clone(),
                    requested,
                    considered: seen,
                    warnings: self.unregistered_sections(config),
                })
            }
        }
    }

    /// One warning per `[plugin.<name>]` section of `config` that names no plugin of this
    /// registry: the config means a plugin the program does not have. The usual cause is a
    /// plugin crate that is a dependency but never named (the linker drops it, and its
    /// registration with it), or a plugin library missing from `plugin_dirs`.
    pub fn unregistered_sections(&self, config: &Config) -> Vec<String> {
        config
            .plugin_sections
            .iter()
            .filter(|(name, _)| self.get(name).is_none())
            .map(|(name, _)| {
                format!(
                    "the config has a [plugin.{}] section, but no plugin {name} is registered (registered: {}); a plugin crate that is only a dependency is dropped by the linker: name its DESCRIPTOR where the registry is built (`hicache::registry_with`, `hicache_cli::Commands::plugin`), or put its shared library in a dir of `plugin_dirs`",
                    name.to_ascii_lowercase(),
                    self.plugins.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
                )
            })
            .collect()
    }

    /// A plugin key that no plugin of this registry takes is a typo (or belongs to a plugin
    /// this build lacks): one error naming it and the closest known key, before any plugin
    /// is probed.
    fn check_flat_keys(&self, config: &Config) -> Result<()> {
        check_plugin_keys(config, &known_plugins(&self.plugins))
    }

    /// Builds the selected plugin's backend, with what its probe found (so its build does
    /// not test again what the probe established).
    pub fn build(&self, config: &Config, selection: &Selection) -> Result<DynBackend> {
        let ctx = PluginContext::new(config, &selection.params).with_findings(&selection.findings);
        selection.plugin.build(&ctx)
    }

    /// Selects and builds a backend. Under `auto`, a plugin whose build fails is skipped
    /// (with its error as the reason) and the next usable one is tried.
    pub fn open(&self, config: &Config) -> Result<(DynBackend, Selection)> {
        let mut failed: Vec<(String, String)> = Vec::new();
        loop {
            let selection = self.select_excluding(config, &failed)?;
            match self.build(config, &selection) {
                Ok(backend) => {
                    for w in &selection.warnings {
                        tracing::warn!("{w}");
                    }
                    tracing::info!("{}", selection.summary());
                    return Ok((backend, selection));
                }
                Err(e) if selection.requested == PluginChoice::Auto => {
                    tracing::warn!(plugin = selection.plugin.name, error = %e, "auto-selected plugin failed to build; trying the next one");
                    failed.push((selection.plugin.name.to_string(), e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn known_plugins(plugins: &[&'static PluginDescriptor]) -> KnownPlugins {
    plugins
        .iter()
        .map(|p| (p.name, p.params.iter().map(|s| s.name).collect()))
        .collect()
}

impl ConfigLoader {
    /// Checks plugin keys against `plugins` at [`load`](Self::load): a top-level key that
    /// is neither hicache's own nor a parameter of one of them, or a key in
    /// `[plugin.<name>]` that plugin does not take, fails `load` with one error naming the
    /// key and the closest known one. The facade's `hicache::config()` starts here with
    /// every plugin of the build.
    pub fn plugins(mut self, plugins: &[&'static PluginDescriptor]) -> Self {
        self.known_plugins = Some(known_plugins(plugins));
        self
    }
}

fn considered(p: &PluginDescriptor, probe: Probe, probed: bool) -> Considered {
    let (verdict, facts, findings) = probe.into_parts();
    Considered {
        name: p.name.to_string(),
        kind: p.kind,
        priority: p.priority,
        origin: p.origin,
        verdict,
        facts,
        findings,
        probed,
    }
}

/// Validates parameters and runs the probe; a parameter error makes the plugin unusable.
fn probe_one(p: &PluginDescriptor, config: &Config) -> Probe {
    match params_for(p, config) {
        Ok(params) => p.probe(&PluginContext::new(config, &params)),
        Err(e) => Verdict::Unusable {
            reason: format!("config does not fit this plugin: {e}"),
            hint: None,
        }
        .into(),
    }
}

/// The validated parameters of `plugin`: its `[plugin.<name>]` section, plus flat-form
/// parameters, plus environment fallbacks. Unknown names are errors with a suggestion.
pub fn params_for(plugin: &PluginDescriptor, config: &Config) -> Result<PluginParams> {
    let mut out = PluginParams::default();
    let section = config.section(plugin.name);
    let given = section
        .into_iter()
        .flat_map(|s| s.params.iter())
        .chain(config.flat_params.iter());
    for (name, setting) in given {
        let Some(spec) = plugin.params.iter().find(|s| s.name == name) else {
            let candidates = plugin
                .params
                .iter()
                .map(|s| s.name)
                .chain(known_top_level());
            return Err(Error::UnknownConfigKey {
                key: name.to_string(),
                context: format!(
                    "parameters of plugin {} (accepted: {})",
                    plugin.name,
                    plugin
                        .params
                        .iter()
                        .map(|s| s.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                suggestion: closest_match(name, candidates),
            });
        };
        if out.values.iter().any(|(s, _)| s.name == spec.name) {
            continue; // the plugin section wins over the flat form
        }
        let value = typed(spec, &setting.value, &setting.source)?;
        out.values.push((
            spec,
            Setting {
                value,
                source: setting.source.clone(),
                overridden: Vec::new(),
            },
        ));
    }
    for spec in plugin.params {
        if out.values.iter().any(|(s, _)| s.name == spec.name) {
            continue;
        }
        for var in spec.env_fallback {
            if let Some(v) = config.env_var_for(var, spec.name)? {
                let source = Source::Env(var.to_string());
                let value = typed(spec, &RawValue::Str(v.to_string()), &source)?;
                out.values.push((
                    spec,
                    Setting {
                        value,
                        source,
                        overridden: Vec::new(),
                    },
                ));
                break;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
