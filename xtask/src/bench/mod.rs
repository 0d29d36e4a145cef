//! `cargo xtask bench`: hicache against the raw O_DIRECT loop and NIXL's POSIX plugin at its
//! best, in one run, interleaved and repeated (this machine's disk is noisy), medians and
//! ratios.
//!
//! Cases, each repeated and interleaved per repeat:
//! - **transfers** (ext4, tmpfs × 64 KiB, 1 MiB, 8 MiB): hicache (envelope), hicache with
//!   `page_format = "raw"`, the raw O_DIRECT loop, the same loop with a per-page open and
//!   publishing rename (`--baseline raw-publish`: what naming and atomic publish cost at the
//!   least), the raw loop again with files of an enveloped page's stored length (what the
//!   envelope's extra bytes and requests cost the loop itself, counted in payload bytes),
//!   NIXL in its `uring` and `aio` modes with the same pages in flight as hicache (the better
//!   mode per figure is reported), and on a disk NIXL again with its pages scattered over its
//!   files (where a request's pages lie decides whether the block layer can merge them);
//! - **exists** (ext4, tmpfs; 1024 pages, 128 keys a call): hicache `batch_exists` against
//!   NIXL's `query_memory`, SGLang's existence check through NIXL;
//! - **durability** ([`sync`]) and **OBJ** ([`obj`]).

mod disk;
mod nixl;
mod obj;
mod report;
mod stats;
mod sync;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::{cargo, root};
use stats::{median, num, ratio, rounds};

/// Rounds per run for every contender (write + read each; the first write goes to fresh files).
/// Medians over rounds describe the steady state; the first round is in the samples.
const ROUNDS: usize = 5;
/// Pages per call (hicache) and per transfer request (NIXL).
const BATCH: u64 = 32;
/// Calls in flight: hicache `--threads`, NIXL `--inflight`, so both have the same pages in
/// flight.
const IN_FLIGHT: u64 = 2;
/// Threads of the raw loops, each with one page in flight: the pages hicache's calls and
/// NIXL's requests have in flight. With 64 KiB pages on ext4, 64 threads moved more than 32
/// (about 15 % in 4 interleaved passes), so fewer would leave the loops below their best.
const RAW_THREADS: u64 = BATCH * IN_FLIGHT;
/// The exists case: pages written, keys per call.
const EXISTS_PAGES: u64 = 1024;
const EXISTS_BATCH: u64 = 128;

#[derive(Debug)]
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
                    .filter(|&n| n > 0)
                    .ok_or("--repeats needs a number above 0")?
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

/// What every case shares.
struct Run {
    /// The `hicache` binary.
    hicache: PathBuf,
    /// A config file that sets `page_format = "raw"`.
    raw_format: PathBuf,
    /// NIXL's python, when the baseline could be installed.
    nixl: Option<PathBuf>,
    repeats: usize,
}

impl Run {
    /// `hicache bench` on `dir` with the common flags.
    fn hicache(&self, dir: &Path, page_bytes: u64, pages: u64, batch: u64) -> Command {
        let mut c = Command::new(&self.hicache);
        c.args(["bench", "--model", "custom"])
            .args(["--page-bytes", &page_bytes.to_string()])
            .args(["--pages", &pages.to_string()])
            .args(["--batch", &batch.to_string()])
            .arg("--dir")
            .arg(dir.join("hicache"))
            .arg("--json");
        c
    }

    /// `hicache bench --baseline <baseline>`: one of the raw loops, at the pages hicache
    /// and NIXL have in flight ([`RAW_THREADS`]), for [`ROUNDS`] rounds.
    fn raw_loop(&self, dir: &Path, baseline: &str, page_bytes: u64, pages: u64) -> Command {
        let mut c = self.hicache(dir, page_bytes, pages, BATCH);
        c.args(["--baseline", baseline])
            .args(["--threads", &RAW_THREADS.to_string()])
            .args(["--rounds", &ROUNDS.to_string()]);
        c
    }
}

