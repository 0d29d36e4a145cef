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

/// The modules mutated by default: keys and their hash, routing, the envelope, pool geometry,
/// sidecar geometry and copies, the connector (every file of it) and its blocking face.
pub(crate) const FILES: [&str; 15] = [
    "hicache-core/src/key.rs",
    "hicache-core/src/hash.rs",
    "hicache-core/src/routing.rs",
    "hicache-core/src/envelope.rs",
    "hicache-core/src/pool/geometry.rs",
    "hicache-core/src/pool/sidecar.rs",
    "hicache-core/src/pool/copy.rs",
    "hicache-core/src/connector/mod.rs",
    "hicache-core/src/connector/options.rs",
    "hicache-core/src/connector/mode.rs",
    "hicache-core/src/connector/io.rs",
    "hicache-core/src/connector/plan.rs",
    "hicache-core/src/connector/shape.rs",
    "hicache-core/src/connector/v2.rs",
    "hicache-core/src/blocking.rs",
];

/// The cargo-mutants release this command is written against.
const VERSION: &str = "27.0.0";

/// Seconds the second pass's tests may take per mutant: three times what they take unmutated
/// here (17-29 s); a mutant that makes them hang (an endless wait) is a timeout.
const TEST_TIMEOUT_SECS: u64 = 90;

/// Seconds one mutant's build may take (the first builds the testkit from cold).
const BUILD_TIMEOUT_SECS: u64 = 900;

/// Outcome files cargo-mutants writes, one mutant per line.
const OUTCOMES: &[&str] = &["caught", "missed", "timeout", "unviable"];

/// Mutants an earlier run caught, which `--iterate` skipped.
const PREVIOUSLY: &[&str] = &["previously_caught"];

pub(crate) fn mutants(args: &[String]) -> Result<(), String> {
    let mut files: Vec<String> = Vec::new();
    let mut extra: Vec<String> = Vec::new();
    let mut list = false;
    let mut iterate = false;
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
            "--re" | "--shard" => {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                extra.extend([a.clone(), v.clone()]);
            }
            "--list" => list = true,
            "--iterate" => iterate = true,
            other => return Err(format!("unknown mutants option `{other}`")),
        }
    }
    if files.is_empty() {
        files = FILES.iter().map(|s| s.to_string()).collect();
    }
    let tool = install()?;
    let out_dir = root().join("target").join("mutants");
    let report = out_dir.join("mutants.out");
    let command = |test_packages: &[&str]| {
        let mut run = Command::new(&tool);
        run.current_dir(root())
            .arg("mutants")
            .args(["--package", "hicache-core"])
            .args(files.iter().flat_map(|f| ["--file", f.as_str()]))
            .args(test_packages.iter().flat_map(|p| ["--test-package", p]))
            // Doctests and examples are left out: they re-link per mutant and test
            // nothing the unit, integration and suite tests do not.
            .args(["--cargo-test-arg=--lib", "--cargo-test-arg=--tests"])
            .arg("--output")
            .arg(&out_dir)
            .args(&extra)
            // Line tables are enough for a failing test's backtrace; full debug info only
            // slows each mutant's link.
            .env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
            .env("CARGO_TERM_COLOR", "never");
        run
    };
    if list {
        let mut run = command(&["hicache-core"]);
        run.arg("--list");
        return step("cargo mutants --list", run);
    }
    // Two stages give the verdict of judging every mutant by core's tests and the suite,
    // at a fraction of the cost: core's own tests build and run in seconds and catch most
    // mutants; only what they miss is judged again with the testkit's tests (the suite on
    // the reference backend, ~27 s a mutant plus its larger build).
    let mut first = command(&["hicache-core"]);
    if iterate {
        first.arg("--iterate");
    }
    run_stage(
        "cargo mutants, judged by hicache-core's tests",
        &tool,
        first,
    )?;
    let first_pass = summarize(&[(&report, OUTCOMES)], false)?;
    if first_pass["counts"]["missed"] == json!(0) && first_pass["counts"]["timeout"] == json!(0) {
        let summary = summarize(&[(&report, OUTCOMES), (&report, PREVIOUSLY)], true)?;
        return write_summary(&summary);
    }
    let mut second = command(&["hicache-core", "hicache-testkit"]);
    // cargo-mutants' baseline runs only the mutated package's tests (core's), so the
    // timeouts it would derive from it are too short for the testkit's suite, and the first
    // mutant builds the testkit from cold.
    second.arg("--iterate").args([
        "--timeout",
        &TEST_TIMEOUT_SECS.to_string(),
        "--build-timeout",
        &BUILD_TIMEOUT_SECS.to_string(),
    ]);
    run_stage(
        "cargo mutants --iterate, the survivors judged again with the conformance suite",
        &tool,
        second,
    )?;
    // cargo-mutants moved the first pass to `mutants.out.old`; its caught and unviable
    // mutants are this run's too (the second pass lists them as previously caught).
    let first = out_dir.join("mutants.out.old");
    let summary = summarize(
        &[
            (&report, OUTCOMES),
            (&first, &["caught", "unviable"]),
            (&first, PREVIOUSLY),
        ],
        true,
    )?;
    write_summary(&summary)
}

