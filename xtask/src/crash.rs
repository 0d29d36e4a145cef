//! `cargo xtask crash`: the SIGKILL test of `hicache-cli/tests/crash.rs` at full length (200 kills
//! by default), its figures kept as JSON.

use std::path::PathBuf;
use std::process::Stdio;

use crate::{cargo, root};

/// Runs the crash test with `--kills N` (default 200) and writes its figures to `--json FILE`
/// (default `target/crash.json`).
pub(crate) fn crash(args: &[String]) -> Result<(), String> {
    let mut kills = 200u64;
    let mut json = root().join("target").join("crash.json");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--kills" => {
                kills = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--kills needs a number above 0")?
            }
            "--json" => json = PathBuf::from(it.next().ok_or("--json needs a file")?),
            other => return Err(format!("unknown crash option `{other}`")),
        }
    }
    println!(
        "==> crash: {kills} SIGKILLs of a writing process, each followed by a full read-verify"
    );
    let mut test = cargo();
    test.args([
        "test",
        "-p",
        "hicache-cli",
        "--test",
        "crash",
        "--",
        "--exact",
        "sigkill_while_writing_never_serves_a_wrong_page",
        "--nocapture",
    ])
    .env("HICACHE_CRASH_KILLS", kills.to_string())
    .stderr(Stdio::inherit());
    let out = test
        .output()
        .map_err(|e| format!("cargo test: cannot start: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = stdout
        .lines()
        .find_map(|l| l.strip_prefix("crash-report: "))
        .map(str::to_owned);
    if !out.status.success() {
        print!("{stdout}");
        return Err(format!("the crash test failed ({})", out.status));
    }
    let report = report.ok_or("the crash test printed no `crash-report:` line")?;
    let value: serde_json::Value =
        serde_json::from_str(&report).map_err(|e| format!("crash report: {e}"))?;
    let pretty = serde_json::to_string_pretty(&value).unwrap_or(report) + "\n";
    print!("{pretty}");
    std::fs::write(&json, pretty).map_err(|e| format!("{}: {e}", json.display()))?;
    println!("<== crash: wrote {}", json.display());
    Ok(())
}
