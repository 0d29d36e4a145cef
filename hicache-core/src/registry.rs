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

use serde::Serialize;

use crate::backend::{BackendKind, DynBackend};
use crate::config::{Config, PluginChoice};
use crate::config::{
    ConfigLoader, KnownPlugins, RawValue, Setting, Source, check_plugin_keys, known_top_level,
};
use crate::error::closest_match;
use crate::error::{Error, Result};
use crate::params::{ParamSpec, PluginParams, typed};
use crate::probe::{Fact, Findings, Probe, Verdict};

/// Default priorities (higher is tried first within a kind); SGLang's order.
pub mod priority {
    /// DeepSeek 3FS.
    pub const THREEFS: i32 = 400;
    /// POSIX files.
    pub const POSIX: i32 = 300;
    /// GPUDirect Storage, thread pool.
    pub const GDS_MT: i32 = 200;
    /// GPUDirect Storage, batch API.
    pub const GDS: i32 = 100;
    /// Object storage.
    pub const OBJ: i32 = 100;
}

/// What probe and build get: the whole config, this plugin's validated parameters and, in
/// `build`, what this plugin's probe found.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PluginContext<'a> {
    /// The effective configuration.
    pub config: &'a Config,
    /// This plugin's parameters.
    pub params: &'a PluginParams,
    /// In `build` after selection probed the plugin: the probe's findings.
    pub probed: Option<&'a Findings>,
}

impl<'a> PluginContext<'a> {
    /// A context with no probe findings (the probe's own, or a build without selection).
    pub fn new(config: &'a Config, params: &'a PluginParams) -> Self {
        PluginContext {
            config,
            params,
            probed: None,
        }
    }

    /// With the findings of this plugin's probe.
    pub fn with_findings(mut self, findings: &'a Findings) -> Self {
        self.probed = Some(findings);
        self
    }

    /// The probe's findings as `T`: `None` when no probe ran for this build, or it found
    /// nothing of that type. A build uses them instead of testing again, and tests itself
    /// when they are absent.
    pub fn findings<T: std::any::Any>(&self) -> Option<&'a T> {
        self.probed?.get::<T>()
    }
}

