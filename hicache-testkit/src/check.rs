//! What a case returns, and the assertions cases use.

use std::fmt;

/// Why a case did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseError {
    /// The plugin broke the contract.
    Failed(String),
    /// The case does not apply to this plugin (printed as `ignored, <reason>`).
    Skipped(String),
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseError::Failed(m) => write!(f, "{m}"),
            CaseError::Skipped(m) => write!(f, "skipped: {m}"),
        }
    }
}

impl From<hicache_core::Error> for CaseError {
    fn from(e: hicache_core::Error) -> Self {
        CaseError::Failed(format!("unexpected error: {e}"))
    }
}

/// The result of one case.
pub type CaseResult = Result<(), CaseError>;

/// Skips the case with a reason.
pub fn skip(reason: impl Into<String>) -> CaseResult {
    Err(CaseError::Skipped(reason.into()))
}

/// Fails the case unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::CaseError::Failed(format!(
                "{} (at {}:{}): {}", stringify!($cond), file!(), line!(), format!($($fmt)+)
            )));
        }
    };
    ($cond:expr $(,)?) => {
        if !$cond {
            return Err($crate::CaseError::Failed(format!(
                "{} (at {}:{})", stringify!($cond), file!(), line!()
            )));
        }
    };
}

/// Fails the case unless both sides are equal.
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr $(,)?) => {
        $crate::ensure_eq!($left, $right, "values differ")
    };
    ($left:expr, $right:expr, $($fmt:tt)+) => {
        match (&$left, &$right) {
            (l, r) => {
                if l != r {
                    return Err($crate::CaseError::Failed(format!(
                        "{} != {} (at {}:{}): {}\n  left: {:?}\n right: {:?}",
                        stringify!($left), stringify!($right), file!(), line!(), format!($($fmt)+),
                        $crate::check::Abbrev(l), $crate::check::Abbrev(r)
                    )));
                }
            }
        }
    };
}

/// Debug output cut to a readable length (page-sized byte vectors).
pub struct Abbrev<'a, T: fmt::Debug>(pub &'a T);

impl<T: fmt::Debug> fmt::Debug for Abbrev<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = format!("{:?}", self.0);
        if s.len() > 300 {
            write!(
                f,
                "{}… ({} chars)",
                &s[..s.char_indices().nth(300).map_or(s.len(), |(i, _)| i)],
                s.len()
            )
        } else {
            f.write_str(&s)
        }
    }
}

/// The results of a plugin call on `items` items; the case fails unless there is exactly one
/// result per item (a case indexes them, and must fail rather than panic on a broken plugin).
pub fn per_item<T>(op: &str, items: usize, results: Vec<T>) -> Result<Vec<T>, CaseError> {
    if results.len() == items {
        Ok(results)
    } else {
        Err(CaseError::Failed(format!(
            "{op} of {items} items returned {} results",
            results.len()
        )))
    }
}

/// The one result of a plugin call on one item (see [`per_item`]).
pub fn only<T>(op: &str, results: Vec<T>) -> Result<T, CaseError> {
    let mut results = per_item(op, 1, results)?;
    Ok(results.remove(0))
}
