//! Development commands of the workspace. CI runs `cargo xtask ci`.
//!
//! Usage: `cargo xtask <command>`; `cargo xtask help` lists them.

mod bench;
mod breadth;
mod crash;
mod fuzz;
#[cfg(test)]
mod modules;
mod mutants;
mod python;
mod soak;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench::bench(&args[1..]),
        Some("crash") => crash::crash(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("mutants") => mutants::mutants(&args[1..]),
        Some("python") => python::python(&args[1..]),
        Some("s3-servers") => s3_servers().map(drop),
        Some("sanitize") => sanitize(),
        Some("soak") => soak::soak(&args[1..]),
        Some("fmt") => fmt(),
        Some("help") | None => {
            print_help();
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`; see `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    println!(
        "cargo xtask <command>\n\n\
         ci     format check, clippy (-D warnings), every test, a tiny benchmark: what CI runs\n\
         bench  hicache vs the raw O_DIRECT loop and NIXL's POSIX plugin at its best (uring and\n\
         \x20      aio, same pages in flight), interleaved; exists vs query_memory\n\
         \x20      [--quick] [--tiny] [--repeats N] [--json FILE] (also writes FILE.md)\n\
         crash  SIGKILL a writing process 200 times on ext4, read-verify after each kill, then\n\
         \x20      scrub [--kills N] [--json FILE] (default target/crash.json)\n\
         fuzz   libFuzzer targets (config, envelope, scrub, keys) built with nightly, from\n\
         \x20      the corpus in fuzz/corpus [--seconds N (default 60)] [--target NAME] [--json FILE]\n\
         mutants  cargo-mutants on core's key, hash, routing, envelope, pool, connector and\n\
         \x20      blocking modules, judged by core's tests, then the survivors by the conformance\n\
         \x20      suite on the reference backend [--file PATH]... [--re REGEX] [--shard K/N]\n\
         \x20      [--iterate] [--list] (installs cargo-mutants into target/tools; summary in\n\
         \x20      target/mutants.json)\n\
         python the Python package (hicache-py): an abi3 wheel built with maturin, installed in\n\
         \x20      target/py-venv with numpy, tested against SGLang 0.5.23's own storage classes\n\
         s3-servers  install the S3 test servers (moto in target/s3-venv, s3s-fs in target/s3s)\n\
         soak   three I/O threads against a storage dir the cleaner holds at its limit, release\n\
         \x20      build: 0 wrong bytes, usage in the band, RSS flat [--seconds N (default 600)]\n\
         \x20      [--write-mib-s M (default 256; 0 = unthrottled)] [--dir D] [--json FILE]\n\
         \x20      (default target/soak.json)\n\
         sanitize    Miri on core's memory, pool, envelope, key and routing tests; POSIX engine\n\
         \x20           tests under AddressSanitizer (installs nightly's miri and rust-src)\n\
         fmt    format the workspace\n\
         help   this text"
    );
}

/// The workspace root (xtask lives one level below it).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs one step, timing it; a failing step stops the run.
pub(crate) fn step(name: &str, mut cmd: Command) -> Result<(), String> {
    println!("==> {name}");
    let started = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("{name}: cannot start: {e}"))?;
    println!("<== {name}: {:.1}s", started.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("step `{name}` failed ({status})"))
    }
}

fn fmt() -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["fmt", "--all"]);
    step("cargo fmt", cmd)
}

