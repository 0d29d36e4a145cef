//! Plugin parameters: one declaration per plugin yields the parameter table that config
//! validation checks against (and lists in its errors), and the typed struct the plugin
//! reads. A plugin reads its parameters only through that struct, so a parameter
//! it reads but does not declare cannot compile.

use std::fmt;

use crate::config::{RawValue, Setting, Source, parse_bool};
use crate::error::{Error, Result};

/// Type of a plugin parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Strict boolean.
    Bool,
    /// Unsigned integer.
    UInt,
    /// Float.
    Float,
    /// Free text.
    Str,
    /// One of the listed strings (case-insensitive).
    OneOf(&'static [&'static str]),
}

/// One parameter a plugin accepts.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ParamSpec {
    /// Name as written in config files.
    pub name: &'static str,
    /// Type.
    pub kind: ParamKind,
    /// A credential: never logged or shown.
    pub secret: bool,
    /// Standard environment variables read when the config does not set it (e.g.
    /// `AWS_DEFAULT_BUCKET`); they rank below every config source.
    pub env_fallback: &'static [&'static str],
    /// One line of documentation.
    pub doc: &'static str,
    /// What the plugin uses when the config does not set it, as the config reference
    /// shows it (`None`: unset means absent, or the doc says what happens).
    pub default: Option<&'static str>,
}

impl ParamSpec {
    /// A plain (non-secret, no env fallback) parameter.
    pub const fn new(name: &'static str, kind: ParamKind, doc: &'static str) -> Self {
        ParamSpec {
            name,
            kind,
            secret: false,
            env_fallback: &[],
            doc,
            default: None,
        }
    }

    /// Records the default, as the config reference shows it.
    pub const fn default(mut self, shown: &'static str) -> Self {
        self.default = Some(shown);
        self
    }

    /// Marks the parameter as a credential.
    pub const fn secret(mut self) -> Self {
        self.secret = true;
        self
    }

    /// Adds environment fallbacks.
    pub const fn env(mut self, vars: &'static [&'static str]) -> Self {
        self.env_fallback = vars;
        self
    }
}

/// `first` then `then` as one list, at compile time: for a plugin whose parameters are
/// another's plus its own (the GDS plugins take the POSIX file layer's). `N` must be the sum
/// of the lengths (a compile error otherwise):
///
/// ```
/// use hicache_core::raw::{ParamKind, ParamSpec, join_params};
/// const SHARED: &[ParamSpec] = &[ParamSpec::new("sync", ParamKind::Bool, "flush writes")];
/// const OWN: &[ParamSpec] = &[ParamSpec::new("depth", ParamKind::UInt, "requests in flight")];
/// const ALL: [ParamSpec; SHARED.len() + OWN.len()] = join_params(SHARED, OWN);
/// assert_eq!(ALL.map(|p| p.name), ["sync", "depth"]);
/// ```
pub const fn join_params<const N: usize>(
    first: &[ParamSpec],
    then: &[ParamSpec],
) -> [ParamSpec; N] {
    assert!(
        first.len() + then.len() == N,
        "N must be the sum of both lengths"
    );
    let mut out = [ParamSpec::new("", ParamKind::Bool, ""); N];
    let mut i = 0;
    while i < N {
        out[i] = if i < first.len() {
            first[i]
        } else {
            then[i - first.len()]
        };
        i += 1;
    }
    out
}

/// The validated parameters of one plugin. `Debug` and `Display` redact secrets.
#[derive(Clone, Default)]
pub struct PluginParams {
    pub(crate) values: Vec<(&'static ParamSpec, Setting<RawValue>)>,
}

impl fmt::Debug for PluginParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for PluginParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (spec, s)) in self.values.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if spec.secret {
                write!(f, "{}=***", spec.name)?;
            } else {
                write!(f, "{}={}", spec.name, s.value)?;
            }
        }
        f.write_str("}")
    }
}

impl PluginParams {
    /// The value of `name` as `T`, with its provenance; `None` when unset. Called by the
    /// code [`plugin_params!`](crate::plugin_params) generates, which only names declared
    /// parameters: plugins read their typed struct, never names.
    #[doc(hidden)]
    pub fn __typed<T: ParamType>(&self, name: &str) -> Option<Setting<T>> {
        let (_, s) = self.values.iter().find(|(spec, _)| spec.name == name)?;
        Some(Setting {
            value: T::from_value(&s.value)?,
            source: s.source.clone(),
            overridden: s.overridden.clone(),
        })
    }

