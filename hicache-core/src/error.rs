//! The one error type every hicache crate returns across its public boundary.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::region_id::RegionId;

/// The error an [`Error`] wraps, shared so that cloning an error (one per item of a batch
/// that failed as a whole) keeps it.
pub type SharedSource = Arc<dyn std::error::Error + Send + Sync>;

/// Result with the hicache [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in hicache, with enough context to act on it.
///
/// Messages start lowercase, carry the backend / key / path / descriptor involved, and end
/// with a hint where one helps. A read that finds no valid page is *not* an error: it is a
/// [`ReadOutcome::Miss`](crate::ReadOutcome::Miss) with a reason.
///
/// Errors are cheap to clone (underlying errors are shared), so a failure that ends a whole
/// batch reaches every item as itself: its variant, source and
/// [`is_retryable`](Error::is_retryable) are kept.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value has the wrong type or is out of range.
    #[error("invalid config value for `{key}` (from {source_desc}): {reason}{}", hint_suffix(.hint))]
    InvalidConfig {
        /// The key, as the user wrote it.
        key: String,
        /// Where the value came from (default, file path, environment variable, API).
        source_desc: String,
        /// What is wrong with it.
        reason: String,
        /// How to fix it.
        hint: Option<String>,
    },

    /// A configuration key that nothing understands.
    #[error("unknown config key `{key}` in {context}{}", suggestion_suffix(.suggestion))]
    UnknownConfigKey {
        /// The key, as the user wrote it.
        key: String,
        /// Where it was found (top level, `[plugin.posix]`, …).
        context: String,
        /// The closest known key, if any is close.
        suggestion: Option<String>,
    },

    /// A config file could not be read or parsed.
    #[error("cannot load config file {path}: {reason}")]
    ConfigFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// A page key or object name that is not allowed (it could escape the storage root, or is
    /// too long for a file name).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (possibly truncated for display).
        key: String,
        /// Why it is rejected.
        reason: String,
    },

    /// A transfer named a memory region that the backend does not hold.
    #[error(
        "{component}: region {region} is not registered; register the memory with the backend before transferring"
    )]
    UnregisteredRegion {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// The region named by the transfer.
        region: RegionId,
    },

    /// A transfer named bytes outside the region it points into.
    #[error(
        "{component}: slice [offset {offset}, len {len}] is outside region {region} of {region_len} bytes"
    )]
    SliceOutOfRange {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// The region.
        region: RegionId,
        /// Offset of the slice inside the region.
        offset: u64,
        /// Length of the slice.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },

    /// Memory that a transfer or copy would touch is in use by another transfer that
    /// conflicts with it (two writers, or a writer and a reader, of the same bytes).
    #[error(
        "{what}: bytes [offset {offset}, len {len}] of a {region_len}-byte region are in use by another transfer ({held}); wait for that transfer to finish, or give each concurrent call its own pages"
    )]
    MemoryBusy {
        /// Who asked (backend name, `connector`, `pool`).
        what: String,
        /// Offset of the requested range inside the region.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// Length of the region.
        region_len: u64,
        /// What holds the bytes (a read or a write, and how many transfers hold the region).
        held: String,
    },

    /// A registration cannot be released while transfers still use its memory.
    #[error(
        "{component}: region {region} is still used by {in_flight} in-flight transfer(s); wait for them (HiCache::unregister_pool waits) before deregistering"
    )]
    RegionBusy {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// The region.
        region: RegionId,
        /// Transfers (pinned slices) still holding it.
        in_flight: usize,
    },

    /// Direct I/O would reject the request: an address, offset or length is not aligned.
    /// Raised before any I/O is issued.
    #[error(
        "{component}: {what} is not aligned to {align} bytes (address {addr:#x}, len {len}) for direct I/O; use aligned host memory (page-aligned pool, stride multiple of {align}) or turn direct I/O off"
    )]
    Misaligned {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// What is misaligned (a slice of region N, a segment of key K, …).
        what: String,
        /// Required alignment.
        align: u64,
        /// The address involved.
        addr: u64,
        /// The length involved.
        len: u64,
    },

    /// A batch whose parts do not fit together (keys vs host indices, ragged pages, …).
    #[error("invalid batch: {reason}")]
    InvalidBatch {
        /// What does not fit.
        reason: String,
    },

    /// A blocking call was made inside an async runtime, where it would stall a worker.
    #[error(
        "BlockingHiCache::{operation} was called inside an async runtime, where blocking would stall it; call the async HiCache (BlockingHiCache::inner) there"
    )]
    BlockingInAsync {
        /// The blocking method called.
        operation: &'static str,
    },

    /// An operation that needs a registered host pool ran before `register_pool`.
    #[error("no host pool is registered: call register_pool before any I/O")]
    PoolNotRegistered,

    /// A host pool whose geometry or layout cannot be served.
    #[error("invalid host pool: {reason}")]
    InvalidPool {
        /// What is wrong.
        reason: String,
    },

    /// The requested plugin name is not registered in this build.
    #[error("unknown plugin `{name}`; registered plugins: [{}]{}{}", .available.join(", "), suggestion_suffix(.suggestion), missing_suffix(.feature, .suggestion))]
    UnknownPlugin {
        /// The name asked for.
        name: String,
        /// Registered plugin names.
        available: Vec<String>,
        /// A close name, if any.
        suggestion: Option<String>,
        /// The Cargo feature of the `hicache` crate that provides a plugin of this name,
        /// when it is one of hicache's own.
        feature: Option<&'static str>,
    },

    /// Two plugin descriptors share a name (names are case-insensitive).
    #[error(
        "plugin name `{name}` is registered twice; plugin names must be unique (case-insensitive)"
    )]
    DuplicatePlugin {
        /// The clashing name.
        name: String,
    },

    /// A plugin that was asked for explicitly cannot work on this machine.
    #[error("plugin {plugin} was requested but is unusable here: {reason}{}", hint_suffix(.hint))]
    PluginUnusable {
        /// The plugin.
        plugin: String,
        /// What its probe found.
        reason: String,
        /// How to fix it.
        hint: Option<String>,
    },

    /// `auto` found no usable plugin.
    #[error("no usable storage plugin: {}", format_tried(.tried))]
    NoUsablePlugin {
        /// Each plugin probed with the reason it was unusable.
        tried: Vec<(String, String)>,
    },

    /// An operating-system I/O error, with the path it concerns.
    #[error("{component}: {op} {}: {source}", .path.as_ref().map(|p| p.display().to_string()).unwrap_or_default())]
    Io {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// The operation (open, pwrite, rename, …).
        op: &'static str,
        /// The path, if one is involved.
        path: Option<PathBuf>,
        /// The OS error.
        #[source]
        source: Arc<std::io::Error>,
    },

    /// A symbolic link (or another entry hicache did not create) sits where a storage root
    /// holds its own dirs and files. It was not followed: a link under a root could send pages
    /// outside it, or writes through it onto another file.
    #[error(
        "{component}: {op} {}: a symbolic link sits under the storage root, where only hicache's own dirs and files belong; it was not followed. Remove it (`hicache doctor` lists them)",
        .path.display()
    )]
    UnsafePath {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// The operation that met it.
        op: &'static str,
        /// The link.
        path: PathBuf,
    },

    /// The backend cannot do what was asked (memory kind, operation, size).
    #[error("{component} does not support {operation}")]
    Unsupported {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// What it cannot do.
        operation: String,
    },

    /// A batch item did not finish in time.
    #[error("{component}: {op} timed out after {millis} ms")]
    Timeout {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// The operation.
        op: &'static str,
        /// The limit that ran out.
        millis: u64,
    },

    /// The storage service or device did not answer in time or dropped the connection
    /// (after the plugin's own retries): trying again later may succeed.
    #[error("{component}: {message}")]
    Unavailable {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// What happened.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<SharedSource>,
    },

    /// A plugin broke its side of the plugin contract (a result for an item it was not
    /// given, a missing result, a null where a string is due): a bug in the plugin, which
    /// the host caught before it could corrupt anything.
    #[error(
        "plugin {plugin} broke the plugin contract: {detail}; report it to the plugin's vendor"
    )]
    PluginContract {
        /// The plugin.
        plugin: String,
        /// What it did.
        detail: String,
    },

    /// Any other backend failure.
    #[error("{component}: {message}")]
    Backend {
        /// The backend (or the part of hicache) it happened in.
        component: Component,
        /// What happened.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<SharedSource>,
    },
}

