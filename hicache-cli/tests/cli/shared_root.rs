//! Writers in separate PID namespaces share one storage root.

use std::io::Read;
use std::process::{Command, Stdio};

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
    assert!(
        b.status.success(),
        "{} {}",
        String::from_utf8_lossy(&b.stderr),
        std::fs::read_to_string(&b_json).unwrap_or_default()
    );
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