/// Samples of one figure per contender.
#[derive(Default)]
struct Samples {
    write: Vec<f64>,
    read: Vec<f64>,
    /// Heap allocations per page, per round (hicache only).
    write_allocations: Vec<f64>,
    read_allocations: Vec<f64>,
    write_allocations_per_call: Vec<f64>,
    read_allocations_per_call: Vec<f64>,
    /// Peak resident memory beyond the pool, bytes, per run (hicache only).
    rss_beyond_pool: Vec<f64>,
}

impl Samples {
    /// Adds a run whose files held `stored` bytes a page, counted as `payload` bytes: a loop
    /// that moves an enveloped page's length is measured on the page it carries.
    fn add_as_payload(&mut self, report: &Value, payload: u64, stored: u64) {
        let scale = payload as f64 / stored as f64;
        self.write.extend(
            rounds(report, "write_rounds")
                .into_iter()
                .map(|g| g * scale),
        );
        self.read
            .extend(rounds(report, "read_rounds").into_iter().map(|g| g * scale));
    }

    fn add(&mut self, report: &Value) {
        self.write.extend(rounds(report, "write_rounds"));
        self.read.extend(rounds(report, "read_rounds"));
        let per = |field: &str, unit: &str| -> Vec<f64> {
            report[field]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r[unit].as_f64())
                .collect()
        };
        self.write_allocations
            .extend(per("write_rounds", "allocations_per_page"));
        self.read_allocations
            .extend(per("read_rounds", "allocations_per_page"));
        self.write_allocations_per_call
            .extend(per("write_rounds", "allocations_per_call"));
        self.read_allocations_per_call
            .extend(per("read_rounds", "allocations_per_call"));
        if let (Some(rss), Some(pool)) = (
            report["peak_rss_bytes"].as_u64(),
            report["pool_bytes"].as_u64(),
        ) {
            self.rss_beyond_pool.push(rss.saturating_sub(pool) as f64);
        }
    }
}

/// The mode whose median of `pick`'s samples is highest, with that median.
fn best_mode(
    per_mode: &[Vec<nixl::ModeRun>],
    pick: impl Fn(&nixl::ModeRun) -> Vec<f64>,
) -> (Value, f64) {
    let mut best = (Value::Null, f64::NAN);
    for (m, (mode, _)) in nixl::VARIANTS.iter().enumerate() {
        let samples: Vec<f64> = per_mode
            .iter()
            .filter_map(|runs| runs.get(m))
            .flat_map(&pick)
            .collect();
        let med = median(samples);
        if med.is_finite() && (best.1.is_nan() || med > best.1) {
            best = (json!(mode), med);
        }
    }
    best
}

