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
