//! What a plugin declares: its descriptor, the context its probe and build get, its
//! priority, and its registration.

use std::fmt;
use std::path::Path;

use crate::backend::{BackendKind, DynBackend};
use crate::config::Config;
use crate::error::Result;
use crate::params::{ParamSpec, PluginParams};
use crate::probe::{Findings, Probe};

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

/// Where a plugin comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginOrigin {
    /// Compiled into this program.
    BuiltIn,
    /// Loaded at run time from this file (a shared library exporting the C plugin ABI).
    File(&'static Path),
}

impl serde::Serialize for PluginOrigin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for PluginOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginOrigin::BuiltIn => f.write_str("built-in"),
            PluginOrigin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The probe and build of a plugin that is not compiled in: a loader (the C plugin ABI's)
/// implements it once for every plugin it loads, and describes each one with
/// [`PluginDescriptor::loaded`].
pub trait LoadedPlugin: Send + Sync + fmt::Debug {
    /// The plugin's functional probe.
    fn probe(&self, ctx: &PluginContext<'_>) -> Probe;
    /// Builds a backend.
    fn build(&self, ctx: &PluginContext<'_>) -> Result<DynBackend>;
}

/// How probe and build are reached.
#[derive(Clone, Copy, Debug)]
enum Hooks {
    Static {
        probe: fn(&PluginContext<'_>) -> Probe,
        build: fn(&PluginContext<'_>) -> Result<DynBackend>,
    },
    Loaded(&'static dyn LoadedPlugin),
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
    /// Compiled in, or loaded from a file.
    pub origin: PluginOrigin,
    hooks: Hooks,
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
            origin: PluginOrigin::BuiltIn,
            hooks: Hooks::Static { probe, build },
        }
    }

    /// A plugin loaded at run time from `path`, reached through `plugin` (priority 0, no
    /// parameters until [`with_params`](Self::with_params)).
    pub const fn loaded(
        name: &'static str,
        kind: BackendKind,
        summary: &'static str,
        plugin: &'static dyn LoadedPlugin,
        path: &'static Path,
    ) -> Self {
        PluginDescriptor {
            name,
            kind,
            priority: 0,
            summary,
            params: &[],
            origin: PluginOrigin::File(path),
            hooks: Hooks::Loaded(plugin),
        }
    }

    /// Runs the functional probe: proves the plugin can work here, and says what it found.
    pub fn probe(&self, ctx: &PluginContext<'_>) -> Probe {
        match self.hooks {
            Hooks::Static { probe, .. } => probe(ctx),
            Hooks::Loaded(plugin) => plugin.probe(ctx),
        }
    }

    /// Builds a backend.
    pub fn build(&self, ctx: &PluginContext<'_>) -> Result<DynBackend> {
        match self.hooks {
            Hooks::Static { build, .. } => build(ctx),
            Hooks::Loaded(plugin) => plugin.build(ctx),
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
