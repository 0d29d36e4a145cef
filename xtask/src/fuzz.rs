//! `cargo xtask fuzz`: the libFuzzer targets of `fuzz/` (cargo-fuzz layout), built with
//! nightly's coverage instrumentation and AddressSanitizer the way `cargo fuzz build` does,
//! so neither cargo-fuzz nor anything but nightly is needed. Each target starts from its
//! corpus in `fuzz/corpus/<target>` (kept in the repository, never written by a run); new
//! inputs go to `target/fuzz-corpus/<target>`, crashes to `fuzz/artifacts/<target>/`.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use crate::{nightly_cargo, root, step};

/// The targets, in `fuzz/fuzz_targets/`.
pub(crate) const TARGETS: [&str; 4] = ["config", "envelope", "scrub", "keys"];

/// The instrumentation `cargo fuzz build` uses (sancov + ASan, debug assertions on).
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address \
    -Cdebug-assertions -Coverflow-checks";

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

pub(crate) fn fuzz(args: &[String]) -> Result<(), String> {
    let mut seconds = 60u64;
    let mut only: Option<String> = None;
    let mut json_out = root().join("target").join("fuzz.json");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--seconds needs a number above 0")?
            }
            "--target" => {
                let t = it.next().ok_or("--target needs a name")?;
                if !TARGETS.contains(&t.as_str()) {
                    return Err(format!("unknown fuzz target `{t}`; targets: {TARGETS:?}"));
                }
                only = Some(t.clone());
            }
            "--json" => json_out = PathBuf::from(it.next().ok_or("--json needs a file")?),
            other => return Err(format!("unknown fuzz option `{other}`")),
        }
    }
    let target_dir = root().join("target").join("fuzz");
    let mut build = nightly_cargo();
    build
        .current_dir(root().join("fuzz"))
        .args(["build", "--release", "--bins", "--target", TRIPLE])
        .env("RUSTFLAGS", RUSTFLAGS)
        .env("CARGO_TARGET_DIR", &target_dir);
    step(
        "cargo +nightly build (fuzz targets, sancov + AddressSanitizer)",
        build,
    )?;
    // The targets' scratch files (config files, a storage dir) go here and are removed after
    // each run; memory-backed where the machine has /dev/shm.
    let shm = std::path::Path::new("/dev/shm");
    let scratch = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        root().join("target")
    }
    .join(format!("hicache-fuzz-{}", std::process::id()));
    let mut results = Vec::new();
    let mut failed = Vec::new();
    for target in TARGETS
        .iter()
        .filter(|t| only.as_deref().is_none_or(|o| o == **t))
    {
        let seeds = root().join("fuzz").join("corpus").join(target);
        let found = root().join("target").join("fuzz-corpus").join(target);
        let artifacts = root().join("fuzz").join("artifacts").join(target);
        for dir in [&found, &artifacts, &scratch] {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let bin = target_dir.join(TRIPLE).join("release").join(target);
        println!("==> fuzz {target}: {seconds}s");
        let out = Command::new(&bin)
            .arg(&found)
            .arg(&seeds)
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg("-print_final_stats=1")
            // Inputs above 64 KiB teach these parsers nothing a smaller one does not.
            .arg("-max_len=65536")
            .env("ASAN_OPTIONS", "detect_leaks=0")
            .env("HICACHE_FUZZ_SCRATCH", &scratch)
            .output();
        let _ = std::fs::remove_dir_all(&scratch);
        let out = out.map_err(|e| format!("{}: cannot start: {e}", bin.display()))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let stat = |name: &str| -> Option<u64> {
            log.lines()
                .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
                .and_then(|v| v.trim().parse().ok())
        };
        // The last status line: `#N DONE cov: C ft: F corp: K/...`.
        let field = |name: &str| -> Option<u64> {
            let line = log.lines().rev().find(|l| l.contains(" cov: "))?;
            let mut words = line.split_whitespace();
            words.find(|w| *w == name)?;
            words.next()?.split('/').next()?.parse().ok()
        };
        let result = json!({
            "target": target,
            "seconds": seconds,
            "ok": out.status.success(),
            "executions": stat("number_of_executed_units"),
            "executions_per_s": stat("average_exec_per_sec"),
            "new_inputs": stat("new_units_added"),
            "coverage_edges": field("cov:"),
            "features": field("ft:"),
            "corpus": field("corp:"),
        });
        println!("<== fuzz {target}: {result}");
        if !out.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
            failed.push(format!("{target} (inputs in {})", artifacts.display()));
        }
        results.push(result);
    }
    let report: Value = json!({ "targets": results });
    std::fs::write(
        &json_out,
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
    )
    .map_err(|e| format!("{}: {e}", json_out.display()))?;
    println!("fuzz: wrote {}", json_out.display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fuzz targets found a failure: {}",
            failed.join(", ")
        ))
    }
}