/// A statically known plugin, built with [`PluginDescriptor::new`] (fields may be added
/// without breaking plugins):
///
/// ```
/// # use hicache_core::raw::{BackendKind, DynBackend, PluginContext, PluginDescriptor};
/// # use hicache_core::Result;
/// # use hicache_core::raw::Probe;
/// # fn probe(_: &PluginContext<'_>) -> Probe { Probe::unusable("no device", "none") }
/// # fn build(_: &PluginContext<'_>) -> Result<DynBackend> { unreachable!() }
/// hicache_core::plugin_params! {
///     pub struct AcmeParams {
///         depth: UInt = "depth" => "requests in flight";
///     }
/// }
/// pub static DESCRIPTOR: PluginDescriptor =
///     PluginDescriptor::new("ACME", BackendKind::File, "ACME's storage", probe, build)
///         .with_priority(50)
///         .with_params(AcmeParams::SPECS);
/// assert_eq!(DESCRIPTOR.params.len(), 1);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct PluginDescriptor {
    /// Name (matched case-insensitively), e.g. `POSIX`.
    pub name: &'static str,
    /// File or object storage.
    pub kind: BackendKind,
    /// Higher is tried first within a kind (see [`priority`]).
    pub priority: i32,
    /// One line for `hicache plugins`.
    pub summary: &'static str,
    /// Accepted parameters.
    pub params: &'static [ParamSpec],
    /// Functional probe: proves the plugin can work here, and says what it found.
    pub probe: fn(&PluginContext<'_>) -> Probe,
    /// Builds a backend.
    pub build: fn(&PluginContext<'_>) -> Result<DynBackend>,
}

impl PluginDescriptor {
    /// A plugin of priority 0 with no parameters.
    pub const fn new(
        name: &'static str,
        kind: BackendKind,
        summary: &'static str,
        probe: fn(&PluginContext<'_>) -> Probe,
        build: fn(&PluginContext<'_>) -> Result<DynBackend>,
    ) -> Self {
        PluginDescriptor {
            name,
            kind,
            priority: 0,
            summary,
            params: &[],
            probe,
            build,
        }
    }

    /// With this priority (higher is tried first within a kind; see [`priority`]).
    pub const fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// With these parameters (usually `MyParams::SPECS` from
    /// [`plugin_params!`](crate::plugin_params)).
    pub const fn with_params(mut self, params: &'static [ParamSpec]) -> Self {
        self.params = params;
        self
    }
}

/// Wrapper collected by inventory.
#[doc(hidden)]
pub struct PluginRef(pub &'static PluginDescriptor);

inventory::collect!(PluginRef);

/// Registers a `static` [`PluginDescriptor`] with the process-wide plugin list.
#[macro_export]
macro_rules! register_plugin {
    ($descriptor:path) => {
        $crate::__private::inventory::submit! {
            $crate::raw::PluginRef(&$descriptor)
        }
    };
}

/// One plugin as selection saw it.
#[derive(Clone, Debug, Serialize)]
pub struct Considered {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: BackendKind,
    /// Priority.
    pub priority: i32,
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

/// All plugins of this process, in selection order.
#[derive(Debug, Clone)]
pub struct PluginRegistry {
    plugins: Vec<&'static PluginDescriptor>,
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
        Ok(PluginRegistry { plugins })
    }

    /// Plugins in selection order.
    pub fn plugins(&self) -> &[&'static PluginDescriptor] {
        &self.plugins
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
                })
            }
        }
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
        (selection.plugin.build)(&ctx)
    }

    /// Selects and builds a backend. Under `auto`, a plugin whose build fails is skipped
    /// (with its error as the reason) and the next usable one is tried.
    pub fn open(&self, config: &Config) -> Result<(DynBackend, Selection)> {
        let mut failed: Vec<(String, String)> = Vec::new();
        loop {
            let selection = self.select_excluding(config, &failed)?;
            match self.build(config, &selection) {
                Ok(backend) => {
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
        verdict,
        facts,
        findings,
        probed,
    }
}

/// Validates parameters and runs the probe; a parameter error makes the plugin unusable.
fn probe_one(p: &PluginDescriptor, config: &Config) -> Probe {
    match params_for(p, config) {
        Ok(params) => (p.probe)(&PluginContext::new(config, &params)),
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
            if let Some(v) = config.env_var(var) {
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
mod tests {
    use super::*;
    use crate::config::{ConfigLoader, EnvSnapshot};

    fn usable(_: &PluginContext<'_>) -> Probe {
        Probe::usable("fake")
    }
    fn unusable(_: &PluginContext<'_>) -> Probe {
        Probe::unusable("no mount", "mount it")
    }
    fn no_build(ctx: &PluginContext<'_>) -> Result<DynBackend> {
        Err(Error::backend(
            "FAKE",
            format!("build not available in tests {}", ctx.params),
        ))
    }
    fn build_memory(_: &PluginContext<'_>) -> Result<DynBackend> {
        Ok(std::sync::Arc::new(
            crate::memory_backend::MemoryBackend::new(),
        ))
    }

    crate::plugin_params! {
        struct FakeParams {
            use_uring: Bool = "use_uring" => "io_uring";
            bucket: Str = "bucket" => "bucket", env(&["AWS_DEFAULT_BUCKET"]);
            secret_key: Str = "secret_key" => "secret", secret;
            mode: OneOf["dram", "dram_zc"] = "mode" => "mode";
        }
    }
    const PARAMS: &[ParamSpec] = FakeParams::SPECS;

    macro_rules! fake {
        ($id:ident, $name:literal, $kind:ident, $prio:expr, $probe:ident, $build:ident) => {
            static $id: PluginDescriptor = PluginDescriptor {
                name: $name,
                kind: BackendKind::$kind,
                priority: $prio,
                summary: "fake",
                params: PARAMS,
                probe: $probe,
                build: $build,
            };
        };
    }
    fake!(THREEFS, "3FS", File, priority::THREEFS, unusable, no_build);
    fake!(POSIX, "POSIX", File, priority::POSIX, usable, build_memory);
    fake!(GDS_MT, "GDS_MT", File, priority::GDS_MT, usable, no_build);
    fake!(GDS, "GDS", File, priority::GDS, usable, no_build);
    fake!(OBJ, "OBJ", Object, priority::OBJ, usable, no_build);
    fake!(
        POSIX_BROKEN,
        "POSIX",
        File,
        priority::POSIX,
        usable,
        no_build
    );
    fake!(POSIX_LOWER, "posix", File, 1, usable, no_build);
    fake!(
        POSIX_DOWN,
        "POSIX",
        File,
        priority::POSIX,
        unusable,
        no_build
    );

    fn registry(list: &[&'static PluginDescriptor]) -> PluginRegistry {
        PluginRegistry::from_descriptors(list.iter().copied()).unwrap()
    }

    fn auto() -> Config {
        ConfigLoader::new().load().unwrap()
    }

    #[test]
    fn order_is_deterministic_whatever_the_input_order() {
        let a = registry(&[&OBJ, &GDS, &POSIX, &THREEFS, &GDS_MT]);
        let b = registry(&[&GDS_MT, &THREEFS, &OBJ, &POSIX, &GDS]);
        let names = |r: &PluginRegistry| r.plugins().iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(names(&a), ["3FS", "POSIX", "GDS_MT", "GDS", "OBJ"]);
        assert_eq!(names(&a), names(&b));
    }

    #[test]
    fn auto_takes_first_usable_and_explains() {
        let r = registry(&[&OBJ, &GDS, &POSIX, &THREEFS, &GDS_MT]);
        let s = r.select(&auto()).unwrap();
        assert_eq!(s.plugin.name, "POSIX");
        assert_eq!(s.considered.len(), 5);
        assert!(!s.considered[0].verdict.is_usable());
        assert!(s.considered[2..].iter().all(|c| !c.probed));
        let line = s.summary();
        assert!(
            line.contains("selected plugin POSIX")
                && line.contains("3FS [unusable: no mount; hint: mount it]"),
            "{line}"
        );
    }

    #[test]
    fn explicit_unusable_is_an_error_not_a_fallback() {
        let r = registry(&[&THREEFS, &POSIX]);
        let cfg = ConfigLoader::new().set("plugin", "3fs").load().unwrap();
        let err = r.select(&cfg).unwrap_err();
        assert!(matches!(&err, Error::PluginUnusable { plugin, .. } if plugin == "3FS"));
        assert!(err.to_string().contains("mount it"));
    }

    #[test]
    fn unknown_and_case_insensitive_names() {
        let r = registry(&[&POSIX, &GDS]);
        let cfg = ConfigLoader::new().set("plugin", "Posix").load().unwrap();
        assert_eq!(r.select(&cfg).unwrap().plugin.name, "POSIX");
        let cfg = ConfigLoader::new().set("plugin", "posx").load().unwrap();
        let err = r.select(&cfg).unwrap_err();
        assert!(err.to_string().contains("did you mean `POSIX`"), "{err}");
    }

    #[test]
    fn duplicates_are_errors_but_the_same_static_is_merged() {
        assert!(PluginRegistry::from_descriptors([&POSIX, &POSIX]).is_ok());
        let err = PluginRegistry::from_descriptors([&POSIX, &POSIX_LOWER]).unwrap_err();
        assert!(matches!(err, Error::DuplicatePlugin { .. }));
    }

    #[test]
    fn nothing_usable_lists_every_reason() {
        let r = registry(&[&THREEFS, &POSIX_DOWN]);
        let err = r.select(&auto()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("3FS: unusable: no mount") && msg.contains("POSIX"),
            "{msg}"
        );
        let empty = registry(&[]);
        assert!(empty.select(&auto()).is_err());
    }

    #[test]
    fn auto_skips_a_plugin_whose_build_fails() {
        let r = registry(&[&POSIX_BROKEN, &GDS_MT, &OBJ]);
        let err = r.open(&auto()).unwrap_err();
        // Every plugin failed to build; each reason is reported.
        let msg = err.to_string();
        assert!(
            msg.contains("POSIX: unusable: build failed") && msg.contains("OBJ"),
            "{msg}"
        );
        let r = registry(&[&THREEFS, &POSIX]);
        let (backend, sel) = r.open(&auto()).unwrap();
        assert_eq!(sel.plugin.name, "POSIX");
        assert_eq!(backend.info().name, "MEMORY");
    }

    #[test]
    fn params_are_typed_checked_and_redacted() {
        let r = registry(&[&POSIX]);
        let cfg = ConfigLoader::new()
            .set("plugin.posix.use_uring", "false")
            .set("plugin.posix.secret_key", "hunter2")
            .set("plugin.posix.mode", "DRAM_ZC")
            .env(EnvSnapshot::from_pairs([(
                "AWS_DEFAULT_BUCKET",
                "envbucket",
            )]))
            .load()
            .unwrap();
        let s = r.select(&cfg).unwrap();
        let p = FakeParams::from_params(&s.params);
        assert!(!p.use_uring.unwrap().value);
        let bucket = p.bucket.unwrap();
        assert_eq!(bucket.value, "envbucket");
        assert_eq!(
            bucket.source,
            crate::config::Source::Env("AWS_DEFAULT_BUCKET".into())
        );
        assert_eq!(p.mode.unwrap().value, "dram_zc");
        assert_eq!(p.secret_key.unwrap().value, "hunter2");
        assert!(!s.summary().contains("hunter2"));
        assert!(!format!("{:?}", s.params).contains("hunter2"));

        let cfg = ConfigLoader::new()
            .set("plugin.posix.bucket", "cfg")
            .env(EnvSnapshot::from_pairs([(
                "AWS_DEFAULT_BUCKET",
                "envbucket",
            )]))
            .load()
            .unwrap();
        assert_eq!(
            FakeParams::from_params(&r.select(&cfg).unwrap().params)
                .bucket
                .unwrap()
                .value,
            "cfg",
            "config beats the env fallback"
        );

        let cfg = ConfigLoader::new()
            .set("plugin.posix.use_urin", "true")
            .load()
            .unwrap();
        let err = r.select(&cfg).unwrap_err();
        assert!(
            err.to_string().contains("did you mean `use_uring`"),
            "{err}"
        );
        let cfg = ConfigLoader::new()
            .set("plugin.posix.use_uring", "perhaps")
            .load()
            .unwrap();
        assert!(r.select(&cfg).is_err());
        let cfg = ConfigLoader::new()
            .set("plugin.posix.secret_key", 5)
            .load()
            .unwrap();
        let err = r.select(&cfg).unwrap_err().to_string();
        assert!(err.contains("***") && !err.contains('5'), "{err}");
    }

    #[test]
    fn a_top_level_typo_is_one_error_before_any_probe() {
        let r = registry(&[&THREEFS, &POSIX, &OBJ]);
        for plugin in ["auto", "POSIX"] {
            let cfg = ConfigLoader::new()
                .extra_config(&format!(r#"{{"plugin": "{plugin}", "storge_dir": "/x"}}"#))
                .load()
                .unwrap();
            let e = r.select(&cfg).unwrap_err();
            assert!(matches!(e, Error::UnknownConfigKey { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains("`storge_dir`"), "{text}");
            assert!(text.contains("did you mean `storage_dir`"), "{text}");
            assert_eq!(text.matches("storge_dir").count(), 1, "{text}");
        }
        // A parameter some plugin takes is not a typo.
        let cfg = ConfigLoader::new()
            .extra_config(r#"{"plugin": "auto", "use_uring": true}"#)
            .load()
            .unwrap();
        assert!(r.select(&cfg).is_ok());
    }

    #[test]
    fn a_loader_told_the_plugins_rejects_a_typo_at_load_once() {
        let plugins: &[&'static PluginDescriptor] = &[&THREEFS, &POSIX, &OBJ];
        let e = ConfigLoader::new()
            .plugins(plugins)
            .extra_config(r#"{"plugin": "auto", "storge_dir": "/x"}"#)
            .load()
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::UnknownConfigKey { .. }), "{text}");
        assert!(text.contains("did you mean `storage_dir`"), "{text}");
        assert!(text.contains("the top level of inline config"), "{text}");
        assert_eq!(text.matches("storge_dir").count(), 1, "{text}");
        // A parameter one of the plugins takes loads, flat or in its section.
        ConfigLoader::new()
            .plugins(plugins)
            .extra_config(r#"{"use_uring": true}"#)
            .load()
            .unwrap();
        ConfigLoader::new()
            .plugins(plugins)
            .set("plugin.posix.use_uring", true)
            .load()
            .unwrap();
        // A section key its plugin does not take is refused; a section of a plugin this
        // build lacks is left for selection.
        let e = ConfigLoader::new()
            .plugins(plugins)
            .set("plugin.posix.use_urng", true)
            .load()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[plugin.posix]") && e.contains("did you mean `use_uring`"),
            "{e}"
        );
        ConfigLoader::new()
            .plugins(plugins)
            .set("plugin.gds.whatever", 1)
            .load()
            .unwrap();
        // Without the list, the same config loads and selection refuses it.
        ConfigLoader::new()
            .set("plugin.posix.use_urng", true)
            .load()
            .unwrap();
    }

    #[test]
    fn flat_params_steer_auto_to_a_plugin_they_fit() {
        static NO_PARAMS: PluginDescriptor = PluginDescriptor {
            name: "3FS",
            kind: BackendKind::File,
            priority: priority::THREEFS,
            summary: "fake",
            params: &[],
            probe: usable,
            build: no_build,
        };
        let r = registry(&[&NO_PARAMS, &POSIX]);
        let cfg = ConfigLoader::new()
            .extra_config(r#"{"use_uring": "true"}"#)
            .load()
            .unwrap();
        let s = r.select(&cfg).unwrap();
        assert_eq!(s.plugin.name, "POSIX");
        assert!(s.considered[0].verdict.to_string().contains("use_uring"));
    }

    /// Found by [`counting_probe`]; its build requires it.
    #[derive(Debug, PartialEq)]
    struct Slots(u32);

    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn counting_probe(_: &PluginContext<'_>) -> Probe {
        PROBES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Probe::usable("8 slots")
            .fact("/dev/fake0", "slots", "8")
            .with_findings(Slots(8))
    }

    fn build_with_findings(ctx: &PluginContext<'_>) -> Result<DynBackend> {
        match ctx.findings::<Slots>() {
            Some(Slots(8)) => build_memory(ctx),
            other => Err(Error::backend("FAKE", format!("findings: {other:?}"))),
        }
    }

    static FINDER: PluginDescriptor = PluginDescriptor::new(
        "FINDER",
        BackendKind::File,
        "fake",
        counting_probe,
        build_with_findings,
    );

    #[test]
    fn the_probe_runs_once_and_its_build_gets_the_findings() {
        let r = registry(&[&FINDER, &OBJ]);
        let cfg = auto();
        let before = PROBES.load(std::sync::atomic::Ordering::SeqCst);
        let probed = r.probe_all(&cfg);
        assert_eq!(probed[0].facts[0].value, "8");
        let selection = r.select_probed(&cfg, &probed).unwrap();
        assert_eq!(selection.plugin.name, "FINDER");
        r.build(&cfg, &selection).unwrap();
        assert_eq!(PROBES.load(std::sync::atomic::Ordering::SeqCst) - before, 1);
        // open probes once and builds with the findings; a build without them fails.
        r.open(&cfg).unwrap();
        assert_eq!(PROBES.load(std::sync::atomic::Ordering::SeqCst) - before, 2);
        let params = params_for(&FINDER, &cfg).unwrap();
        let e = (FINDER.build)(&PluginContext::new(&cfg, &params))
            .err()
            .unwrap();
        assert!(e.to_string().contains("findings: None"), "{e}");
    }
}
