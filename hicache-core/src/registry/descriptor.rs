//! What a plugin declares: its descriptor, the context its probe and build get, its
//! priority, and its registration.

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
