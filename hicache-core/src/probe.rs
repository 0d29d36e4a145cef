//! What a plugin's probe finds: a verdict, facts for people and JSON, and findings its own
//! build reuses, so selection, `hicache plugins`, `doctor` and `build` share one probe.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

/// What a probe found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    /// The plugin works here.
    Usable {
        /// What was checked (filesystem, alignment, engine…).
        detail: String,
    },
    /// The plugin cannot work here.
    Unusable {
        /// What failed.
        reason: String,
        /// How to fix it.
        hint: Option<String>,
    },
}

impl Verdict {
    /// A usable verdict.
    pub fn usable(detail: impl Into<String>) -> Self {
        Verdict::Usable {
            detail: detail.into(),
        }
    }

    /// An unusable verdict with a hint.
    pub fn unusable(reason: impl Into<String>, hint: impl Into<String>) -> Self {
        Verdict::Unusable {
            reason: reason.into(),
            hint: Some(hint.into()),
        }
    }

    /// Whether usable.
    pub fn is_usable(&self) -> bool {
        matches!(self, Verdict::Usable { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Usable { detail } => write!(f, "usable ({detail})"),
            Verdict::Unusable { reason, hint } => {
                write!(f, "unusable: {reason}")?;
                if let Some(h) = hint {
                    write!(f, "; hint: {h}")?;
                }
                Ok(())
            }
        }
    }
}

/// One thing a probe established: `subject` is what it is about (a dir, an endpoint, the
/// plugin itself), `name` what was measured, `value` the finding.
///
/// In JSON a fact is flat: `{"subject": "/data", "name": "free", "kind": "bytes", "value":
/// 1073741824}`, so a program reads numbers and flags as such.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Fact {
    /// What the fact is about, e.g. `/data/kv`.
    pub subject: String,
    /// What was established, e.g. `filesystem`.
    pub name: String,
    /// The finding, e.g. `ext4`.
    #[serde(flatten)]
    pub value: FactValue,
}

/// A probe's finding, typed: a person reads sizes with units and flags as yes/no; JSON
/// carries the number or the boolean with its `kind`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "lowercase")]
#[non_exhaustive]
pub enum FactValue {
    /// Words: a filesystem type, an engine, an error.
    Text(String),
    /// Yes or no.
    Flag(bool),
    /// A number of things: slots, queue entries.
    Count(u64),
    /// A number of bytes: free space, an alignment.
    Bytes(u64),
}

impl fmt::Display for FactValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FactValue::Text(s) => f.write_str(s),
            FactValue::Flag(b) => f.write_str(if *b { "yes" } else { "no" }),
            FactValue::Count(n) => write!(f, "{n}"),
            FactValue::Bytes(n) => write!(f, "{}", crate::ByteSize(*n)),
        }
    }
}

impl From<&str> for FactValue {
    fn from(s: &str) -> Self {
        FactValue::Text(s.to_string())
    }
}

impl From<String> for FactValue {
    fn from(s: String) -> Self {
        FactValue::Text(s)
    }
}

impl From<bool> for FactValue {
    fn from(b: bool) -> Self {
        FactValue::Flag(b)
    }
}

impl From<u64> for FactValue {
    fn from(n: u64) -> Self {
        FactValue::Count(n)
    }
}

impl From<crate::ByteSize> for FactValue {
    fn from(b: crate::ByteSize) -> Self {
        FactValue::Bytes(b.0)
    }
}

/// Typed data a probe hands to its plugin's `build` (and to tools that know the plugin).
/// Opaque to everyone else.
#[derive(Clone, Default)]
pub struct Findings(Option<Arc<dyn Any + Send + Sync>>);

impl Findings {
    /// The findings as `T`, when they are a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.as_deref()?.downcast_ref()
    }
}

impl fmt::Debug for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Findings(..)"
        } else {
            "Findings(none)"
        })
    }
}

/// What a plugin's probe returns: the verdict, the facts behind it, and findings for the
/// plugin's `build`. A plain [`Verdict`] converts into a `Probe` without facts.
///
/// ```
/// use hicache_core::raw::Probe;
/// use hicache_core::{ByteSize, FactValue};
/// #[derive(Debug, PartialEq)]
/// struct Device { slots: u32 }
///
/// let probe = Probe::usable("device ready")
///     .fact("/dev/acme0", "slots", 8u64)
///     .fact("/dev/acme0", "buffer", ByteSize(2 << 20))
///     .with_findings(Device { slots: 8 });
/// assert!(probe.verdict().is_usable());
/// assert_eq!(probe.facts()[0].value, FactValue::Count(8));
/// assert_eq!(probe.facts()[1].value.to_string(), "2 MiB");
/// assert_eq!(probe.findings().get::<Device>(), Some(&Device { slots: 8 }));
/// ```
#[derive(Clone, Debug)]
pub struct Probe {
    verdict: Verdict,
    facts: Vec<Fact>,
    findings: Findings,
}

impl Probe {
    /// The plugin works here; `summary` says why in one line.
    pub fn usable(summary: impl Into<String>) -> Self {
        Verdict::usable(summary).into()
    }

    /// The plugin cannot work here.
    pub fn unusable(reason: impl Into<String>, hint: impl Into<String>) -> Self {
        Verdict::unusable(reason, hint).into()
    }

    /// Adds a fact.
    pub fn fact(
        mut self,
        subject: impl Into<String>,
        name: impl Into<String>,
        value: impl Into<FactValue>,
    ) -> Self {
        self.facts.push(Fact {
            subject: subject.into(),
            name: name.into(),
            value: value.into(),
        });
        self
    }

    /// Attaches findings for the plugin's `build` (read back with
    /// [`PluginContext::findings`](crate::raw::PluginContext::findings)).
    pub fn with_findings<T: Any + Send + Sync>(mut self, findings: T) -> Self {
        self.findings = Findings(Some(Arc::new(findings)));
        self
    }

    /// The verdict.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The facts, in the order found.
    pub fn facts(&self) -> &[Fact] {
        &self.facts
    }

    /// The findings.
    pub fn findings(&self) -> &Findings {
        &self.findings
    }

    pub(crate) fn from_parts(verdict: Verdict, facts: Vec<Fact>, findings: Findings) -> Self {
        Probe {
            verdict,
            facts,
            findings,
        }
    }

    pub(crate) fn into_parts(self) -> (Verdict, Vec<Fact>, Findings) {
        (self.verdict, self.facts, self.findings)
    }
}

impl From<Verdict> for Probe {
    fn from(verdict: Verdict) -> Self {
        Probe {
            verdict,
            facts: Vec::new(),
            findings: Findings::default(),
        }
    }
}