impl Error {
    /// An invalid-config error without a hint.
    pub fn invalid_config(
        key: impl Into<String>,
        source_desc: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Error::InvalidConfig {
            key: key.into(),
            source_desc: source_desc.into(),
            reason: reason.into(),
            hint: None,
        }
    }

    /// A generic backend error carrying a message. `component` is a plugin name (`"POSIX"`)
    /// or a [`Component`].
    pub fn backend(component: impl Into<Component>, message: impl Into<String>) -> Self {
        Error::Backend {
            component: component.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A plugin name that is not registered, with a close registered name if there is
    /// one and the Cargo feature that provides it if it is one of hicache's own plugins.
    pub fn unknown_plugin<'a>(name: &str, available: impl IntoIterator<Item = &'a str>) -> Self {
        let available: Vec<String> = available.into_iter().map(str::to_string).collect();
        let feature = PLUGIN_FEATURES
            .iter()
            .find(|(plugin, _)| plugin.eq_ignore_ascii_case(name))
            .map(|(_, feature)| *feature);
        Error::UnknownPlugin {
            name: name.to_string(),
            suggestion: closest_match(name, available.iter().map(String::as_str)),
            available,
            feature,
        }
    }

    /// An I/O error with its operation and path.
    pub fn io(
        component: impl Into<Component>,
        op: &'static str,
        path: Option<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            component: component.into(),
            op,
            path,
            source: Arc::new(source),
        }
    }

