//! `hicache::registry()` reads `HICACHE_PLUGIN_DIR` from the process environment. Each case
//! runs this test binary again as a child with the variable set, so no test changes the
//! environment of a process whose other threads may read it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Command;

/// Set in the child: the name of the case to run there.
const CHILD: &str = "HICACHE_TEST_REGISTRY_CASE";

/// Runs `case` in a child of this binary with `HICACHE_PLUGIN_DIR` set to `value`; in that
/// child, runs `check`.
fn in_child(case: &str, value: OsString, check: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some_and(|c| c == case) {
        check();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([case, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .env("HICACHE_PLUGIN_DIR", value)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child case {case} failed:\n{text}");
    // The child ran the case (a filter that matched nothing would also succeed).
    assert!(
        text.contains("1 passed"),
        "child case {case} did not run:\n{text}"
    );
}

fn names(plugins: &[&hicache::raw::PluginDescriptor]) -> Vec<&'static str> {
    plugins.iter().map(|p| p.name).collect()
}

#[test]
fn a_plugin_dir_that_is_not_utf8_is_a_typed_error() {
    in_child(
        "a_plugin_dir_that_is_not_utf8_is_a_typed_error",
        OsString::from_vec(b"/opt/plugins-\xff".to_vec()),
        || {
            let err = hicache::registry().expect_err("a non-UTF-8 plugin dir was accepted");
            let text = err.to_string();
            assert!(
                matches!(err, hicache::Error::InvalidConfig { .. }),
                "not a config error: {err:?}"
            );
            assert!(text.contains("HICACHE_PLUGIN_DIR"), "{text}");
            assert!(text.contains("UTF-8"), "{text}");
        },
    );
}

#[test]
fn an_empty_plugin_dir_list_gives_the_builtin_plugins() {
    in_child(
        "an_empty_plugin_dir_list_gives_the_builtin_plugins",
        OsString::from(" , ,"),
        || {
            let registry = hicache::registry().unwrap();
            assert!(registry.rejected().is_empty(), "{:?}", registry.rejected());
            assert_eq!(
                names(registry.plugins()),
                names(&hicache::builtin_plugins())
            );
        },
    );
}

/// A missing dir is one rejected entry (with or without the `dynamic` feature, which loads
/// the dirs); the built-in plugins are still there.
#[test]
fn a_missing_plugin_dir_is_reported_not_fatal() {
    in_child(
        "a_missing_plugin_dir_is_reported_not_fatal",
        OsString::from("/nonexistent-hicache-plugin-dir"),
        || {
            let registry = hicache::registry().unwrap();
            let rejected = format!("{:?}", registry.rejected());
            assert!(
                rejected.contains("nonexistent-hicache-plugin-dir"),
                "{rejected}"
            );
            assert_eq!(registry.rejected().len(), 1, "{rejected}");
            assert_eq!(
                names(registry.plugins()),
                names(&hicache::builtin_plugins())
            );
        },
    );
}
