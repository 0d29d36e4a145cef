//! A plugin's declared parameters, checked from a config file: each one is accepted and
//! reaches the typed struct the plugin reads. With [`plugin_params!`](hicache_core::plugin_params)
//! a plugin reads nothing it has not declared; this check closes the other direction.

use hicache_core::raw::PluginDescriptor;
use hicache_core::raw::{DeclaredParams, ParamKind};
use hicache_core::raw::{PluginParams, params_for};
use hicache_core::{ConfigLoader, EnvSnapshot};

/// Sets every parameter in `plugin`'s table in a config file (a value of its kind) and
/// fails unless each one is accepted and read back by `P`, the typed parameters the plugin
/// reads (declared with [`plugin_params!`](hicache_core::plugin_params)), with secrets
/// redacted in `P`'s `Debug`.
///
/// # Panics
/// When a parameter is refused or not read back, or a secret one is shown.
pub fn check_declared_params<P: DeclaredParams + std::fmt::Debug + 'static>(
    plugin: &PluginDescriptor,
) {
    check_params_read_by(plugin, &[&read_by::<P>]);
}

/// What one typed parameter struct read from `params`: the names given, and its `Debug`.
pub type Reader = dyn Fn(&PluginParams) -> (Vec<&'static str>, String);

/// `P` as a [`Reader`].
pub fn read_by<P: DeclaredParams + std::fmt::Debug>(
    params: &PluginParams,
) -> (Vec<&'static str>, String) {
    let read = P::from_params(params);
    (read.given(), format!("{read:?}"))
}

/// [`check_declared_params`] for a plugin whose parameters are read by several typed
/// structs (its own and a shared layer's, joined with
/// [`join_params`](hicache_core::raw::join_params)): together they must read every one.
///
/// # Panics
/// As [`check_declared_params`].
pub fn check_params_read_by(plugin: &PluginDescriptor, readers: &[&Reader]) {
    let mut toml = format!(
        "[plugin.{}]\nactive = true\n",
        plugin.name.to_ascii_lowercase()
    );
    for spec in plugin.params {
        let value = match spec.kind {
            ParamKind::Bool => "true".to_string(),
            ParamKind::UInt => "4096".to_string(),
            ParamKind::Float => "1.5".to_string(),
            ParamKind::Str => "\"v\"".to_string(),
            ParamKind::OneOf(choices) => format!("\"{}\"", choices[0]),
        };
        toml += &format!("\"{}\" = {value}\n", spec.name);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("hicache.toml");
    std::fs::write(&path, &toml).expect("write the config file");
    let config = ConfigLoader::new()
        .file(&path)
        .env(EnvSnapshot::default())
        .load()
        .unwrap_or_else(|e| panic!("{}: {e}\n{toml}", plugin.name));
    let params = params_for(plugin, &config)
        .unwrap_or_else(|e| panic!("{} refuses its own parameters: {e}\n{toml}", plugin.name));
    assert_eq!(params.entries().len(), plugin.params.len(), "{toml}");
    let (given, shown): (Vec<Vec<&str>>, Vec<String>) =
        readers.iter().map(|read| read(&params)).unzip();
    let unread: Vec<&str> = plugin
        .params
        .iter()
        .map(|s| s.name)
        .filter(|name| !given.iter().any(|g| g.contains(name)))
        .collect();
    assert!(
        unread.is_empty(),
        "{}: declared but not read back: {unread:?}",
        plugin.name
    );
    let shown = shown.join(" ");
    let secrets = plugin.params.iter().filter(|s| s.secret).count();
    assert_eq!(
        shown.matches("\"***\"").count(),
        secrets,
        "{}: secrets must show as \"***\": {shown}",
        plugin.name
    );
}

#[cfg(test)]
mod tests {
    use hicache_core::Result;
    use hicache_core::raw::ParamSpec;
    use hicache_core::raw::{BackendKind, DynBackend, PluginContext, Probe};

    use super::*;

    hicache_core::plugin_params! {
        struct Read {
            depth: UInt = "depth" => "read by the plugin";
            token: Str = "token" => "a credential", secret;
        }
    }

    fn probe(_: &PluginContext<'_>) -> Probe {
        Probe::unusable("test", "none")
    }
    fn build(_: &PluginContext<'_>) -> Result<DynBackend> {
        Err(hicache_core::Error::backend("TEST", "test"))
    }

    /// The table has a parameter the typed struct does not read: the check must fail.
    const WIDER: &[ParamSpec] = &[
        Read::SPECS[0],
        Read::SPECS[1],
        ParamSpec::new("client", ParamKind::Str, "declared, never read"),
    ];

    fn descriptor(params: &'static [ParamSpec]) -> PluginDescriptor {
        PluginDescriptor::new("TEST", BackendKind::File, "test", probe, build).with_params(params)
    }

    #[test]
    fn a_plugin_that_reads_its_table_passes() {
        check_declared_params::<Read>(&descriptor(Read::SPECS));
    }

    #[test]
    #[should_panic(expected = "declared but not read back: [\"client\"]")]
    fn a_parameter_declared_and_never_read_fails() {
        check_declared_params::<Read>(&descriptor(WIDER));
    }
}
