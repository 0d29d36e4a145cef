//! `cargo xtask bench`: hicache against the raw O_DIRECT loop and NIXL's POSIX plugin, in one
//! run, interleaved and repeated (this machine's disk is noisy), medians and ratios.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::{cargo, root};

/// Rounds per run for every contender (write + read each; the first write goes to fresh files).
/// Medians over rounds describe the steady state; the first round is in the samples.
const ROUNDS: usize = 5;

struct Options {
    quick: bool,
    tiny: bool,
    json: Option<PathBuf>,
    repeats: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        tiny: false,
        json: None,
        repeats: 0,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--tiny" => o.tiny = true,
            "--json" => o.json = Some(PathBuf::from(it.next().ok_or("--json needs a file")?)),
            "--repeats" => {
                o.repeats = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--repeats needs a number")?
            }
            other => return Err(format!("unknown bench option `{other}`")),
        }
    }
    if o.repeats == 0 {
        o.repeats = if o.quick || o.tiny { 1 } else { 3 };
    }
    Ok(o)
}

/// A filesystem to run on.
struct Fs {
    name: &'static str,
    dir: PathBuf,
}

fn filesystems() -> Vec<Fs> {
    let mut v = vec![Fs {
        name: "ext4",
        dir: root().join("target").join("bench-data"),
    }];
    if Path::new("/dev/shm").is_dir() {
        v.push(Fs {
            name: "tmpfs",
            dir: PathBuf::from("/dev/shm/hicache-bench"),
        });
    }
    v
}

fn median(mut v: Vec<f64>) -> f64 {
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

/// Creates the NIXL venv if needed; returns its python or why it cannot.
fn nixl_python() -> Result<PathBuf, String> {
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

/// Per-round GB/s of a `hicache bench` JSON report.
fn rounds(report: &Value, field: &str) -> Vec<f64> {
    report[field]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["gbps"].as_f64())
        .collect()
}

/// "exit STATUS: last line of stderr" for a failed command.
fn failure(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    format!(
        "exit {}: {}",
        out.status,
        stderr.lines().last().unwrap_or("")
    )
}

fn run_json(cmd: &mut Command) -> Result<Value, String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(failure(&out));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bad JSON: {e}"))
}

/// NIXL's script prints per-iteration GB/s; the first write goes to fresh files.
fn run_nixl(
    python: &Path,
    dir: &Path,
    page_bytes: u64,
    pages: u64,
    batch: u64,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let script = root()
        .join("..")
        .join("shared")
        .join("baselines")
        .join("nixl_posix_bench.py");
    let out = Command::new(python)
        .arg(&script)
        .args([
            "--pages",
            &pages.to_string(),
            "--page-size",
            &page_bytes.to_string(),
            "--batch",
            &batch.to_string(),
        ])
        .args(["--iters", &ROUNDS.to_string(), "--modes", "uring", "--dir"])
        .arg(dir.join("nixl"))
        .env("NIXL_LOG_LEVEL", "WARN")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(failure(&out));
    }
    let line = text
        .lines()
        .find(|l| l.starts_with("uring "))
        .ok_or_else(|| format!("no result line in NIXL output: {text}"))?;
    if !line.contains("OK") {
        return Err(format!("NIXL verification failed: {line}"));
    }
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let r = ROUNDS;
    if nums.len() < 2 * r {
        return Err(format!("cannot parse NIXL line: {line}"));
    }
    Ok((nums[0..r].to_vec(), nums[r..2 * r].to_vec()))
}

