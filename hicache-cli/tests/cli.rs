//! The `hicache` binary as a shell user runs it.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

fn hicache() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hicache"));
    cmd.env_remove("HICACHE_CONFIG")
        .env_remove("HICACHE_STORAGE_DIR")
        .env_remove("HICACHE_BACKEND_PLUGIN");
    cmd
}

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

/// `--json FILE` is honoured by every command and checked before any work.
#[test]
fn json_files_are_written_and_checked_first() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["config", "show"][..], &["plugins"][..]] {
        let file = dir.path().join(format!("{}.json", args[0]));
        let out = hicache()
            .args(args)
            .arg("--json")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert!(value.is_object(), "{args:?}");
    }
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

/// The `storage_dir` value `config show --json` printed, as JSON text.
fn shown_storage_dir(stdout: &[u8]) -> String {
    let value: serde_json::Value = serde_json::from_slice(stdout).unwrap();
    value["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "storage_dir")
        .map(|e| e["value"].to_string())
        .unwrap()
}

/// `--dir` values are taken verbatim: a comma is part of the name, not a separator.
#[test]
fn dir_flags_are_taken_verbatim() {
    let tmp = tempfile::tempdir().unwrap();
    let odd = tmp.path().join("a,b");
    let other = tmp.path().join("c");
    let out = hicache()
        .args(["config", "show", "--json", "--dir"])
        .arg(&odd)
        .arg("--dir")
        .arg(&other)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dirs = shown_storage_dir(&out.stdout);
    let want =
        serde_json::to_string(&[odd.display().to_string(), other.display().to_string()]).unwrap();
    assert_eq!(dirs, serde_json::Value::String(want).to_string());
    // SGLang's comma form stays for the environment and config strings.
    let out = hicache()
        .args(["config", "show", "--json"])
        .env(
            "HICACHE_STORAGE_DIR",
            format!("{},{}", odd.display(), other.display()),
        )
        .output()
        .unwrap();
    let dirs = shown_storage_dir(&out.stdout);
    // Three dirs: ".../a", "b" and ".../c".
    let want = format!("{}/a,b,{}", tmp.path().display(), other.display());
    assert_eq!(dirs, serde_json::Value::String(want).to_string());
}

/// `config show` names a value's source as the user wrote it: the flag, not "api".
#[test]
fn flags_are_shown_as_their_source() {
    let tmp = tempfile::tempdir().unwrap();
    let out = hicache()
        .args(["config", "show", "--direct-io", "off", "--dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = |key: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .to_string()
    };
    assert!(line("storage_dir").contains("flag --dir"), "{text}");
    assert!(line("use_direct_io").contains("flag --direct-io"), "{text}");
    assert!(!text.contains("api"), "{text}");
}

/// Flags that cannot apply, and numbers that make no sense, are errors naming the flag —
/// before any work.
#[test]
fn inapplicable_flags_and_bad_numbers_are_errors() {
    let storage = tempfile::tempdir().unwrap();
    for (args, flag) in [
        (&["bench", "--page-bytes", "65536"][..], "--page-bytes"),
        (
            &["bench", "--model", "custom", "--page-tokens", "4"][..],
            "--page-tokens",
        ),
        (&["bench", "--batch", "0"][..], "--batch"),
        (&["bench", "--threads", "0"][..], "--threads"),
        (&["bench", "--rounds", "0"][..], "--rounds"),
        (&["bench", "--pages", "0"][..], "--pages"),
        (&["bench", "--page-tokens", "0"][..], "page_tokens"),
        (&["bench", "--batch=-1"][..], "--batch"),
        (
            &["bench", "--pages", "99999999999999999999999"][..],
            "--pages",
        ),
        (
            &["bench", "--model", "custom", "--page-bytes", "1000"][..],
            "page-bytes",
        ),
        (&["doctor", "--page-bytes", "65536"][..], "--page-bytes"),
        // Sizes that overflow, or that no machine has.
        (&["bench", "--pages", "18446744073709551615"][..], "--pages"),
        (&["bench", "--pages", "100000000000"][..], "--pages"),
        (
            &["bench", "--page-tokens", "18446744073709551615"][..],
            "page_tokens",
        ),
        (
            &[
                "bench",
                "--model",
                "custom",
                "--page-bytes",
                "18446744073709551615",
            ][..],
            "page-bytes",
        ),
        (&["scrub", "--temp-age-s=-1"][..], "--temp-age-s"),
        // Ratios and sizes that are not finite numbers above zero.
        (&["doctor", "--ratio", "nan"][..], "--ratio"),
        (&["doctor", "--ratio", "inf"][..], "--ratio"),
        (&["doctor", "--ratio", "0"][..], "--ratio"),
        (&["doctor", "--ratio=-1"][..], "--ratio"),
        (&["doctor", "--device-kv-gib", "0"][..], "--device-kv-gib"),
        (&["doctor", "--host-gib", "1e300"][..], "--host-gib"),
        (&["doctor", "--host-gib=-inf"][..], "--host-gib"),
        // Names outside a flag's choices: the error lists the choices.
        (
            &["bench", "--ops", "write,bogus"][..],
            "possible values: write, read, exists",
        ),
        (
            &["bench", "--layout", "page-first"][..],
            "page_first_direct",
        ),
        (&["bench", "--model", "llama"][..], "llama3-8b"),
        (&["bench", "--baseline", "nixl"][..], "--baseline"),
        (
            &["plugins", "--direct-io", "maybe"][..],
            "possible values: on, off",
        ),
    ] {
        let out = hicache()
            .args(args)
            .arg("--dir")
            .arg(storage.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read_dir(storage.path()).unwrap().count(), 0);
}

/// Counts far above what a run can use are clamped (streams to calls, threads to pages),
/// not obeyed to the point of exhausting threads or memory.
#[test]
fn huge_concurrency_is_clamped() {
    let storage = tempfile::tempdir().unwrap();
    for args in [
        &["bench", "--threads", "18446744073709551615"][..],
        &["bench", "--batch", "18446744073709551615"][..],
        &["bench", "--baseline", "raw", "--threads", "1000000"][..],
    ] {
        let out = hicache()
            .args(args)
            .args(["--pages", "4", "--rounds", "1", "--model", "custom"])
            .args(["--page-bytes", "65536", "--dir"])
            .arg(storage.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
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

/// `config show` flags plugin parameters the plugin would refuse, as bench and doctor do.
#[test]
fn config_show_flags_unknown_plugin_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("c.toml");
    let show = |section: &str| {
        std::fs::write(&file, format!("[plugin.posix]\nactive = true\n{section}\n")).unwrap();
        hicache()
            .args(["config", "show", "--config"])
            .arg(&file)
            .output()
            .unwrap()
    };
    let out = show("engin = \"threads\"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("engin") && err.contains("engine"), "{err}");
    let out = show("engine = \"threads\"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this machine lets an unprivileged user make user + PID namespaces.
fn namespaces_available() -> bool {
    Command::new("unshare")
        .args(["--user", "--map-root-user", "--pid", "--fork", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `hicache ARGS` in a new user + PID namespace, as in a container: PID 1 there, or PID 2
/// under a shell with `under_shell`.
fn in_own_pid_namespace(args: &[&str], under_shell: bool) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--pid", "--fork", "--"]);
    if under_shell {
        // The shell (PID 1) forks hicache (PID 2) and waits for it.
        cmd.args(["sh", "-c", "\"$0\" \"$@\"; exit $?"]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_hicache"))
        .args(args)
        .env_remove("HICACHE_CONFIG")
        .env_remove("HICACHE_STORAGE_DIR")
        .env_remove("HICACHE_BACKEND_PLUGIN");
    cmd
}

fn failed_pages(json: &serde_json::Value) -> u64 {
    ["write_rounds", "read_rounds"]
        .iter()
        .flat_map(|k| json[*k].as_array().cloned().unwrap_or_default())
        .map(|r| r["failed_pages"].as_u64().unwrap())
        .sum()
}

/// Two writers in separate PID namespaces share one root; the second starts while the first
/// writes, and doctor looks from a third. The first writer is PID 2 in its namespace, a PID
/// that does not exist in the second's (where hicache is PID 1): a liveness test by PID would
/// call the first writer dead there and remove its spare dir. Its lock keeps the dir, and no
/// write of either writer fails.
#[test]
fn writers_in_separate_pid_namespaces_share_a_root() {
    if !namespaces_available() {
        // CI machines allow it: there the test must run, never skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "unshare --user --pid is refused on this CI machine"
        );
        eprintln!(
            "SKIPPED writers_in_separate_pid_namespaces_share_a_root: unshare --user --pid is refused here"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let root_s = root.to_str().unwrap();
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let bench = |rounds: &str, json: &str, under_shell: bool| {
        in_own_pid_namespace(
            &[
                "bench",
                "--plugin",
                "posix",
                "--dir",
                root_s,
                "--model",
                "custom",
                "--page-bytes",
                "65536",
                "--pages",
                "256",
                "--rounds",
                rounds,
                "--json",
                json,
            ],
            under_shell,
        )
    };
    let (a_json, b_json) = (out("a.json"), out("b.json"));
    // About 20 s alone: long enough to outlast the second writer and doctor.
    let mut a = bench("50", &a_json, true)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first writer has its spare dir (built, locked and renamed into place).
    let spare = root.join(".hicache-spare");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let a_dir = loop {
        let found = std::fs::read_dir(&spare).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| !n.starts_with(".new-"))
        });
        if let Some(n) = found {
            break n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first writer never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(a_dir.contains("-2-"), "PID 2 in its namespace: {a_dir}");
    let b = bench("3", &b_json, false).output().unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    assert_eq!(
        a.try_wait().unwrap(),
        None,
        "the first writer must still run for this test to prove anything"
    );
    assert!(
        spare.join(&a_dir).is_dir(),
        "the second writer removed a live writer's dir"
    );
    let doctor = in_own_pid_namespace(
        &["doctor", "--plugin", "posix", "--dir", root_s, "--json"],
        false,
    )
    .output()
    .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        report.contains("spare dirs: 1 of running processes"),
        "{report}"
    );
    let status = a.wait().unwrap();
    let mut stderr = String::new();
    a.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{stderr}");
    for json in [&a_json, &b_json] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert_eq!(failed_pages(&v), 0, "{json}: {v}");
        assert_eq!(v["verified"], true, "{json}");
    }
    assert_eq!(
        std::fs::read_dir(&spare).unwrap().count(),
        0,
        "each writer removes its own spare dir"
    );
}

/// `config keys` lists every key of the build's reference, needs no valid config, and its
/// Markdown is the generated reference.
#[test]
fn config_keys_lists_the_reference_even_when_the_config_is_broken() {
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("broken.toml");
    std::fs::write(&broken, "storge_dir = \"/x\"\n").unwrap();
    let out = hicache()
        .args(["config", "keys", "--json", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<&str> = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    let reference = hicache::reference();
    assert_eq!(listed.len(), reference.len());
    for k in &reference {
        assert!(listed.contains(&k.key.as_str()), "{} missing", k.key);
    }
    assert!(listed.contains(&"storage_dir") && listed.contains(&"plugin.posix.engine"));

    let human = hicache().args(["config", "keys"]).output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    for k in &reference {
        assert!(text.contains(&k.key), "{} missing from\n{text}", k.key);
    }
    assert!(
        text.contains("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR (SGLang)"),
        "{text}"
    );

    let md = hicache()
        .args(["config", "keys", "--markdown"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&md.stdout),
        hicache::config_keys_markdown(&reference)
    );

    // The same broken config stops every other command at load, naming the key once.
    let out = hicache()
        .args(["config", "show", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("did you mean `storage_dir`"), "{err}");
    assert_eq!(err.matches("storge_dir").count(), 1, "{err}");
}

/// `config keys` refuses flags that cannot apply together and a JSON file it cannot write,
/// with an error and a non-zero exit, and writes nothing to stdout then.
#[test]
fn config_keys_refuses_hostile_flags() {
    let both = hicache()
        .args(["config", "keys", "--markdown", "--json"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(
        err.contains("--markdown") && err.contains("--json"),
        "{err}"
    );
    assert!(both.stdout.is_empty());

    let unwritable = hicache()
        .args(["config", "keys", "--json", "/nonexistent-dir/keys.json"])
        .output()
        .unwrap();
    assert!(!unwritable.status.success());
    let err = String::from_utf8_lossy(&unwritable.stderr);
    assert!(err.contains("/nonexistent-dir/keys.json"), "{err}");
    assert!(unwritable.stdout.is_empty());

    let unknown = hicache()
        .args(["config", "keys", "--markdwn"])
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--markdown"));
}

/// A probe's facts are typed: `plugins --json` gives sizes as numbers of bytes and flags as
/// booleans, each with its kind; the text form shows sizes with units.
#[test]
fn plugin_facts_are_typed_in_json_and_human_in_text() {
    let storage = tempfile::tempdir().unwrap();
    let out = hicache()
        .args(["plugins", "--plugin", "posix", "--json", "--dir"])
        .arg(storage.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
    let out = hicache()
        .args([
            "bench", "--pages", "64", "--rounds", "1", "--ops", "write", "--keep",
        ])
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
    let out = hicache()
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
        .arg(storage.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for phase in ["write_rounds", "read_rounds"] {
        for round in report[phase].as_array().unwrap() {
            let per_page = round["allocations_per_page"].as_f64();
            assert!(per_page.is_some_and(|a| a > 0.0), "{phase}: {round}");
        }
    }
    let pool = report["pool_bytes"].as_u64().unwrap();
    let rss = report["peak_rss_bytes"].as_u64().unwrap();
    assert!(pool > 0 && rss >= pool, "pool {pool}, peak RSS {rss}");
}
