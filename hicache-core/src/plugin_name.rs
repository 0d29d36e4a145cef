//! A plugin's name, given once: the errors and the region table that carry it are made from
//! it, so a plugin does not repeat its name at every error.

use std::path::Path;

use crate::error::{Component, Error};
use crate::memory::RegionTable;

/// A plugin's name as its errors report it. A plugin declares it once
/// (`const NAME: PluginName = PluginName::new("ACME");`) and makes its errors, its
/// [`RegionTable`] and its descriptor's name from it.
///
/// ```
/// use hicache_core::raw::PluginName;
///
/// const NAME: PluginName = PluginName::new("ACME");
/// let dir = std::path::Path::new("/nonexistent/acme");
/// let err = std::fs::create_dir(dir).map_err(NAME.io_at("mkdir", dir)).unwrap_err();
/// assert_eq!(err.component().map(|c| c.name()), Some("ACME"));
/// assert!(err.to_string().contains("/nonexistent/acme"), "{err}");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginName(&'static str);

impl PluginName {
    /// The name (what `PluginDescriptor::new` takes, and configs select).
    pub const fn new(name: &'static str) -> Self {
        PluginName(name)
    }

    /// The name as text.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// An I/O error of operation `op` on `path`.
    pub fn io(self, op: &'static str, path: impl AsRef<Path>, source: std::io::Error) -> Error {
        Error::io(self, op, Some(path.as_ref().to_path_buf()), source)
    }

    /// [`io`](Self::io) for `map_err`: `fs::read(&p).map_err(NAME.io_at("read", &p))`.
    pub fn io_at(
        self,
        op: &'static str,
        path: impl AsRef<Path>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        move |source| self.io(op, path, source)
    }

    /// A backend error carrying `message`.
    pub fn error(self, message: impl Into<String>) -> Error {
        Error::backend(self, message)
    }

    /// The plugin cannot do `operation` ([`Error::Unsupported`]).
    pub fn unsupported(self, operation: impl Into<String>) -> Error {
        Error::Unsupported {
            component: self.into(),
            operation: operation.into(),
        }
    }

    /// An empty region table whose errors name this plugin.
    pub fn region_table(self) -> RegionTable {
        RegionTable::new(self.0)
    }
}

impl From<PluginName> for Component {
    fn from(name: PluginName) -> Self {
        Component::from(name.0)
    }
}

impl std::fmt::Display for PluginName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_made_from_the_name_carries_it() {
        const NAME: PluginName = PluginName::new("ACME");
        let io = NAME.io("open", "/x", std::io::ErrorKind::NotFound.into());
        let errors = [
            io,
            NAME.io_at("read", "/y")(std::io::ErrorKind::Other.into()),
            NAME.error("broken"),
            NAME.unsupported("listing objects"),
        ];
        for err in errors {
            assert_eq!(err.component().map(|c| c.name()), Some("ACME"), "{err:?}");
            assert!(err.to_string().contains("ACME"), "{err}");
        }
        assert!(matches!(NAME.unsupported("x"), Error::Unsupported { .. }));
        let table = NAME.region_table();
        let err = table.deregister(crate::raw::RegionId(7)).unwrap_err();
        assert!(err.to_string().contains("ACME"), "{err}");
    }
}