    /// Where a parameter came from.
    pub fn source(&self, name: &str) -> Option<&Source> {
        self.values
            .iter()
            .find(|(s, _)| s.name == name)
            .map(|(_, v)| &v.source)
    }

    /// Every parameter as (name, value) in its text form, secrets included: what a loader
    /// hands to a plugin behind the C ABI (which takes parameters as text). Never for
    /// display; [`entries`](Self::entries) hides secrets.
    pub fn to_plugin_text(&self) -> Vec<(&'static str, String)> {
        self.values
            .iter()
            .map(|(spec, s)| (spec.name, s.value.to_string()))
            .collect()
    }

    /// Every parameter as (name, rendered value or `***`, source).
    pub fn entries(&self) -> Vec<(String, String, Source)> {
        self.values
            .iter()
            .map(|(spec, s)| {
                let shown = if spec.secret {
                    "***".to_string()
                } else {
                    s.value.to_string()
                };
                (spec.name.to_string(), shown, s.source.clone())
            })
            .collect()
    }
}

/// `raw` checked against `spec` and normalised to the spec's kind: a boolean or number
/// written as a string becomes that boolean or number, a choice is lower-cased, an
/// unsigned integer is a non-negative `Int`.
pub(crate) fn typed(spec: &ParamSpec, raw: &RawValue, source: &Source) -> Result<RawValue> {
    let shown = if spec.secret {
        "***".to_string()
    } else {
        raw.to_string()
    };
    let bad = |want: &str| {
        Error::invalid_config(
            spec.name,
            source.to_string(),
            format!("`{shown}` is not {want}"),
        )
    };
    Ok(match (spec.kind, raw) {
        (ParamKind::Bool, RawValue::Bool(b)) => RawValue::Bool(*b),
        (ParamKind::Bool, RawValue::Str(s)) => {
            RawValue::Bool(parse_bool(s).ok_or_else(|| bad("a boolean (true/false)"))?)
        }
        (ParamKind::Bool, RawValue::Int(i @ (0 | 1))) => RawValue::Bool(*i == 1),
        (ParamKind::Bool, _) => return Err(bad("a boolean (true/false)")),
        (ParamKind::UInt, RawValue::Int(i)) if *i >= 0 => RawValue::Int(*i),
        (ParamKind::UInt, RawValue::Str(s)) => {
            let n: u64 = s
                .trim()
                .parse()
                .map_err(|_| bad("a non-negative integer"))?;
            // Config integers are i64 (TOML's); no parameter needs more.
            RawValue::Int(i64::try_from(n).map_err(|_| bad("an integer up to 2^63 - 1"))?)
        }
        (ParamKind::UInt, _) => return Err(bad("a non-negative integer")),
        (ParamKind::Float, RawValue::Float(x)) => RawValue::Float(*x),
        (ParamKind::Float, RawValue::Int(i)) => RawValue::Float(*i as f64),
        (ParamKind::Float, RawValue::Str(s)) => {
            RawValue::Float(s.trim().parse().map_err(|_| bad("a number"))?)
        }
        (ParamKind::Float, _) => return Err(bad("a number")),
        (ParamKind::Str, RawValue::Str(s)) => RawValue::Str(s.clone()),
        (ParamKind::Str, _) => return Err(bad("a string")),
        (ParamKind::OneOf(allowed), RawValue::Str(s)) => {
            let lower = s.to_ascii_lowercase();
            if !allowed.contains(&lower.as_str()) {
                return Err(bad(&format!("one of {}", allowed.join(", "))));
            }
            RawValue::Str(lower)
        }
        (ParamKind::OneOf(allowed), _) => {
            return Err(bad(&format!("one of {}", allowed.join(", "))));
        }
    })
}

/// The Rust type a [`ParamKind`] is read as (`bool`, `u64`, `f64`, `String`).
pub trait ParamType: Sized {
    /// The value as this type, `None` when the kinds differ.
    fn from_value(value: &RawValue) -> Option<Self>;
}

