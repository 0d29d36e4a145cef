//! What the commands print and write: closed pipes, verdicts, JSON files, progress on a
//! terminal only, typed facts, the bench's memory figures, and nothing created by listing.

use crate::{hicache, json_output, success};
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

/// `hicache config show | true`: the reader is gone before the first write; hicache ends quietly (killed by
/// SIGPIPE like any Unix tool), never with a panic.
#[test]
fn a_closed_pipe_ends_quietly() {
    for args in [
        &["config", "show"][..],
        &["plugins"][..],
        &["config", "show", "--json"][..],
    ] {
        let mut child = hicache()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before hicache writes a byte: its first write meets a broken pipe.
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            status.success() || status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {status:?} {err}"
        );
    }
}

/// A plugin that does not exist, or cannot work here, makes `plugins` fail.
#[test]
fn plugins_fails_for_an_unknown_or_unusable_plugin() {
    let out = hicache()
        .args(["plugins", "--plugin", "posixx"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let lower = err.to_lowercase();
    assert!(
        lower.contains("unknown plugin `posixx`") && lower.contains("did you mean `posix`"),
        "{err}"
    );
    // A plugin of hicache's own that this build lacks names the feature that provides it.
    if !cfg!(feature = "obj") {
        let out = hicache()
            .args(["plugins", "--plugin", "obj"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("enable the `obj` feature"), "{err}");
    }

    // A storage dir below a regular file cannot exist: POSIX is unusable there.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = hicache()
        .args(["plugins", "--plugin", "posix", "--dir"])
        .arg(file.join("storage"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("unusable"), "{text}");
}

/// `--json FILE` is honoured by every command and checked before any work; `--json -` is
/// stdout.
#[test]
fn json_files_are_written_and_checked_first() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["config", "show"][..], &["plugins"][..]] {
        let file = dir.path().join(format!("{}.json", args[0]));
        success(hicache().args(args).arg("--json").arg(&file));
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert!(value.is_object(), "{args:?}");
    }
    // `-` is stdout, not a file named `-` in the working dir.
    for args in [&["config", "show"][..], &["plugins"][..]] {
        let out = success(
            hicache()
                .current_dir(dir.path())
                .args(args)
                .args(["--json", "-"]),
        );
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(value.is_object(), "{args:?}");
        assert!(
            !dir.path().join("-").exists(),
            "{args:?} wrote a file named -"
        );
    }
    success(
        hicache()
            .current_dir(dir.path())
            .args(["config", "show", "--json", "./-"]),
    );
    let named: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("-")).unwrap()).unwrap();
    assert!(named.is_object(), "./- is a file named -");
    let unwritable = dir.path().join("no-such-dir").join("out.json");
    let storage = tempfile::tempdir().unwrap();
    let out = hicache()
        .args(["bench", "--rounds", "50", "--dir"])
        .arg(storage.path())
        .arg("--json")
        .arg(&unwritable)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--json") && err.contains("no-such-dir"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(storage.path()).unwrap().count(),
        0,
        "the benchmark ran before the --json path was checked"
    );
}

/// Listing commands create nothing: a storage dir that does not exist yet is judged by
/// where it would be created, and stays missing.
#[test]
fn listing_commands_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("not").join("yet");
    for args in [&["plugins"][..], &["config", "show"][..]] {
        let out = hicache()
            .args(args)
            .args(["--plugin", "posix", "--dir"])
            .arg(&missing)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {text}");
        if args[0] == "plugins" {
            assert!(text.contains("does not exist yet"), "{text}");
        }
        assert!(!tmp.path().join("not").exists(), "{args:?} created a dir");
    }
}

/// A probe's facts are typed: `plugins --json` gives sizes as numbers of bytes and flags as
/// booleans, each with its kind; the text form shows sizes with units.
#[test]
fn plugin_facts_are_typed_in_json_and_human_in_text() {
    let storage = tempfile::tempdir().unwrap();
    let json = json_output(
        hicache()
            .args(["plugins", "--plugin", "posix", "--json", "--dir"])
            .arg(storage.path()),
    );
    let posix = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "POSIX")
        .unwrap();
    let fact = |name: &str| {
        posix["facts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no fact {name}: {posix}"))
    };
    let free = fact("free");
    assert_eq!(free["kind"], "bytes", "{free}");
    assert!(free["value"].as_u64().unwrap() > 0, "{free}");
    assert_eq!(fact("direct I/O")["kind"], "flag");
    assert!(fact("direct I/O")["value"].is_boolean());
    assert_eq!(fact("engine")["kind"], "text");

    let out = hicache()
        .args(["plugins", "--plugin", "posix", "--dir"])
        .arg(storage.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("free ") && text.contains("iB"),
        "sizes are shown with units: {text}"
    );
}

