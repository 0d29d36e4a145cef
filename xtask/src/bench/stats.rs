//! Medians, ratios and the per-round figures of a `hicache bench` JSON report.

use serde_json::{Value, json};

/// The median of `v` (NaN when empty).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// `a / b` as JSON, or null when `b` is no figure.
pub(super) fn ratio(a: f64, b: f64) -> Value {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        json!(a / b)
    } else {
        Value::Null
    }
}

/// `x` as JSON, or null when it is no figure.
pub(super) fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// Per-round GB/s of a `hicache bench` JSON report.
pub(super) fn rounds(report: &Value, field: &str) -> Vec<f64> {
    report[field]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["gbps"].as_f64())
        .collect()
}

/// A figure for a table cell: two decimals, or a dash.
pub(super) fn cell(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{x:.2}"))
        .unwrap_or_else(|| "–".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
        assert_eq!(ratio(3.0, 2.0), json!(1.5));
        assert_eq!(ratio(3.0, 0.0), Value::Null);
        assert_eq!(ratio(f64::NAN, 2.0), Value::Null);
        assert_eq!(cell(&json!(1.234)), "1.23");
        assert_eq!(cell(&Value::Null), "–");
    }
}