pub(crate) fn bench(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    // The OBJ case needs the obj feature. The tiny run (CI, to keep the benchmark working)
    // uses the debug build the tests already made; its numbers mean nothing.
    let mut build = cargo();
    build.args(["build", "-p", "hicache-cli"]);
    if o.tiny {
        crate::step("cargo build -p hicache-cli", build)?;
    } else {
        build.args(["--release", "--features", "obj"]);
        crate::step("cargo build --release -p hicache-cli --features obj", build)?;
    }
    let profile = if o.tiny { "debug" } else { "release" };
    let hicache = root().join("target").join(profile).join("hicache");
    let nixl = match nixl_python() {
        Ok(p) => Some(p),
        Err(e) => {
            println!("bench: NIXL baseline unavailable ({e}); continuing without it");
            None
        }
    };
    let sizes: &[(&str, u64)] = if o.tiny {
        &[("64KiB", 64 << 10)]
    } else if o.quick {
        &[("64KiB", 64 << 10), ("1MiB", 1 << 20)]
    } else {
        &[("64KiB", 64 << 10), ("1MiB", 1 << 20), ("8MiB", 8 << 20)]
    };
    let total: u64 = if o.tiny {
        8 << 20
    } else if o.quick {
        128 << 20
    } else {
        512 << 20
    };
    let batch = 32u64;
    let mut cases = Vec::new();
    for fs in filesystems() {
        std::fs::create_dir_all(&fs.dir).map_err(|e| format!("{}: {e}", fs.dir.display()))?;
        for (size_name, page_bytes) in sizes {
            let pages = (total / page_bytes).max(16);
            let name = format!("{}/{size_name}", fs.name);
            println!(
                "bench: {name}: {pages} pages, batch {batch}, {} repeat(s)",
                o.repeats
            );
            let (mut hw, mut hr, mut rw, mut rr, mut nw, mut nr) =
                (vec![], vec![], vec![], vec![], vec![], vec![]);
            let mut nixl_error = None;
            let mut verified = true;
            for _ in 0..o.repeats {
                let common = |c: &mut Command| {
                    c.args([
                        "bench",
                        "--model",
                        "custom",
                        "--page-bytes",
                        &page_bytes.to_string(),
                    ])
                    .args([
                        "--pages",
                        &pages.to_string(),
                        "--batch",
                        &batch.to_string(),
                        "--rounds",
                        &ROUNDS.to_string(),
                    ])
                    .arg("--dir")
                    .arg(fs.dir.join("hicache"))
                    .arg("--json");
                };
                let mut c = Command::new(&hicache);
                common(&mut c);
                c.args(["--threads", "2", "--ops", "write,read"]);
                let h = run_json(&mut c).map_err(|e| format!("{name}: hicache bench: {e}"))?;
                verified &= h["verified"].as_bool().unwrap_or(false);
                hw.extend(rounds(&h, "write_rounds"));
                hr.extend(rounds(&h, "read_rounds"));
                let mut c = Command::new(&hicache);
                common(&mut c);
                c.args(["--baseline", "raw", "--threads", &batch.to_string()]);
                let r = run_json(&mut c).map_err(|e| format!("{name}: raw baseline: {e}"))?;
                rw.extend(rounds(&r, "write_rounds"));
                rr.extend(rounds(&r, "read_rounds"));
                if let Some(py) = &nixl {
                    match run_nixl(py, &fs.dir, *page_bytes, pages, batch) {
                        Ok((w, r)) => {
                            nw.extend(w);
                            nr.extend(r);
                        }
                        Err(e) => nixl_error = Some(e),
                    }
                }
            }
            let (h_w, h_r, r_w, r_r) = (
                median(hw.clone()),
                median(hr.clone()),
                median(rw.clone()),
                median(rr.clone()),
            );
            let (n_w, n_r) = (median(nw.clone()), median(nr.clone()));
            let ratio = |a: f64, b: f64| {
                if b.is_finite() && b > 0.0 {
                    json!(a / b)
                } else {
                    Value::Null
                }
            };
            let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
            cases.push(json!({
                "name": name,
                "page_bytes": page_bytes,
                "pages": pages,
                "batch": batch,
                "verified": verified,
                "hicache_write_gbps": num(h_w),
                "hicache_read_gbps": num(h_r),
                "raw_write_gbps": num(r_w),
                "raw_read_gbps": num(r_r),
                "nixl_write_gbps": num(n_w),
                "nixl_read_gbps": num(n_r),
                "ratio_vs_raw": { "write": ratio(h_w, r_w), "read": ratio(h_r, r_r) },
                "ratio_vs_nixl": { "write": ratio(h_w, n_w), "read": ratio(h_r, n_r) },
                "samples": { "hicache_write": hw, "hicache_read": hr, "raw_write": rw, "raw_read": rr, "nixl_write": nw, "nixl_read": nr },
                "nixl_error": nixl_error,
            }));
        }
        let _ = std::fs::remove_dir_all(&fs.dir);
    }
    let ext4 = &filesystems()[0];
    let durability = sync_cases(&hicache, &ext4.dir, sizes, total, o.repeats)?;
    let _ = std::fs::remove_dir_all(&ext4.dir);
    if !o.tiny {
        match obj_case(&hicache, o.repeats) {
            Ok(case) => cases.push(case),
            Err(e) => println!("bench: OBJ case skipped: {e}"),
        }
    }
    let report =
        json!({ "repeats": o.repeats, "quick": o.quick, "cases": cases, "durability": durability });
    let mut table = markdown(&report);
    table.push_str(&durability_markdown(&report));
    if o.tiny {
        table.push_str("\n(--tiny: a debug build on a few pages, to keep the benchmark working; these are not performance figures)\n");
    }
    println!("{table}");
    if let Some(path) = &o.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::write(path.with_extension("md"), &table)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        println!(
            "bench: wrote {} and {}",
            path.display(),
            path.with_extension("md").display()
        );
    }
    let all = cases
        .iter()
        .chain(durability.as_array().into_iter().flatten());
    if all.clone().any(|c| c["verified"] != json!(true)) {
        return Err("a hicache run did not verify its data".into());
    }
    Ok(())
}

/// The POSIX plugin's `sync = none | data | full` on ext4, interleaved per repeat: what each
/// durability level costs in write throughput (reads do not flush; they verify the data).
fn sync_cases(
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
            "write_gbps": { "none": m[0], "data": m[1], "full": m[2] },
            "ratio_vs_none": { "data": m[1] / m[0], "full": m[2] / m[0] },
            "samples": { "none": samples[0], "data": samples[1], "full": samples[2] },
        }));
    }
    Ok(Value::Array(cases))
}