/// Runs `hicache ARGS` with stderr on a pseudo-terminal (80 × 24) and stdout on a pipe;
/// returns what the terminal received.
fn on_a_terminal(args: &[&std::ffi::OsStr]) -> String {
    use std::io::Read;
    let size = nix::pty::Winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let mut child = hicache()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(pty.slave))
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    let mut seen = Vec::new();
    // Reading ends with EIO once the child's end is closed.
    let _ = master.read_to_end(&mut seen);
    assert!(child.wait().unwrap().success());
    String::from_utf8_lossy(&seen).into_owned()
}

/// `doctor` and `scrub` show progress on a terminal (doctor names the step it is in; scrub
/// counts bucket dirs), and nothing of it reaches a pipe.
#[test]
fn progress_is_drawn_on_a_terminal_and_never_into_a_pipe() {
    let storage = tempfile::tempdir().unwrap();
    let dir = storage.path().as_os_str();
    // Pages in a few bucket dirs, for scrub to walk.
    success(
        hicache()
            .args([
                "bench", "--pages", "64", "--rounds", "1", "--ops", "write", "--keep",
            ])
            .arg("--dir")
            .arg(dir),
    );
    let doctor = ["doctor", "--plugin", "posix", "--dir"].map(std::ffi::OsStr::new);
    let scrub = ["scrub", "--dir"].map(std::ffi::OsStr::new);
    // What only progress prints: doctor's step messages, scrub's count.
    let doctor_steps = [
        "doctor: checking",
        "doctor: probing",
        "doctor: opening",
        "doctor: round",
    ];
    for (args, drawn) in [
        (&doctor[..], &doctor_steps[..]),
        (&scrub[..], &["bucket dirs"][..]),
    ] {
        let mut args = args.to_vec();
        args.push(dir);
        let terminal = on_a_terminal(&args);
        assert!(
            drawn.iter().any(|d| terminal.contains(d)) && terminal.contains('\x1b'),
            "{args:?} on a terminal: {terminal:?}"
        );
        let piped = hicache().args(&args).output().unwrap();
        assert!(piped.status.success());
        for stream in [&piped.stdout, &piped.stderr] {
            let text = String::from_utf8_lossy(stream);
            assert!(
                !text.contains('\x1b')
                    && !text.contains('\r')
                    && !drawn.iter().any(|d| text.contains(d)),
                "{args:?} through a pipe: {text:?}"
            );
        }
    }
}

/// `hicache bench` counts heap allocations per page in each timed phase and reports the
/// peak resident memory beside the pool's size.
#[test]
fn bench_reports_allocations_per_page_and_peak_memory() {
    let storage = tempfile::tempdir().unwrap();
    let report = json_output(
        hicache()
            .args([
                "bench",
                "--pages",
                "64",
                "--rounds",
                "2",
                "--ops",
                "write,read",
                "--json",
            ])
            .arg("--dir")
            .arg(storage.path()),
    );
    for phase in ["write_rounds", "read_rounds"] {
        for round in report[phase].as_array().unwrap() {
            let per_page = round["allocations_per_page"].as_f64().unwrap();
            let per_call = round["allocations_per_call"].as_f64().unwrap();
            assert!(per_page > 0.0, "{phase}: {round}");
            // 64 pages in calls of 32 (the default batch): two calls.
            assert!(
                (per_call - per_page * 32.0).abs() < 1e-6,
                "{phase}: {round}"
            );
        }
    }
    let pool = report["pool_bytes"].as_u64().unwrap();
    let rss = report["peak_rss_bytes"].as_u64().unwrap();
    assert!(pool > 0 && rss >= pool, "pool {pool}, peak RSS {rss}");
    // What a page takes in storage: every object's envelope header on top of the page.
    let page = report["page_bytes"].as_u64().unwrap();
    let objects = report["objects_per_page"].as_u64().unwrap();
    let stored = report["stored_bytes_per_page"].as_u64().unwrap();
    assert!(objects >= 1, "{report}");
    assert!(
        stored >= page + objects * 4096,
        "page {page}, {objects} objects, {stored} stored"
    );
}

/// A config section for a plugin this program lacks is reported by `plugins` (the linking
/// trap: a plugin crate that is only a dependency), and `auto` still works.
#[test]
fn plugins_warns_about_a_section_for_a_plugin_not_registered() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[plugin.acme]\ndepth = 4\n[plugin.posix]\nactive = true\n",
    )
    .unwrap();
    let out = json_output(
        hicache()
            .args(["plugins", "--json", "--dir"])
            .arg(dir.path())
            .env("HICACHE_CONFIG", &config),
    );
    let warnings = out["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{out}");
    let w = warnings[0].as_str().unwrap();
    assert!(
        w.contains("[plugin.acme]") && w.contains("dropped by the linker"),
        "{w}"
    );
}