fn ci() -> Result<(), String> {
    let started = Instant::now();
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    step("cargo fmt --check", fmt)?;

    // moto installs on a thread while clippy runs; the OBJ tests need it later.
    let moto_log = root().join("target").join("s3-venv-install.log");
    std::fs::create_dir_all(root().join("target")).map_err(|e| format!("target dir: {e}"))?;
    let moto_job = {
        let log = moto_log.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            install_moto(Some(&log)).map(|p| (p, started.elapsed()))
        })
    };

    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    step(
        "cargo clippy --workspace --all-targets -- -D warnings",
        clippy,
    )?;

    let mut minimal = cargo();
    minimal.args([
        "clippy",
        "-p",
        "hicache",
        "-p",
        "hicache-cli",
        "--no-default-features",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    step(
        "cargo clippy -p hicache -p hicache-cli --no-default-features (no plugin compiled in)",
        minimal,
    )?;

    // The OBJ tests run against real S3 servers; CI must have them, never skip them.
    let s3s = install_s3s()?;
    let (moto, took) = moto_job
        .join()
        .map_err(|_| "the moto install thread panicked".to_string())??;
    println!(
        "<== moto installed beside clippy in {:.1}s (log: {})",
        took.as_secs_f64(),
        moto_log.display()
    );

    let mut test = cargo();
    test.args(["test", "--workspace"])
        .env("HICACHE_REQUIRE_S3", "1")
        .env("HICACHE_MOTO_SERVER", &moto)
        .env("HICACHE_S3S_FS", &s3s);
    let mut totals = counted_step("cargo test --workspace", test)?;

    // The vendor example's own `hicache` command (CLI as a library) needs its `cli` feature,
    // which `--workspace` leaves off.
    let mut vendor_lint = cargo();
    vendor_lint.args([
        "clippy",
        "-p",
        "hicache-example-kvdir",
        "--features",
        "cli",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    step(
        "cargo clippy -p hicache-example-kvdir --features cli",
        vendor_lint,
    )?;
    let mut vendor = cargo();
    vendor.args([
        "test",
        "-p",
        "hicache-example-kvdir",
        "--features",
        "cli",
        "--test",
        "cli",
    ]);
    let t = counted_step(
        "cargo test -p hicache-example-kvdir --features cli --test cli (a vendor's hicache command)",
        vendor,
    )?;
    totals.passed += t.passed;
    totals.failed += t.failed;
    totals.ignored += t.ignored;

    let mut sdk_lint = cargo();
    sdk_lint.args([
        "clippy",
        "-p",
        "hicache-obj",
        "--features",
        "aws-sdk",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    step("cargo clippy -p hicache-obj --features aws-sdk", sdk_lint)?;

    let mut sdk = cargo();
    sdk.args([
        "test",
        "-p",
        "hicache-obj",
        "--features",
        "aws-sdk",
        "--test",
        "conformance",
        "--test",
        "config",
        "--",
        "aws_sdk",
    ])
    // The second client runs every backend, fault, cancellation and model case, and the
    // connector cases that shape its calls differently (bounce slots, SGLang's _k/_v objects,
    // raw pages, removal, concurrency). The connector cases skipped here test hicache-core's
    // logic over the same calls (layouts, existence semantics, namespaces, corruption); they
    // run on the object_store client in `cargo test --workspace`.
    .args(AWS_SDK_SKIPPED.iter().flat_map(|s| ["--skip", s]))
    .env("HICACHE_REQUIRE_S3", "1")
    .env("HICACHE_MOTO_SERVER", &moto)
    .env("HICACHE_S3S_FS", &s3s)
    // The second client shares the plugin's cancellation path (writes in owned tasks) and
    // the connector's concurrency path, which the object_store variants run at full length
    // in `cargo test --workspace`; here they run shorter to keep CI within its budget.
    .env("HICACHE_TEST_CANCEL_OPS", "250")
    .env("HICACHE_TEST_CONCURRENCY_OPS", "3000");
    let t = counted_step("OBJ conformance through the aws-sdk client", sdk)?;
    totals.passed += t.passed;
    totals.failed += t.failed;
    totals.ignored += t.ignored;
    totals.breadth.merge(t.breadth);

    let mut obj = cargo();
    obj.args([
        "test",
        "-p",
        "hicache",
        "--features",
        "obj,gds,3fs",
        "--lib",
    ]);
    let t = counted_step(
        "cargo test -p hicache --features obj,gds,3fs (OBJ, GDS, GDS_MT and 3FS registered by the facade; CONFIG.md)",
        obj,
    )?;
    totals.passed += t.passed;
    totals.failed += t.failed;
    totals.ignored += t.ignored;
    totals.breadth.merge(t.breadth);

    // `hicache plugins` in a build with GDS and 3FS: each listed with its verdict.
    let mut gds_lint = cargo();
    gds_lint.args([
        "clippy",
        "-p",
        "hicache-cli",
        "--features",
        "gds,3fs",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    step("cargo clippy -p hicache-cli --features gds,3fs", gds_lint)?;
    let mut gds_cli = cargo();
    gds_cli.args([
        "test",
        "-p",
        "hicache-cli",
        "--features",
        "gds,3fs",
        "--test",
        "cli",
        "--",
        "gds::",
        "threefs::",
    ]);
    let t = counted_step(
        "cargo test -p hicache-cli --features gds,3fs --test cli gds:: threefs:: (GDS, GDS_MT and 3FS in `hicache plugins`)",
        gds_cli,
    )?;
    totals.passed += t.passed;
    totals.failed += t.failed;
    totals.ignored += t.ignored;

    // The facade's examples are what an engine author copies: they must build and run.
    for (example, feature) in [
        ("engine", None),
        ("blocking_threads", None),
        ("obj_memory", Some("obj")),
    ] {
        let mut run = cargo();
        run.args(["run", "-p", "hicache", "--example", example]);
        if let Some(f) = feature {
            run.args(["--features", f]);
        }
        step(&format!("cargo run -p hicache --example {example}"), run)?;
    }
    // The capacity soak, short and at a rate a debug build sustains; `cargo xtask soak` runs
    // it for 10 minutes in a release build.
    let mut soak = cargo();
    soak.args([
        "run",
        "-p",
        "hicache",
        "--example",
        "soak",
        "--",
        "--seconds",
        "20",
        "--write-mib-s",
        "64",
    ]);
    step("cargo run -p hicache --example soak (20 s)", soak)?;

    // SGLang loads hicache through the Python package: its wheel must build and pass.
    python::python(&[])?;

    // Keeps the benchmark working; its numbers are not judged here.
    println!("==> cargo xtask bench --tiny");
    let started_bench = Instant::now();
    bench::bench(&["--tiny".to_string()])?;
    println!(
        "<== cargo xtask bench --tiny: {:.1}s",
        started_bench.elapsed().as_secs_f64()
    );

    // The fuzz targets must build and survive a short run from the kept corpus; longer
    // runs are `cargo xtask fuzz`.
    fuzz::fuzz(&["--seconds".to_string(), FUZZ_SECONDS_IN_CI.to_string()])?;

    println!(
        "ci: all steps passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "{} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    print!(
        "of which conformance trials, per plugin:\n{}",
        totals.breadth.report()
    );
    Ok(())
}

/// Connector cases the aws-sdk client skips in `cargo xtask ci` (name prefixes): core logic
/// that the object_store client already runs over the same plugin calls.
const AWS_SDK_SKIPPED: &[&str] = &[
    "connector_round_trip_m",
    "connector_aligned_pool",
    "connector_anchor_pool",
    "connector_exists_",
    "connector_misses_are",
    "connector_empty_set",
    "connector_ragged",
    "connector_mla_",
    "connector_mha_",
    "connector_other_",
    "connector_pp_",
    "connector_batches_above",
    "connector_io_before",
    "connector_set_twice",
    "connector_bit_flip",
    "connector_truncated",
    "connector_misplaced",
    "connector_foreign",
    "connector_garbage",
    "connector_reregister",
    "connector_small_staging",
];

/// Seconds per fuzz target in `cargo xtask ci`.
const FUZZ_SECONDS_IN_CI: u64 = 30;

/// The tests Miri runs: core's unsafe code (pins, aligned buffers, pool copies, envelope)
/// and what it rests on, without syscalls Miri cannot emulate.
const MIRI_FILTERS: &[&str] = &["memory::", "envelope::", "pool::", "key::", "routing::"];

/// Nightly cargo through rustup (`$CARGO` is the stable binary itself, which ignores
/// `+nightly`).
pub(crate) fn nightly_cargo() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo"]).current_dir(root());
    // The stable toolchain's variables would leak into the nightly build.
    for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
        cmd.env_remove(var);
    }
    cmd
}

/// Miri over core's unsafe code, and AddressSanitizer over the POSIX engines.
fn sanitize() -> Result<(), String> {
    let mut add = Command::new("rustup");
    add.args([
        "component",
        "add",
        "--toolchain",
        "nightly",
        "miri",
        "rust-src",
    ]);
    step(
        "rustup component add --toolchain nightly miri rust-src",
        add,
    )?;

    let mut miri = nightly_cargo();
    miri.args(["miri", "test", "-p", "hicache-core", "--lib", "--"])
        .args(MIRI_FILTERS);
    step(
        "cargo +nightly miri test -p hicache-core --lib (memory, pool, envelope, keys)",
        miri,
    )?;

    // A separate target dir: instrumented builds must not evict the normal ones. The
    // conformance run keeps to one variant per engine (ext4, direct I/O) and fewer random
    // operations, so the step stays within minutes.
    let mut asan = nightly_cargo();
    asan.args([
        "test",
        "-p",
        "hicache-posix",
        // The C plugin ABI's host side: pins, in-flight batches and completions, against
        // the example plugins (the C one is built without the sanitizer).
        "-p",
        "hicache-abi",
        "--target",
        "x86_64-unknown-linux-gnu",
    ])
    // The instrumented Rust example plugins look up the sanitizer's runtime in the test
    // executable when they are loaded, so the executables export their symbols.
    .env(
        "RUSTFLAGS",
        "-Zsanitizer=address -Clink-arg=-Wl,--export-dynamic",
    )
    .env("RUSTDOCFLAGS", "-Zsanitizer=address")
    .env("CARGO_TARGET_DIR", root().join("target").join("asan"))
    .env("ASAN_OPTIONS", "detect_leaks=0")
    .env("HICACHE_TEST_CANCEL_OPS", "300")
    .env("HICACHE_TEST_CONCURRENCY_OPS", "3000");
    step(
        "cargo +nightly test -p hicache-posix -p hicache-abi under AddressSanitizer",
        asan,
    )
}

/// Installs (once) the S3 servers the OBJ tests run against; returns their binaries.
/// Fails loudly when an install is impossible.
fn s3_servers() -> Result<(PathBuf, PathBuf), String> {
    let moto = install_moto(None)?;
    let s3s = install_s3s()?;
    Ok((moto, s3s))
}

/// moto in `target/s3-venv`. With `log`, the steps write there instead of the terminal (CI
/// installs it on a thread while clippy runs: pip mostly waits on the network).
fn install_moto(log: Option<&Path>) -> Result<PathBuf, String> {
    let venv = root().join("target").join("s3-venv");
    let moto = venv.join("bin").join("moto_server");
    if !moto.is_file() {
        let mut mk = Command::new("python3");
        mk.args(["-m", "venv"]).arg(&venv);
        let mut pip = Command::new(venv.join("bin").join("pip"));
        pip.args(["install", "-q", "moto[server]==5.*"]);
        for (name, cmd) in [
            ("python3 -m venv target/s3-venv", mk),
            ("pip install moto[server] (S3 test server)", pip),
        ] {
            match log {
                None => step(name, cmd)?,
                Some(log) => logged_step(name, cmd, log)?,
            }
        }
    }
    installed(moto)
}

/// s3s-fs in `target/s3s`, built at opt-level 1: a test server needs correct answers, not
/// LLVM's slowest passes, and its build is on CI's critical path.
fn install_s3s() -> Result<PathBuf, String> {
    let prefix = root().join("target").join("s3s");
    let s3s = prefix.join("bin").join("s3s-fs");
    if !s3s.is_file() {
        let mut install = cargo();
        install
            .args([
                "install",
                "s3s-fs",
                "--version",
                "0.14.1",
                "--features",
                "binary",
                "--root",
            ])
            .arg(&prefix)
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1");
        step("cargo install s3s-fs 0.14.1 (S3 test server)", install)?;
    }
    installed(s3s)
}

fn installed(bin: PathBuf) -> Result<PathBuf, String> {
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} is missing after installation", bin.display()))
    }
}

/// Runs one step with its output appended to `log`; a failure quotes the log's end.
fn logged_step(name: &str, mut cmd: Command, log: &Path) -> Result<(), String> {
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))
    };
    let status = cmd
        .stdout(open()?)
        .stderr(open()?)
        .status()
        .map_err(|e| format!("{name}: cannot start: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(30).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!(
        "{name} failed ({status}); end of {}:\n{}",
        log.display(),
        tail.join("\n")
    ))
}

#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
    breadth: breadth::Breadth,
}

impl Totals {
    /// Adds the counts of one libtest summary line (`test result: ok. 3 passed; 0 failed; …`).
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result:") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match label {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Like [`step`], echoing the output and adding up libtest's summary lines.
fn counted_step(name: &str, mut cmd: Command) -> Result<Totals, String> {
    use std::io::{BufRead, BufReader};
    println!("==> {name}");
    let started = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{name}: cannot start: {e}"))?;
    let mut totals = Totals::default();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            totals.add_line(&line);
            totals.breadth.add_line(&line);
        }
    }
    let status = child.wait().map_err(|e| format!("{name}: {e}"))?;
    println!("<== {name}: {:.1}s", started.elapsed().as_secs_f64());
    if !status.success() {
        return Err(format!("step `{name}` failed ({status})"));
    }
    if totals.passed == 0 {
        return Err(format!("step `{name}` ran no test"));
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_libtest_summaries() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 45 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.02s");
        t.add_line(
            "test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 3 tests");
        assert_eq!((t.passed, t.failed, t.ignored), (46, 3, 2));
    }
}