fn durability_markdown(report: &Value) -> String {
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "–".into())
    };
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

/// A moto S3 server on a free loopback port, killed on drop.
struct Moto(std::process::Child, u16);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> Result<Moto, String> {
    use std::io::{Read, Write};
    let bin = root()
        .join("target")
        .join("s3-venv")
        .join("bin")
        .join("moto_server");
    if !bin.is_file() {
        return Err("moto_server is not installed (cargo xtask s3-servers)".into());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(&bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let moto = Moto(child, port);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            write!(s, "PUT /hicache-bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
            let mut reply = String::new();
            s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
            return if reply.contains(" 200 ") {
                Ok(moto)
            } else {
                Err(format!(
                    "create bucket: {}",
                    reply.lines().next().unwrap_or("")
                ))
            };
        }
        if std::time::Instant::now() > deadline {
            return Err("moto_server did not start".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// hicache OBJ vs the raw object_store loop, 1 MiB pages, on one moto server.
fn obj_case(hicache: &Path, repeats: usize) -> Result<Value, String> {
    let moto = start_moto()?;
    let config = root().join("target").join("bench-obj.toml");
    std::fs::write(
        &config,
        format!("[plugin.obj]\nactive = true\nbucket = \"hicache-bench\"\nendpoint = \"http://127.0.0.1:{}\"\naccess_key = \"bench\"\nsecret_key = \"bench\"\n", moto.1),
    )
    .map_err(|e| e.to_string())?;
    let (page_bytes, pages, batch) = (1u64 << 20, 64u64, 32u64);
    println!("bench: obj/1MiB (moto): {pages} pages, batch {batch}, {repeats} repeat(s)");
    let (mut hw, mut hr, mut rw, mut rr) = (vec![], vec![], vec![], vec![]);
    let mut verified = true;
    for _ in 0..repeats {
        for baseline in [false, true] {
            let mut c = Command::new(hicache);
            c.args(["bench", "--config"]).arg(&config);
            c.args([
                "--model",
                "custom",
                "--page-bytes",
                &page_bytes.to_string(),
                "--pages",
                &pages.to_string(),
            ]);
            c.args([
                "--batch",
                &batch.to_string(),
                "--threads",
                "1",
                "--rounds",
                &ROUNDS.to_string(),
                "--ops",
                "write,read",
                "--json",
            ]);
            if baseline {
                c.args(["--baseline", "raw-obj"]);
            }
            let r = run_json(&mut c).map_err(|e| format!("obj bench: {e}"))?;
            verified &= r["verified"].as_bool().unwrap_or(false);
            let (w, rd) = if baseline {
                (&mut rw, &mut rr)
            } else {
                (&mut hw, &mut hr)
            };
            w.extend(rounds(&r, "write_rounds"));
            rd.extend(rounds(&r, "read_rounds"));
        }
    }
    let (h_w, h_r, r_w, r_r) = (
        median(hw.clone()),
        median(hr.clone()),
        median(rw.clone()),
        median(rr.clone()),
    );
    Ok(json!({
        "name": "obj/1MiB (moto)",
        "page_bytes": page_bytes,
        "pages": pages,
        "batch": batch,
        "verified": verified,
        "hicache_write_gbps": h_w,
        "hicache_read_gbps": h_r,
        "raw_write_gbps": r_w,
        "raw_read_gbps": r_r,
        "nixl_write_gbps": Value::Null,
        "nixl_read_gbps": Value::Null,
        "ratio_vs_raw": { "write": h_w / r_w, "read": h_r / r_r },
        "ratio_vs_nixl": { "write": Value::Null, "read": Value::Null },
        "samples": { "hicache_write": hw, "hicache_read": hr, "raw_write": rw, "raw_read": rr },
    }))
}

fn markdown(report: &Value) -> String {
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "–".into())
    };
    let mut s = String::from(
        "| case | hicache write | raw write | NIXL write | hicache read | raw read | NIXL read | write vs raw | write vs NIXL | read vs raw | read vs NIXL |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in report["cases"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            f(&c["hicache_write_gbps"]),
            f(&c["raw_write_gbps"]),
            f(&c["nixl_write_gbps"]),
            f(&c["hicache_read_gbps"]),
            f(&c["raw_read_gbps"]),
            f(&c["nixl_read_gbps"]),
            f(&c["ratio_vs_raw"]["write"]),
            f(&c["ratio_vs_nixl"]["write"]),
            f(&c["ratio_vs_raw"]["read"]),
            f(&c["ratio_vs_nixl"]["read"]),
        ));
    }
    s.push_str(&format!(
        "\nGB/s = 1e9 B/s. Each contender runs {ROUNDS} write+read rounds per repeat (hicache writes new pages each round and evicts the previous round's, untimed; NIXL and raw rewrite their files, the first round into fresh ones); the table holds medians over all rounds of {} interleaved repeat(s). Batches of 32 pages: hicache 2 calls in flight (1 for OBJ), NIXL 32 descriptors per request with 1 in flight, raw 32 threads; for OBJ the raw baseline is the object_store client with 32 requests in flight on the same moto server.\n",
        report["repeats"]
    ));
    s
}
