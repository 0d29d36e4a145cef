//! What each durability level of the POSIX plugin (`sync = none | data | full`) costs in
//! write throughput on ext4, interleaved per repeat.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::stats::{cell, median, num, ratio, rounds};
use super::{ROUNDS, run_json};
use crate::root;

/// The POSIX plugin's `sync = none | data | full` on ext4, interleaved per repeat: what each
/// durability level costs in write throughput (reads do not flush; they verify the data).
pub(super) fn sync_cases(
    hicache: &Path,
    dir: &Path,
    sizes: &[(&str, u64)],
    total: u64,
    repeats: usize,
) -> Result<Value, String> {
    const MODES: [&str; 3] = ["none", "data", "full"];
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let configs: Vec<PathBuf> = MODES
        .iter()
        .map(|m| {
            let path = root().join("target").join(format!("bench-sync-{m}.toml"));
            std::fs::write(
                &path,
                format!("[plugin.posix]\nactive = true\nsync = \"{m}\"\n"),
            )
            .map(|()| path)
            .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut cases = Vec::new();
    for (size_name, page_bytes) in sizes {
        let pages = (total / page_bytes).max(16);
        let name = format!("ext4/{size_name}");
        println!("bench: sync none|data|full on {name}: {pages} pages, {repeats} repeat(s)");
        let mut samples: [Vec<f64>; 3] = Default::default();
        let mut verified = true;
        for _ in 0..repeats {
            for (k, config) in configs.iter().enumerate() {
                let mut c = Command::new(hicache);
                c.args(["bench", "--config"]).arg(config);
                c.args(["--model", "custom", "--page-bytes", &page_bytes.to_string()]);
                c.args([
                    "--pages",
                    &pages.to_string(),
                    "--batch",
                    "32",
                    "--threads",
                    "2",
                ]);
                c.args(["--rounds", &ROUNDS.to_string(), "--ops", "write,read"]);
                c.arg("--dir").arg(dir.join("sync")).arg("--json");
                let r =
                    run_json(&mut c).map_err(|e| format!("{name}: sync = {}: {e}", MODES[k]))?;
                verified &= r["verified"].as_bool().unwrap_or(false);
                samples[k].extend(rounds(&r, "write_rounds"));
            }
        }
        let m: Vec<f64> = samples.iter().map(|s| median(s.clone())).collect();
        cases.push(json!({
            "name": name,
            "page_bytes": page_bytes,
            "pages": pages,
            "verified": verified,
            "write_gbps": { "none": num(m[0]), "data": num(m[1]), "full": num(m[2]) },
            "ratio_vs_none": { "data": ratio(m[1], m[0]), "full": ratio(m[2], m[0]) },
            "samples": { "none": samples[0], "data": samples[1], "full": samples[2] },
        }));
    }
    Ok(Value::Array(cases))
}

pub(super) fn durability_markdown(report: &Value) -> String {
    let f = cell;
    let mut s = String::from(
        "\n| POSIX write, GB/s | sync = none | data | full | data vs none | full vs none |\n|---|---|---|---|---|---|\n",
    );
    for c in report["durability"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            f(&c["write_gbps"]["none"]),
            f(&c["write_gbps"]["data"]),
            f(&c["write_gbps"]["full"]),
            f(&c["ratio_vs_none"]["data"]),
            f(&c["ratio_vs_none"]["full"]),
        ));
    }
    s.push_str("\nDurability cost: hicache bench (2 calls of 32 pages in flight) with `[plugin.posix] sync` set to each level in turn, interleaved per repeat; medians over all write rounds.\n");
    s
}