impl ParamType for bool {
    fn from_value(value: &RawValue) -> Option<Self> {
        match value {
            RawValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

impl ParamType for u64 {
    fn from_value(value: &RawValue) -> Option<Self> {
        match value {
            RawValue::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

impl ParamType for f64 {
    fn from_value(value: &RawValue) -> Option<Self> {
        match value {
            RawValue::Float(x) => Some(*x),
            RawValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}

impl ParamType for String {
    fn from_value(value: &RawValue) -> Option<Self> {
        match value {
            RawValue::Str(s) => Some(s.clone()),
            _ => None,
        }
    }
}

/// What [`plugin_params!`](crate::plugin_params) implements for the struct it declares.
pub trait DeclaredParams: Sized {
    /// Every parameter, in declaration order.
    const SPECS: &'static [ParamSpec];
    /// The declared parameters out of validated `params`.
    fn from_params(params: &PluginParams) -> Self;
    /// The names of the parameters that are set.
    fn given(&self) -> Vec<&'static str>;
}

/// Declares a plugin's parameters once: the table ([`ParamSpec`]s, as `SPECS`) and a struct
/// with one `Option<Setting<T>>` field per parameter, filled by `from_params`.
///
/// Each line is `field: Kind = "name" => "doc"` with optional flags after a comma:
/// `secret` (a credential: never shown), `env(&["VAR", ...])` (environment fallbacks) and
/// `default("shown")` (the default, as the config reference shows it).
/// `Kind` is `Bool` (`bool`), `UInt` (`u64`), `Float` (`f64`), `Str` (`String`) or
/// `OneOf["a", "b"]` (`String`, lower-cased).
///
/// ```
/// hicache_core::plugin_params! {
///     /// Parameters of the ACME plugin.
///     pub struct AcmeParams {
///         depth: UInt = "depth" => "requests in flight", default("8");
///         mode: OneOf["fast", "safe"] = "mode" => "write mode";
///         token: Str = "token" => "API token", secret, env(&["ACME_TOKEN"]);
///     }
/// }
/// assert_eq!(AcmeParams::SPECS.len(), 3);
/// assert!(AcmeParams::SPECS[2].secret);
/// let unset = AcmeParams::from_params(&Default::default());
/// assert!(unset.depth.is_none());
/// ```
#[macro_export]
macro_rules! plugin_params {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $field:ident : $kind:ident $([$($choice:literal),+ $(,)?])? = $key:literal
                    => $doc:literal $(, $flag:ident $(($($arg:expr),*))?)* ;
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Default)]
        $vis struct $name {
            $(
                #[doc = $doc]
                $vis $field: ::std::option::Option<
                    $crate::Setting<$crate::plugin_params!(@type $kind)>,
                >,
            )+
        }

        impl $name {
            /// Every parameter, as config validation checks them.
            $vis const SPECS: &'static [$crate::raw::ParamSpec] = &[
                $(
                    $crate::raw::ParamSpec::new(
                        $key,
                        $crate::plugin_params!(@kind $kind $([$($choice),+])?),
                        $doc,
                    ) $(.$flag($($($arg),*)?))*,
                )+
            ];

            /// The declared parameters out of validated `params`. Parameters the config
            /// does not set are `None`.
            $vis fn from_params(params: &$crate::raw::PluginParams) -> Self {
                $name {
                    $($field: params.__typed($key),)+
                }
            }
        }

        impl $crate::raw::DeclaredParams for $name {
            const SPECS: &'static [$crate::raw::ParamSpec] = $name::SPECS;

            fn from_params(params: &$crate::raw::PluginParams) -> Self {
                $name::from_params(params)
            }

            fn given(&self) -> ::std::vec::Vec<&'static str> {
                let mut given = ::std::vec::Vec::new();
                $(
                    if self.$field.is_some() {
                        given.push($key);
                    }
                )+
                given
            }
        }

        /// Secret parameters show as `***`.
        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                let mut out = f.debug_struct(stringify!($name));
                let mut specs = Self::SPECS.iter();
                $(
                    let secret = specs.next().is_some_and(|spec| spec.secret);
                    match &self.$field {
                        Some(_) if secret => out.field(stringify!($field), &"***"),
                        given => out.field(stringify!($field), given),
                    };
                )+
                out.finish()
            }
        }
    };
    (@type Bool) => { bool };
    (@type UInt) => { u64 };
    (@type Float) => { f64 };
    (@type Str) => { ::std::string::String };
    (@type OneOf) => { ::std::string::String };
    (@kind OneOf [$($choice:literal),+]) => { $crate::raw::ParamKind::OneOf(&[$($choice),+]) };
    (@kind $kind:ident) => { $crate::raw::ParamKind::$kind };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendKind;
    use crate::config::ConfigLoader;
    use crate::probe::Probe;
    use crate::registry::{PluginDescriptor, params_for};

    crate::plugin_params! {
        /// Every kind once.
        struct Demo {
            flag: Bool = "flag" => "a flag";
            depth: UInt = "depth" => "a count";
            rate: Float = "rate" => "a rate";
            name: Str = "name" => "a name", env(&["DEMO_NAME"]);
            mode: OneOf["fast", "safe"] = "mode" => "a mode";
            token: Str = "token" => "a token", secret;
        }
    }

    fn unusable(_: &crate::registry::PluginContext<'_>) -> Probe {
        Probe::unusable("test", "none")
    }
    fn no_build(_: &crate::registry::PluginContext<'_>) -> Result<crate::backend::DynBackend> {
        Err(Error::backend("DEMO", "test"))
    }
    static DEMO: PluginDescriptor =
        PluginDescriptor::new("DEMO", BackendKind::File, "test", unusable, no_build)
            .with_params(Demo::SPECS);

    #[test]
    fn the_declaration_yields_table_and_typed_struct() {
        assert_eq!(
            Demo::SPECS.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["flag", "depth", "rate", "name", "mode", "token"]
        );
        assert_eq!(Demo::SPECS[4].kind, ParamKind::OneOf(&["fast", "safe"]));
        assert!(Demo::SPECS[5].secret && !Demo::SPECS[3].secret);
        assert_eq!(Demo::SPECS[3].env_fallback, ["DEMO_NAME"]);
        assert_eq!(Demo::SPECS[1].doc, "a count");

        let config = ConfigLoader::new()
            .extra_config(
                r#"{"plugin":{"demo":{"active":true,"flag":true,"depth":7,"rate":1.5,"mode":"SAFE","token":"t"}}}"#,
            )
            .env(crate::config::EnvSnapshot::from_pairs([("DEMO_NAME", "n")]))
            .load()
            .unwrap();
        let params = params_for(&DEMO, &config).unwrap();
        let demo = Demo::from_params(&params);
        assert!(demo.flag.unwrap().value);
        assert_eq!(demo.depth.unwrap().value, 7);
        assert_eq!(demo.rate.unwrap().value, 1.5);
        assert_eq!(demo.mode.unwrap().value, "safe");
        assert_eq!(demo.token.unwrap().value, "t");
        let name = demo.name.unwrap();
        assert_eq!(
            (name.value.as_str(), name.source),
            ("n", Source::Env("DEMO_NAME".into()))
        );
        assert!(Demo::from_params(&PluginParams::default()).flag.is_none());
        let shown = format!("{:?}", Demo::from_params(&params));
        assert!(
            shown.contains("token: \"***\"") && shown.contains("\"safe\""),
            "{shown}"
        );
    }

    #[test]
    fn undeclared_and_mistyped_parameters_are_errors() {
        let load = |json: &str| {
            let config = ConfigLoader::new().extra_config(json).load().unwrap();
            params_for(&DEMO, &config).unwrap_err().to_string()
        };
        let e = load(r#"{"plugin":{"demo":{"active":true,"dpeth":7}}}"#);
        assert!(e.contains("dpeth") && e.contains("depth"), "{e}");
        let e = load(r#"{"plugin":{"demo":{"active":true,"mode":"slow"}}}"#);
        assert!(e.contains("one of fast, safe"), "{e}");
        let e = load(r#"{"plugin":{"demo":{"active":true,"token":7}}}"#);
        assert!(e.contains("***") && !e.contains('7'), "{e}");
        let e = load(r#"{"plugin":{"demo":{"active":true,"depth":-1}}}"#);
        assert!(e.contains("non-negative"), "{e}");
        let e = load(r#"{"plugin":{"demo":{"active":true,"depth":"18446744073709551615"}}}"#);
        assert!(e.contains("2^63 - 1"), "{e}");
    }

    /// One value type: a parameter typed by its spec is a `RawValue` in the spec's kind,
    /// whatever form the file wrote it in.
    #[test]
    fn typed_values_are_normalised_raw_values() {
        let config = ConfigLoader::new()
            .extra_config(
                r#"{"plugin":{"demo":{"active":true,"flag":"yes","depth":"12","rate":2,"mode":"FAST"}}}"#,
            )
            .load()
            .unwrap();
        let params = params_for(&DEMO, &config).unwrap();
        let value = |name: &str| {
            params
                .values
                .iter()
                .find(|(s, _)| s.name == name)
                .map(|(_, v)| v.value.clone())
        };
        assert_eq!(value("flag"), Some(RawValue::Bool(true)));
        assert_eq!(value("depth"), Some(RawValue::Int(12)));
        assert_eq!(value("rate"), Some(RawValue::Float(2.0)));
        assert_eq!(value("mode"), Some(RawValue::Str("fast".into())));
        let demo = Demo::from_params(&params);
        assert_eq!(demo.depth.unwrap().value, 12u64);
        assert_eq!(demo.rate.unwrap().value, 2.0);
    }
}