/// Runs one cargo-mutants pass; a pass with survivors is still a completed run.
fn run_stage(title: &str, tool: &Path, mut run: Command) -> Result<(), String> {
    println!("==> {title}");
    let started = std::time::Instant::now();
    let status = run
        .status()
        .map_err(|e| format!("cannot start {}: {e}", tool.display()))?;
    println!("<== {title}: {:.1}s", started.elapsed().as_secs_f64());
    // Exit codes of cargo-mutants: 0 all caught, 2 some missed, 3 some timed out; anything
    // else (1, 4: usage, baseline failed) means the run itself did not work.
    match status.code() {
        Some(0 | 2 | 3) => Ok(()),
        _ => Err(format!(
            "cargo mutants failed ({status}); see target/mutants/mutants.out/debug.log"
        )),
    }
}

fn write_summary(summary: &Value) -> Result<(), String> {
    let json_path = root().join("target").join("mutants.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(summary).expect("json"),
    )
    .map_err(|e| format!("{}: {e}", json_path.display()))?;
    println!("summary written to {}", json_path.display());
    Ok(())
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

/// Counts per outcome and per file, and the surviving mutants, from the outcome lists of
/// one or more cargo-mutants output dirs (each with the outcomes to take from it).
fn summarize(sources: &[(&Path, &[&str])], print: bool) -> Result<Value, String> {
    let mut counts = serde_json::Map::new();
    let mut per_file: serde_json::Map<String, Value> = serde_json::Map::new();
    let mut survivors = Vec::new();
    for (dir, outcomes) in sources {
        for outcome in outcomes.iter().copied() {
            let text =
                std::fs::read_to_string(dir.join(format!("{outcome}.txt"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let n = counts.get(outcome).and_then(Value::as_u64).unwrap_or(0);
            counts.insert(outcome.into(), json!(n + lines.len() as u64));
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
    }
    if counts.values().all(|v| v == &json!(0)) {
        return Err("no outcomes in target/mutants: cargo mutants did not run".into());
    }
    if print {
        println!("mutants: {}", Value::Object(counts.clone()));
        for (file, c) in &per_file {
            println!("  {file}: {c}");
        }
        for s in &survivors {
            println!("  survived ({}): {}", s["outcome"], s["mutant"]);
        }
    }
    Ok(json!({
        "tool": format!("cargo-mutants {VERSION}"),
        "counts": counts,
        "per_file": per_file,
        "survivors": survivors,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module split or renamed must not leave the default run mutating a file that is gone.
    #[test]
    fn every_default_file_exists() {
        for f in FILES {
            assert!(
                root().join(f).is_file(),
                "{f} is in FILES but not in the workspace"
            );
        }
    }
}