/// Every variant's per-round samples over all runs, by variant name.
fn variant_samples(per_run: &[Vec<nixl::ModeRun>]) -> Value {
    nixl::VARIANTS
        .iter()
        .enumerate()
        .map(|(i, (mode, _))| {
            let runs = per_run.iter().filter_map(|r| r.get(i));
            let write: Vec<f64> = runs.clone().flat_map(|r| r.write.clone()).collect();
            let read: Vec<f64> = runs.flat_map(|r| r.read.clone()).collect();
            (mode.to_string(), json!({ "write": write, "read": read }))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The length of each object an enveloped page is stored as, from a `hicache bench` JSON
/// report; `None` when the report lacks it or the page is stored as several objects (the
/// raw loop moves one file per page).
fn stored_object_bytes(report: &Value) -> Option<u64> {
    match (
        report["stored_bytes_per_page"].as_u64(),
        report["objects_per_page"].as_u64(),
    ) {
        (Some(bytes), Some(1)) if bytes > 0 => Some(bytes),
        _ => None,
    }
}

/// One transfer case: every contender once per repeat, interleaved.
fn transfer_case(
    run: &Run,
    fs: &Fs,
    size_name: &str,
    page_bytes: u64,
    total: u64,
) -> Result<Value, String> {
    let pages = (total / page_bytes).max(16);
    let name = format!("{}/{size_name}", fs.name);
    println!(
        "bench: {name}: {pages} pages, batch {BATCH}, {IN_FLIGHT} in flight, {} repeat(s)",
        run.repeats
    );
    let (mut envelope, mut raw_format, mut raw_loop, mut raw_publish, mut raw_stored) =
        <(Samples, Samples, Samples, Samples, Samples)>::default();
    let device = disk::Device::of(&fs.dir);
    // What the device saw per contender: hicache, raw format, raw loop, raw-publish, the raw
    // loop at the stored length, NIXL.
    let (mut req_h, mut req_f, mut req_r, mut req_p, mut req_s, mut req_n) = <(
        disk::Requests,
        disk::Requests,
        disk::Requests,
        disk::Requests,
        disk::Requests,
        disk::Requests,
    )>::default();
    // NIXL with its pages scattered over its files, on a disk only (where pages lie does
    // not matter to a memory filesystem).
    let mut req_x = disk::Requests::default();
    let mut scattered_runs: Vec<Vec<nixl::ModeRun>> = Vec::new();
    // An enveloped page's stored length, from hicache's first run.
    let mut stored: Option<u64> = None;
    let mut nixl_runs: Vec<Vec<nixl::ModeRun>> = Vec::new();
    let mut nixl_error = None;
    let mut verified = true;
    for _ in 0..run.repeats {
        for (config, samples, req, what) in [
            (None, &mut envelope, &mut req_h, "hicache bench"),
            (
                Some(&run.raw_format),
                &mut raw_format,
                &mut req_f,
                "hicache bench, raw format",
            ),
        ] {
            let mut c = run.hicache(&fs.dir, page_bytes, pages, BATCH);
            if let Some(config) = config {
                c.arg("--config").arg(config);
            }
            c.args(["--threads", &IN_FLIGHT.to_string()]);
            c.args(["--rounds", &ROUNDS.to_string(), "--ops", "write,read"]);
            let h = req
                .around(device, || run_json(&mut c))
                .map_err(|e| format!("{name}: {what}: {e}"))?;
            verified &= h["verified"] == json!(true);
            samples.add(&h);
            if config.is_none() && stored.is_none() {
                stored = stored_object_bytes(&h);
            }
        }

        for (baseline, samples, req) in [
            ("raw", &mut raw_loop, &mut req_r),
            ("raw-publish", &mut raw_publish, &mut req_p),
        ] {
            let mut c = run.raw_loop(&fs.dir, baseline, page_bytes, pages);
            let r = req
                .around(device, || run_json(&mut c))
                .map_err(|e| format!("{name}: {baseline} baseline: {e}"))?;
            verified &= r["verified"] == json!(true);
            samples.add(&r);
        }

        // The raw loop again, its files as long as hicache's objects (the envelope's header
        // and padding included), when they are longer than the page.
        if let Some(object) = stored.filter(|&b| b > page_bytes) {
            let mut c = run.raw_loop(&fs.dir, "raw", object, pages);
            let r = req_s
                .around(device, || run_json(&mut c))
                .map_err(|e| format!("{name}: raw baseline at {object} bytes a page: {e}"))?;
            verified &= r["verified"] == json!(true);
            raw_stored.add_as_payload(&r, page_bytes, object);
        }

        if let Some(py) = &run.nixl {
            let request = nixl::Request {
                dir: &fs.dir,
                page_bytes,
                pages,
                batch: BATCH,
                inflight: IN_FLIGHT,
                rounds: ROUNDS,
                query: false,
                memories: &[nixl::Memory::Script, nixl::Memory::HugePages],
                placement: nixl::Placement::InOrder,
            };
            match req_n.around(device, || nixl::run(py, &request)) {
                Ok(modes) => nixl_runs.push(modes),
                Err(e) => nixl_error = Some(e),
            }
            if device.is_some() {
                // In huge pages only: NIXL's best memory on a disk in every run so far.
                let request = nixl::Request {
                    memories: &[nixl::Memory::HugePages],
                    placement: nixl::Placement::Scattered,
                    ..request
                };
                match req_x.around(device, || nixl::run(py, &request)) {
                    Ok(modes) => scattered_runs.push(modes),
                    // NIXL's own failure, if any, is the one to report.
                    Err(e) => {
                        nixl_error.get_or_insert_with(|| format!("pages scattered: {e}"));
                    }
                }
            }
        }
    }
    let med = |v: &Vec<f64>| median(v.clone());
    let (h_w, h_r) = (med(&envelope.write), med(&envelope.read));
    let (f_w, f_r) = (med(&raw_format.write), med(&raw_format.read));
    let (r_w, r_r) = (med(&raw_loop.write), med(&raw_loop.read));
    let (p_w, p_r) = (med(&raw_publish.write), med(&raw_publish.read));
    let (s_w, s_r) = (med(&raw_stored.write), med(&raw_stored.read));
    let (w_mode, n_w) = best_mode(&nixl_runs, |m| m.write.clone());
    let (r_mode, n_r) = best_mode(&nixl_runs, |m| m.read.clone());
    let nixl_samples = variant_samples(&nixl_runs);
    let mut case = json!({
        "name": name,
        "page_bytes": page_bytes,
        "pages": pages,
        "batch": BATCH,
        "in_flight": IN_FLIGHT,
        "raw_threads": RAW_THREADS,
        "verified": verified,
        "hicache_write_gbps": num(h_w),
        "hicache_read_gbps": num(h_r),
        "raw_format_write_gbps": num(f_w),
        "raw_format_read_gbps": num(f_r),
        "raw_write_gbps": num(r_w),
        "raw_read_gbps": num(r_r),
        "raw_publish_write_gbps": num(p_w),
        "raw_publish_read_gbps": num(p_r),
        "nixl_write_gbps": num(n_w),
        "nixl_read_gbps": num(n_r),
        "nixl_mode": { "write": w_mode, "read": r_mode },
        "ratio_vs_raw": { "write": ratio(h_w, r_w), "read": ratio(h_r, r_r) },
        "ratio_vs_nixl": { "write": ratio(h_w, n_w), "read": ratio(h_r, n_r) },
        "ratio_vs_raw_format": { "write": ratio(h_w, f_w), "read": ratio(h_r, f_r) },
        "ratio_vs_raw_publish": { "write": ratio(h_w, p_w), "read": ratio(h_r, p_r) },
        "raw_publish_vs_raw": { "write": ratio(p_w, r_w), "read": ratio(p_r, r_r) },
        "allocations_per_page": {
            "write": num(med(&envelope.write_allocations)),
            "read": num(med(&envelope.read_allocations)),
        },
        "allocations_per_call": {
            "write": num(med(&envelope.write_allocations_per_call)),
            "read": num(med(&envelope.read_allocations_per_call)),
        },
        "requests": {
            "hicache": req_h.json(),
            "raw_format": req_f.json(),
            "raw": req_r.json(),
            "raw_publish": req_p.json(),
            "raw_stored": req_s.json(),
            "nixl": req_n.json(),
        },
        "rss_beyond_pool_bytes": num(envelope.rss_beyond_pool.iter().copied().fold(f64::NAN, f64::max)),
        "samples": {
            "hicache_write": envelope.write, "hicache_read": envelope.read,
            "raw_format_write": raw_format.write, "raw_format_read": raw_format.read,
            "raw_write": raw_loop.write, "raw_read": raw_loop.read,
            "raw_publish_write": raw_publish.write, "raw_publish_read": raw_publish.read,
            "nixl": nixl_samples,
        },
        "nixl_error": nixl_error,
    });
    // The raw loop at the stored length, added apart: one macro for all of it outgrows
    // `json!`'s recursion limit.
    case["stored_object_bytes"] = json!(stored);
    case["raw_stored_write_gbps"] = num(s_w);
    case["raw_stored_read_gbps"] = num(s_r);
    case["raw_stored_vs_raw"] = json!({ "write": ratio(s_w, r_w), "read": ratio(s_r, r_r) });
    case["ratio_vs_raw_stored"] = json!({ "write": ratio(h_w, s_w), "read": ratio(h_r, s_r) });
    case["samples"]["raw_stored_write"] = json!(raw_stored.write);
    case["samples"]["raw_stored_read"] = json!(raw_stored.read);
    // NIXL with its pages scattered: null where it did not run.
    let (xw_mode, x_w) = best_mode(&scattered_runs, |m| m.write.clone());
    let (xr_mode, x_r) = best_mode(&scattered_runs, |m| m.read.clone());
    case["nixl_scattered_write_gbps"] = num(x_w);
    case["nixl_scattered_read_gbps"] = num(x_r);
    case["nixl_scattered_mode"] = json!({ "write": xw_mode, "read": xr_mode });
    case["nixl_scattered_vs_nixl"] = json!({ "write": ratio(x_w, n_w), "read": ratio(x_r, n_r) });
    case["ratio_vs_nixl_scattered"] = json!({ "write": ratio(h_w, x_w), "read": ratio(h_r, x_r) });
    case["requests"]["nixl_scattered"] = req_x.json();
    case["samples"]["nixl_scattered"] = variant_samples(&scattered_runs);
    Ok(case)
}

/// The exists case on one filesystem: `EXISTS_PAGES` 64 KiB pages written, then asked for in
/// calls of `EXISTS_BATCH` keys for about a second, by hicache and by NIXL's `query_memory`.
fn exists_case(run: &Run, fs: &Fs, pages: u64) -> Result<Value, String> {
    let page_bytes = 64 << 10;
    let name = format!("{}/exists", fs.name);
    println!(
        "bench: {name}: {pages} pages, {EXISTS_BATCH} keys a call, {} repeat(s)",
        run.repeats
    );
    let mut hicache = Vec::new();
    let mut nixl_runs: Vec<Vec<nixl::ModeRun>> = Vec::new();
    let mut nixl_error = None;
    let mut verified = true;
    for _ in 0..run.repeats {
        let mut c = run.hicache(&fs.dir, page_bytes, pages, EXISTS_BATCH);
        c.args([
            "--threads",
            "1",
            "--rounds",
            "1",
            "--ops",
            "write,read,exists",
        ]);
        let h = run_json(&mut c).map_err(|e| format!("{name}: hicache bench: {e}"))?;
        verified &= h["verified"] == json!(true);
        hicache.extend(h["exists_keys_per_s"].as_f64());
        if let Some(py) = &run.nixl {
            let request = nixl::Request {
                dir: &fs.dir,
                page_bytes,
                pages,
                batch: EXISTS_BATCH,
                inflight: 1,
                rounds: 1,
                query: true,
                // Asking for names moves no page: the buffers' memory does not matter.
                memories: &[nixl::Memory::Script],
                placement: nixl::Placement::InOrder,
            };
            match nixl::run(py, &request) {
                Ok(modes) => nixl_runs.push(modes),
                Err(e) => nixl_error = Some(e),
            }
        }
    }
    let h = median(hicache.clone());
    let (mode, n) = best_mode(&nixl_runs, |m| m.query_keys_per_s.into_iter().collect());
    Ok(json!({
        "name": name,
        "pages": pages,
        "batch": EXISTS_BATCH,
        "verified": verified,
        "hicache_keys_per_s": num(h),
        "nixl_keys_per_s": num(n),
        "nixl_mode": mode,
        "ratio_vs_nixl": ratio(h, n),
        "samples": {
            "hicache": hicache,
            "nixl": nixl_runs.iter().map(|r| r.iter().map(|m| m.query_keys_per_s).collect::<Vec<_>>()).collect::<Vec<_>>(),
        },
        "nixl_error": nixl_error,
    }))
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
    let raw_format = root().join("target").join("bench-raw-format.toml");
    std::fs::write(&raw_format, "page_format = \"raw\"\n")
        .map_err(|e| format!("{}: {e}", raw_format.display()))?;
    let run = Run {
        hicache: root().join("target").join(profile).join("hicache"),
        raw_format,
        nixl: match nixl::python() {
            Ok(p) => Some(p),
            Err(e) => {
                println!("bench: NIXL baseline unavailable ({e}); continuing without it");
                None
            }
        },
        repeats: o.repeats,
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
    let exists_pages = if o.tiny { 64 } else { EXISTS_PAGES };
    let mut cases = Vec::new();
    let mut exists = Vec::new();
    for fs in filesystems() {
        std::fs::create_dir_all(&fs.dir).map_err(|e| format!("{}: {e}", fs.dir.display()))?;
        for (size_name, page_bytes) in sizes {
            cases.push(transfer_case(&run, &fs, size_name, *page_bytes, total)?);
        }
        exists.push(exists_case(&run, &fs, exists_pages)?);
        let _ = std::fs::remove_dir_all(&fs.dir);
    }
    let ext4 = &filesystems()[0];
    let durability = sync::sync_cases(&run.hicache, &ext4.dir, sizes, total, o.repeats)?;
    let _ = std::fs::remove_dir_all(&ext4.dir);
    if !o.tiny {
        match obj::obj_case(&run.hicache, o.repeats) {
            Ok(case) => cases.push(case),
            Err(e) => println!("bench: OBJ case skipped: {e}"),
        }
    }
    let report = json!({
        "repeats": o.repeats,
        "quick": o.quick,
        "cases": cases,
        "exists": exists,
        "durability": durability,
    });
    let mut table = report::transfers(&report);
    table.push_str(&report::publish(&report));
    table.push_str(&report::stored(&report));
    table.push_str(&report::scattered(&report));
    table.push_str(&report::requests(&report));
    table.push_str(&report::memory(&report));
    table.push_str(&report::exists(&report));
    table.push_str(&sync::durability_markdown(&report));
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
    let all = ["cases", "exists", "durability"]
        .iter()
        .flat_map(|k| report[*k].as_array().into_iter().flatten());
    if all.clone().any(|c| c["verified"] != json!(true)) {
        return Err("a hicache run did not verify its data".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_what_they_do_not_know() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse(&args(&[])).unwrap().repeats, 3);
        assert_eq!(parse(&args(&["--tiny"])).unwrap().repeats, 1);
        assert_eq!(parse(&args(&["--repeats", "5"])).unwrap().repeats, 5);
        assert!(parse(&args(&["--repeats", "0"])).is_err());
        assert!(parse(&args(&["--repeats", "x"])).is_err());
        assert!(parse(&args(&["--json"])).is_err());
        assert!(parse(&args(&["--fast"])).unwrap_err().contains("--fast"));
    }

    #[test]
    fn the_stored_length_comes_from_a_report_of_one_object_a_page() {
        let report = |bytes: Value, objects: Value| json!({ "stored_bytes_per_page": bytes, "objects_per_page": objects });
        assert_eq!(
            stored_object_bytes(&report(json!(69632), json!(1))),
            Some(69632)
        );
        // Several objects a page (a per-layer layout): no single file to mirror.
        assert_eq!(stored_object_bytes(&report(json!(139264), json!(2))), None);
        // An older binary's report, or nonsense: none.
        assert_eq!(stored_object_bytes(&json!({ "page_bytes": 65536 })), None);
        assert_eq!(stored_object_bytes(&report(json!(0), json!(1))), None);
        assert_eq!(stored_object_bytes(&report(json!(-5), json!(1))), None);
        assert_eq!(stored_object_bytes(&report(json!("big"), json!(1))), None);
    }

    #[test]
    fn a_loop_at_the_stored_length_counts_payload_bytes() {
        let report = json!({
            "write_rounds": [{ "gbps": 4.0 }, { "gbps": 2.0 }],
            "read_rounds": [{ "gbps": 1.0 }],
        });
        let mut s = Samples::default();
        s.add_as_payload(&report, 3, 4);
        assert_eq!(s.write, vec![3.0, 1.5]);
        assert_eq!(s.read, vec![0.75]);
    }

    #[test]
    fn the_better_nixl_mode_is_chosen_per_figure() {
        let run = |w: f64, r: f64| nixl::ModeRun {
            write: vec![w],
            read: vec![r],
            query_keys_per_s: None,
        };
        // uring writes faster, aio reads faster.
        let runs = vec![vec![run(2.0, 1.0), run(1.0, 3.0)]];
        assert_eq!(best_mode(&runs, |m| m.write.clone()), (json!("uring"), 2.0));
        assert_eq!(best_mode(&runs, |m| m.read.clone()), (json!("aio"), 3.0));
        let (mode, figure) = best_mode(&[], |m| m.write.clone());
        assert_eq!(mode, Value::Null);
        assert!(figure.is_nan());
    }
}
