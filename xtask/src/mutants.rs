//! `cargo xtask mutants`: cargo-mutants on the core modules every plugin relies on (keys and
//! namespaces, routing, the envelope, pool geometry and copies, the connector). Each mutant
//! is judged by hicache-core's own tests and by the conformance suite running against the
//! reference in-memory backend (hicache-testkit), so a mutant only the suite notices counts
//! as caught. cargo-mutants is installed once into `target/tools`; its report lands in
//! `target/mutants/mutants.out`, and a summary (counts and every surviving mutant) in
//! `target/mutants.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::{cargo, root, step};

/// The modules mutated by default.
pub(crate) const FILES: [&str; 5] = [
    "hicache-core/src/key.rs",
    "hicache-core/src/routing.rs",
    "hicache-core/src/envelope.rs",
    "hicache-core/src/pool.rs",
    "hicache-core/src/connector.rs",
];

/// The cargo-mutants release this command is written against.
const VERSION: &str = "27.0.0";

/// Outcome files cargo-mutants writes, one mutant per line.
const OUTCOMES: [&str; 4] = ["caught", "missed", "timeout", "unviable"];

pub(crate) fn mutants(args: &[String]) -> Result<(), String> {
    let mut files: Vec<String> = Vec::new();
    let mut extra: Vec<String> = Vec::new();
    let mut list = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--file" => {
                let f = it.next().ok_or("--file needs a path")?;
                if !root().join(f).is_file() {
                    return Err(format!(
                        "--file {f}: no such file in the workspace (default files: {FILES:?})"
                    ));
                }
                files.push(f.clone());
            }
            "--re" | "--shard" | "--timeout" => {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                extra.extend([a.clone(), v.clone()]);
            }
            "--list" => list = true,
            other => return Err(format!("unknown mutants option `{other}`")),
        }
    }
    if files.is_empty() {
        files = FILES.iter().map(|s| s.to_string()).collect();
    }
    let tool = install()?;
    let out_dir = root().join("target").join("mutants");
    let mut run = Command::new(&tool);
    run.current_dir(root())
        .arg("mutants")
        .args(["--package", "hicache-core"])
        .args(files.iter().flat_map(|f| ["--file", f.as_str()]))
        // Core's own tests and the conformance suite on the reference backend judge each
        // mutant; doctests and examples are left out (they re-link per mutant and test
        // nothing the two do not).
        .args([
            "--test-package",
            "hicache-core",
            "--test-package",
            "hicache-testkit",
        ])
        .args(["--cargo-test-arg=--lib", "--cargo-test-arg=--tests"])
        .arg("--output")
        .arg(&out_dir)
        .args(&extra)
        // Line tables are enough for a failing test's backtrace; full debug info only
        // slows each mutant's link.
        .env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
        .env("CARGO_TERM_COLOR", "never");
    if list {
        run.arg("--list");
        return step("cargo mutants --list", run);
    }
    // cargo-mutants exits non-zero when a mutant survives; the summary says which.
    println!("==> cargo mutants ({} files)", files.len());
    let status = run
        .status()
        .map_err(|e| format!("cannot start {}: {e}", tool.display()))?;
    let report = out_dir.join("mutants.out");
    let summary = summarize(&report)?;
    let json_path = root().join("target").join("mutants.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&summary).expect("json"),
    )
    .map_err(|e| format!("{}: {e}", json_path.display()))?;
    println!("summary written to {}", json_path.display());
    // Exit codes of cargo-mutants: 0 all caught, 2 some missed, 3 some timed out; anything
    // else (1, 4: usage, baseline failed) means the run itself did not work.
    match status.code() {
        Some(0 | 2 | 3) => Ok(()),
        _ => Err(format!(
            "cargo mutants failed ({status}); see {}/debug.log",
            report.display()
        )),
    }
}

/// Installs the pinned cargo-mutants into `target/tools` unless it is there.
fn install() -> Result<PathBuf, String> {
    let prefix = root().join("target").join("tools");
    let bin = prefix.join("bin").join("cargo-mutants");
    if bin.is_file() {
        return Ok(bin);
    }
    let mut install = cargo();
    install
        .args(["install", "cargo-mutants", "--locked", "--version", VERSION])
        .arg("--root")
        .arg(&prefix);
    step(&format!("cargo install cargo-mutants {VERSION}"), install)?;
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} is missing after installation", bin.display()))
    }
}

/// Counts per outcome and per file, and the surviving mutants, from cargo-mutants' lists.
fn summarize(report: &Path) -> Result<Value, String> {
    let mut counts = serde_json::Map::new();
    let mut per_file: serde_json::Map<String, Value> = serde_json::Map::new();
    let mut survivors = Vec::new();
    for outcome in OUTCOMES {
        let path = report.join(format!("{outcome}.txt"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        counts.insert(outcome.into(), json!(lines.len()));
        for line in &lines {
            // `path:line:col: description`
            let file = line.split(':').next().unwrap_or("?").to_string();
            let entry = per_file.entry(file).or_insert_with(|| json!({}));
            let n = entry.get(outcome).and_then(Value::as_u64).unwrap_or(0);
            entry[outcome] = json!(n + 1);
            if outcome == "missed" || outcome == "timeout" {
                survivors.push(json!({ "outcome": outcome, "mutant": line }));
            }
        }
    }
    if counts.values().all(|v| v == &json!(0)) {
        return Err(format!(
            "no outcomes in {}: cargo mutants did not run",
            report.display()
        ));
    }
    println!("mutants: {}", Value::Object(counts.clone()));
    for (file, c) in &per_file {
        println!("  {file}: {c}");
    }
    for s in &survivors {
        println!("  survived ({}): {}", s["outcome"], s["mutant"]);
    }
    Ok(json!({
        "tool": format!("cargo-mutants {VERSION}"),
        "counts": counts,
        "per_file": per_file,
        "survivors": survivors,
    }))
}
