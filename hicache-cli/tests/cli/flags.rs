//! Flags and environment variables as the user wrote them: taken verbatim, shown as their
//! source, refused when they do not apply or do not parse, clamped when huge.

use crate::{hicache, success};

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
    let out = success(
        hicache()
            .args(["config", "show", "--json", "--dir"])
            .arg(&odd)
            .arg("--dir")
            .arg(&other),
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
        (
            &["bench", "--shared-pool", "--baseline", "raw"][..],
            "--shared-pool",
        ),
        (&["bench", "--pages", "0"][..], "--pages"),
        (&["bench", "--page-tokens", "0"][..], "page_tokens"),
        (&["bench", "--batch=-1"][..], "--batch"),
        (
            &["bench", "--pages", "99999999999999999999999"][..],
            "--pages",
        ),
        (
            &["bench", "--model", "custom", "--page-bytes", "1000"][..],
            "--page-bytes",
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
            "--page-bytes",
        ),
        (&["scrub", "--temp-age-s=-1"][..], "--temp-age-s"),
        // A prefix only narrows a listing walk; a file walk would ignore it silently.
        (&["scrub", "--prefix", "a"][..], "--listing"),
        (&["usage", "--prefix"][..], "--prefix"),
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
        &["bench", "--baseline", "raw-publish", "--threads", "1000000"][..],
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

/// `usage` and a listing `scrub` open the plugin the config names: an unknown one is an
/// error naming it, never a panic; the stock POSIX dirs are counted through the listing.
#[test]
fn usage_and_listing_scrub_open_the_configured_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    for cmd in [&["usage"][..], &["scrub", "--listing"][..]] {
        let out = hicache()
            .args(cmd)
            .args(["--plugin", "bogus", "--dir"])
            .arg(tmp.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd:?}: {err}");
        assert!(
            err.contains("BOGUS") && !err.contains("panicked"),
            "{cmd:?}: {err}"
        );
    }
    let out = success(hicache().args(["usage", "--json", "--dir"]).arg(tmp.path()));
    let usage: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(usage["plugin"], "POSIX", "{usage}");
    assert_eq!(usage["total"]["objects"], 0, "{usage}");
    assert!(usage["capacity"]["total_bytes"].is_u64(), "{usage}");
}

/// An environment value that is not UTF-8 never panics a command: in a variable hicache does
/// not read it is ignored; in one it reads it is an error naming the variable.
#[test]
fn environment_values_that_are_not_utf8_never_panic() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"/tmp/\xff\xfe");
    let dir = tempfile::tempdir().unwrap();
    success(
        hicache()
            .args(["config", "show", "--dir"])
            .arg(dir.path())
            .env("SOME_OTHER_TOOL", bad),
    );
    for var in [
        "HICACHE_NAMING",
        "HICACHE_STORAGE_DIR",
        "HICACHE_PLUGIN_DIR",
        "HICACHE_CONFIG",
    ] {
        for args in [&["config", "show"][..], &["plugins"][..]] {
            let out = hicache().args(args).env(var, bad).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{var} {args:?}: {err}");
            assert!(
                err.contains(var) && err.contains("UTF-8") && !err.contains("panicked"),
                "{var} {args:?}: {err}"
            );
        }
    }
}

/// A `HICACHE_LOG` that is not a log filter (or not UTF-8) is said on stderr, and the command
/// runs with warnings only; a filter is taken.
#[test]
fn a_bad_log_filter_is_said_not_ignored() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let run = |value: &std::ffi::OsStr| {
        let out = success(
            hicache()
                .args(["config", "show", "--dir"])
                .arg(dir.path())
                .env("HICACHE_LOG", value),
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for bad in [&b"[[["[..], b"x=y=z", b"\xff"] {
        let err = run(std::ffi::OsStr::from_bytes(bad));
        assert!(
            err.contains("warning: HICACHE_LOG") && err.contains("logging warnings only"),
            "{bad:?}: {err}"
        );
    }
    for good in ["debug", "hicache_posix=debug,warn", ""] {
        let err = run(good.as_ref());
        assert!(!err.contains("HICACHE_LOG"), "{good}: {err}");
    }
}