    /// A backend error with the error that caused it.
    pub fn backend_with_source(
        component: impl Into<Component>,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Backend {
            component: component.into(),
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The backend or part of hicache the error happened in, for the errors that name one.
    pub fn component(&self) -> Option<&Component> {
        match self {
            Error::UnregisteredRegion { component, .. }
            | Error::SliceOutOfRange { component, .. }
            | Error::RegionBusy { component, .. }
            | Error::Misaligned { component, .. }
            | Error::Io { component, .. }
            | Error::UnsafePath { component, .. }
            | Error::Unsupported { component, .. }
            | Error::Timeout { component, .. }
            | Error::Unavailable { component, .. }
            | Error::Backend { component, .. } => Some(component),
            _ => None,
        }
    }

    /// A short stable name for the variant, as metrics label errors (`io`, `timeout`,
    /// `invalid_config`…).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidConfig { .. } => "invalid_config",
            Error::UnknownConfigKey { .. } => "unknown_config_key",
            Error::ConfigFile { .. } => "config_file",
            Error::InvalidKey { .. } => "invalid_key",
            Error::UnregisteredRegion { .. } => "unregistered_region",
            Error::SliceOutOfRange { .. } => "slice_out_of_range",
            Error::MemoryBusy { .. } => "memory_busy",
            Error::RegionBusy { .. } => "region_busy",
            Error::Misaligned { .. } => "misaligned",
            Error::InvalidBatch { .. } => "invalid_batch",
            Error::BlockingInAsync { .. } => "blocking_in_async",
            Error::PoolNotRegistered => "pool_not_registered",
            Error::InvalidPool { .. } => "invalid_pool",
            Error::UnknownPlugin { .. } => "unknown_plugin",
            Error::DuplicatePlugin { .. } => "duplicate_plugin",
            Error::PluginUnusable { .. } => "plugin_unusable",
            Error::NoUsablePlugin { .. } => "no_usable_plugin",
            Error::Io { .. } => "io",
            Error::UnsafePath { .. } => "unsafe_path",
            Error::Unsupported { .. } => "unsupported",
            Error::Timeout { .. } => "timeout",
            Error::Unavailable { .. } => "unavailable",
            Error::PluginContract { .. } => "plugin_contract",
            Error::Backend { .. } => "backend",
        }
    }

