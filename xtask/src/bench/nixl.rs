//! NIXL's POSIX plugin at its best: `../shared/baselines/nixl_posix_bench.py` in a venv with
//! `nixl-cu12`, both its `uring` and `aio` modes, the same pages in flight as hicache.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::failure;
use crate::root;

/// The modes the baseline runs each time; the case reports the better one per figure.
pub(super) const MODES: [&str; 2] = ["uring", "aio"];

/// Creates the NIXL venv if needed; returns its python or why it cannot.
pub(super) fn python() -> Result<PathBuf, String> {
    let venv = root().join("target").join("nixl-venv");
    let python = venv.join("bin").join("python");
    let ready = venv.join(".installed");
    if ready.exists() {
        return Ok(python);
    }
    println!("bench: creating the NIXL venv (pip install --no-deps nixl-cu12==1.5.1 numpy)");
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .map_err(|e| format!("python3 -m venv: {e}"))?
        .success();
    if !ok {
        return Err("python3 -m venv failed (is python3-venv installed?)".into());
    }
    let out = Command::new(venv.join("bin").join("pip"))
        .args(["install", "-q", "--no-deps", "nixl-cu12==1.5.1", "numpy"])
        .output()
        .map_err(|e| format!("pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip install failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    std::fs::write(&ready, b"").map_err(|e| e.to_string())?;
    Ok(python)
}

/// One run's figures for one mode.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct ModeRun {
    pub(super) write: Vec<f64>,
    pub(super) read: Vec<f64>,
    pub(super) query_keys_per_s: Option<f64>,
}

/// What to ask the baseline for.
pub(super) struct Request<'a> {
    pub(super) dir: &'a Path,
    pub(super) page_bytes: u64,
    pub(super) pages: u64,
    pub(super) batch: u64,
    pub(super) inflight: u64,
    pub(super) rounds: usize,
    /// Also time `query_memory` (SGLang's `batch_exists` through NIXL), `batch` keys a call.
    pub(super) query: bool,
}

/// Runs the baseline once in every mode of [`MODES`]; per-round GB/s per mode, in order.
pub(super) fn run(python: &Path, r: &Request) -> Result<Vec<ModeRun>, String> {
    let script = root()
        .join("..")
        .join("shared")
        .join("baselines")
        .join("nixl_posix_bench.py");
    let mut cmd = Command::new(python);
    cmd.arg(&script)
        .args(["--pages", &r.pages.to_string()])
        .args(["--page-size", &r.page_bytes.to_string()])
        .args(["--batch", &r.batch.to_string()])
        .args(["--inflight", &r.inflight.to_string()])
        .args(["--iters", &r.rounds.to_string()])
        .args(["--modes", &MODES.join(",")])
        .arg("--dir")
        .arg(r.dir.join("nixl"))
        .env("NIXL_LOG_LEVEL", "WARN");
    if r.query {
        cmd.arg("--query");
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(failure(&out));
    }
    parse(&String::from_utf8_lossy(&out.stdout), r.rounds)
}

/// Reads the script's output: a line per mode (`MODE w1 … wN r1 … rN OK`), then its median
/// line and, with `--query`, a `query_memory K keys/s` line.
fn parse(text: &str, rounds: usize) -> Result<Vec<ModeRun>, String> {
    let mut runs = Vec::new();
    let mut current: Option<ModeRun> = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if MODES.contains(&first) {
            if !line.contains("OK") {
                return Err(format!("NIXL verification failed: {line}"));
            }
            let nums: Vec<f64> = words.filter_map(|w| w.parse().ok()).collect();
            if nums.len() < 2 * rounds {
                return Err(format!("cannot parse NIXL line: {line}"));
            }
            runs.extend(current.take());
            current = Some(ModeRun {
                write: nums[..rounds].to_vec(),
                read: nums[rounds..2 * rounds].to_vec(),
                query_keys_per_s: None,
            });
        } else if first == "query_memory" {
            let value = words
                .next()
                .and_then(|w| w.replace(',', "").parse().ok())
                .ok_or_else(|| format!("cannot parse NIXL line: {line}"))?;
            match current.as_mut() {
                Some(run) => run.query_keys_per_s = Some(value),
                None => return Err(format!("a query line before any mode: {line}")),
            }
        }
    }
    runs.extend(current);
    if runs.len() != MODES.len() {
        return Err(format!(
            "expected {} mode lines in NIXL output, found {}: {text}",
            MODES.len(),
            runs.len()
        ));
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
# pages=4 page_size=65536 batch=2 inflight=2 iters=2 direct=True dir=/x total=0.000 GB
mode       write GB/s (per iter)            read GB/s (per iter)             verify
uring        1.00   2.00                      3.00   4.00                   OK
           write median 1.50 GB/s, read median 3.50 GB/s
           query_memory 123,456 keys/s (batches of 2)
aio          0.50   0.60                      0.70   0.80                   OK
           write median 0.55 GB/s, read median 0.75 GB/s
           query_memory 99 keys/s (batches of 2)
";

    #[test]
    fn reads_every_mode_and_its_query_rate() {
        let runs = parse(OUTPUT, 2).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].write, [1.0, 2.0]);
        assert_eq!(runs[0].read, [3.0, 4.0]);
        assert_eq!(runs[0].query_keys_per_s, Some(123456.0));
        assert_eq!(runs[1].write, [0.5, 0.6]);
        assert_eq!(runs[1].query_keys_per_s, Some(99.0));
    }

    #[test]
    fn a_mismatch_a_missing_mode_or_a_short_line_is_an_error() {
        let bad = OUTPUT.replacen("OK", "MISMATCH", 1);
        assert!(parse(&bad, 2).unwrap_err().contains("verification"));
        let one: String = OUTPUT.lines().take(5).collect::<Vec<_>>().join("\n");
        assert!(
            parse(&one, 2)
                .unwrap_err()
                .contains("expected 2 mode lines")
        );
        assert!(parse(OUTPUT, 3).unwrap_err().contains("cannot parse"));
        assert!(parse("", 2).is_err());
    }
}
