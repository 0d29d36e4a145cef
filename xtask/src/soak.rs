//! `cargo xtask soak`: the capacity soak (`hicache/examples/soak.rs`) in a release build:
//! three I/O threads against a storage dir held at its limit by the cleaner, 10 minutes by
//! default, its JSON report kept.

use std::path::PathBuf;

use crate::{cargo, root};

/// Runs the soak with the options it takes (`--seconds N`, `--dir D`, `--write-mib-s M`)
/// and writes its report to `--json FILE` (default `target/soak.json`).
pub(crate) fn soak(args: &[String]) -> Result<(), String> {
    let mut json = root().join("target").join("soak.json");
    let mut passed = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = PathBuf::from(it.next().ok_or("--json needs a file")?),
            "--seconds" | "--dir" | "--write-mib-s" => {
                passed.push(a.clone());
                passed.push(it.next().ok_or(format!("{a} needs a value"))?.clone());
            }
            other => return Err(format!("unknown soak option `{other}`")),
        }
    }
    let mut run = cargo();
    run.args([
        "run",
        "--release",
        "-p",
        "hicache",
        "--example",
        "soak",
        "--",
    ])
    .args(&passed);
    println!("==> soak {}", passed.join(" "));
    let out = run
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("soak: cannot start cargo: {e}"))?;
    let report = String::from_utf8_lossy(&out.stdout);
    print!("{report}");
    std::fs::write(&json, report.as_bytes())
        .map_err(|e| format!("soak: cannot write {}: {e}", json.display()))?;
    println!("<== soak report: {}", json.display());
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the soak failed ({}): see `ok` and the figures above",
            out.status
        ))
    }
}