    /// Whether trying the same operation again may succeed (transient faults only).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Unavailable { .. } => true,
            Error::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

/// The part of the system an error happened in. A plugin name converts into
/// [`Component::Backend`], so plugins write `Error::io(NAME, …)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Component {
    /// A storage plugin's backend, by plugin name (`POSIX`, `OBJ`, a vendor's).
    Backend(Cow<'static, str>),
    /// The connector ([`HiCache`](crate::HiCache)) and what it owns: staging, its runtime.
    Connector,
    /// A tool built on the library (the `hicache` command's bench or scrub), by name.
    Tool(&'static str),
}

impl Component {
    /// The bare name: the plugin's, `connector`, or the tool's.
    pub fn name(&self) -> &str {
        match self {
            Component::Backend(name) => name,
            Component::Connector => "connector",
            Component::Tool(name) => name,
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Component::Backend(name) => write!(f, "backend {name}"),
            Component::Connector => f.write_str("connector"),
            Component::Tool(name) => f.write_str(name),
        }
    }
}

impl From<&'static str> for Component {
    fn from(plugin: &'static str) -> Self {
        Component::Backend(Cow::Borrowed(plugin))
    }
}

impl From<String> for Component {
    fn from(plugin: String) -> Self {
        Component::Backend(Cow::Owned(plugin))
    }
}

fn hint_suffix(hint: &Option<String>) -> String {
    hint.as_ref()
        .map(|h| format!("; hint: {h}"))
        .unwrap_or_default()
}

fn suggestion_suffix(suggestion: &Option<String>) -> String {
    suggestion
        .as_ref()
        .map(|s| format!("; did you mean `{s}`?"))
        .unwrap_or_default()
}

/// hicache's own plugins and the Cargo feature of the `hicache` crate that compiles each.
const PLUGIN_FEATURES: &[(&str, &str)] = &[
    ("POSIX", "posix"),
    ("OBJ", "obj"),
    ("GDS", "gds"),
    ("GDS_MT", "gds"),
    ("3FS", "3fs"),
];

/// Why a plugin may be missing: one of hicache's own without its feature, or (no close
/// name either) a third party's that was never registered.
fn missing_suffix(feature: &Option<&'static str>, suggestion: &Option<String>) -> String {
    match (feature, suggestion) {
        (Some(f), _) => format!(
            "; it is not compiled into this build: enable the `{f}` feature of the `hicache` crate (or `hicache-cli`)"
        ),
        (None, None) => "; a plugin crate that is only a dependency is dropped by the linker: name its DESCRIPTOR where the registry is built (`hicache::registry_with`, `hicache_cli::Commands::plugin`), or put its shared library in a dir of `plugin_dirs`".into(),
        (None, Some(_)) => String::new(),
    }
}

fn format_tried(tried: &[(String, String)]) -> String {
    if tried.is_empty() {
        return "no plugin is registered in this build (enable a plugin feature of the `hicache` crate)".into();
    }
    tried
        .iter()
        .map(|(name, reason)| format!("{name}: {reason}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The closest candidate to `input` by edit distance, if it is close enough to be a likely typo.
pub(crate) fn closest_match<'a>(
    input: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let input = input.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(&input, &c.to_ascii_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len().max(input.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_match_finds_typos_only() {
        let keys = ["use_direct_io", "storage_dir", "plugin"];
        assert_eq!(
            closest_match("use_directio", keys).as_deref(),
            Some("use_direct_io")
        );
        assert_eq!(
            closest_match("storage_dirs", keys).as_deref(),
            Some("storage_dir")
        );
        assert_eq!(closest_match("completely_else", keys), None);
    }

    #[test]
    fn clones_keep_variant_source_and_retryability() {
        use std::error::Error as _;
        let e = Error::io(
            "POSIX",
            "pread",
            None,
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        );
        let copy = e.clone();
        assert!(copy.is_retryable() && matches!(copy, Error::Io { .. }));
        assert_eq!(copy.to_string(), e.to_string());
        assert!(copy.source().is_some());
        let gone = Error::Unavailable {
            component: "OBJ".into(),
            message: "connection reset".into(),
            source: None,
        };
        assert!(gone.clone().is_retryable());
        let plain = Error::backend_with_source("OBJ", "put", std::fmt::Error);
        assert!(!plain.is_retryable() && plain.clone().source().is_some());
    }

    #[test]
    fn an_unknown_plugin_names_its_feature_or_a_close_name() {
        let e = Error::unknown_plugin("obj", ["POSIX"]).to_string();
        assert!(e.contains("enable the `obj` feature"), "{e}");
        let e = Error::unknown_plugin("gds_mt", ["POSIX"]).to_string();
        assert!(e.contains("`gds` feature"), "{e}");
        let e = Error::unknown_plugin("POSX", ["POSIX", "OBJ"]).to_string();
        assert!(
            e.contains("did you mean `POSIX`") && !e.contains("feature"),
            "{e}"
        );
    }

    #[test]
    fn messages_carry_context() {
        let e = Error::SliceOutOfRange {
            component: "POSIX".into(),
            region: RegionId(3),
            offset: 4096,
            len: 8192,
            region_len: 10000,
        };
        let s = e.to_string();
        assert!(
            s.contains("region 3") && s.contains("offset 4096") && s.contains("10000"),
            "{s}"
        );
        let e = Error::NoUsablePlugin { tried: vec![] };
        assert!(e.to_string().contains("enable a plugin feature"));
    }

    #[test]
    fn the_component_is_typed_and_named_in_the_message() {
        let io = Error::io("POSIX", "open", None, std::io::Error::other("device gone"));
        assert_eq!(io.component(), Some(&Component::Backend("POSIX".into())));
        assert!(io.to_string().starts_with("backend POSIX: open"), "{io}");
        let staging = Error::backend(Component::Connector, "staging pool closed");
        assert_eq!(staging.component().map(Component::name), Some("connector"));
        assert_eq!(staging.to_string(), "connector: staging pool closed");
        let tool = Error::backend(Component::Tool("bench"), "no pages");
        assert_eq!(tool.to_string(), "bench: no pages");
        // Cloned per batch item, an error keeps its component and its retryability.
        let timeout = Error::Timeout {
            component: "OBJ".into(),
            op: "get",
            millis: 5,
        };
        let copy = timeout.clone();
        assert_eq!(copy.component(), timeout.component());
        assert!(copy.is_retryable());
        assert_eq!(Error::PoolNotRegistered.component(), None);
    }
}
