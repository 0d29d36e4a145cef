//! The vendor's `hicache` command lists KVDIR as built in, selects it by name, and runs a
//! doctor round trip through it, and walks its objects with `usage` and `scrub`.

use std::process::Command;

fn kvdir_hicache() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvdir-hicache"));
    for var in [
        "HICACHE_CONFIG",
        "HICACHE_STORAGE_DIR",
        "HICACHE_BACKEND_PLUGIN",
        "HICACHE_PLUGIN_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd.get_args().collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn plugins_lists_kvdir_beside_the_built_in_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let out = json(
        kvdir_hicache()
            .args(["plugins", "--json", "--dir"])
            .arg(dir.path()),
    );
    let rows = out["plugins"].as_array().unwrap();
    let kvdir = rows
        .iter()
        .find(|r| r["name"] == "KVDIR")
        .expect("KVDIR is listed");
    assert_eq!(kvdir["source"], "built-in");
    assert_eq!(kvdir["usable"], true, "{kvdir}");
    assert!(rows.iter().any(|r| r["name"] == "POSIX"), "{rows:?}");
}

#[test]
fn doctor_runs_a_round_trip_through_kvdir() {
    let dir = tempfile::tempdir().unwrap();
    let out = json(
        kvdir_hicache()
            .args(["doctor", "--json", "--plugin", "kvdir", "--dir"])
            .arg(dir.path()),
    );
    let text = out.to_string();
    assert!(text.contains("selected plugin KVDIR"), "{text}");
    let steps = out["steps"].as_array().unwrap();
    let round_trip = steps
        .iter()
        .find(|s| s["name"] == "round trip")
        .expect("a round trip step");
    assert_eq!(round_trip["status"], "pass", "{round_trip}");
    assert!(dir.path().join("kvdir").is_dir());
}

#[test]
fn usage_and_scrub_walk_kvdir_through_its_listing() {
    let dir = tempfile::tempdir().unwrap();
    let args = |cmd: &str| {
        let mut c = kvdir_hicache();
        c.args([cmd, "--json", "--plugin", "kvdir", "--dir"])
            .arg(dir.path());
        c
    };
    let empty = json(&mut args("usage"));
    assert_eq!(empty["plugin"], "KVDIR", "{empty}");
    assert_eq!(empty["total"]["objects"], 0, "{empty}");
    // The plugin made its bucket dirs on open (one root, 64 buckets: a name's hash modulo
    // 64). An object that is not a page, first in a bucket its name does not route to:
    // listed, but not where reads look, so scrub skips it.
    let home = hicache_core::raw::ObjectKey::new("notes").unwrap().hash() % 64;
    let kvdir = dir.path().join("kvdir");
    let stray = kvdir.join(format!("{:02x}/notes", (home + 1) % 64));
    std::fs::write(&stray, b"not a page").unwrap();
    let usage = json(&mut args("usage"));
    assert_eq!(usage["total"]["objects"], 1, "{usage}");
    assert_eq!(usage["total"]["bytes"], 10, "{usage}");
    let scrub = json(&mut args("scrub"));
    assert_eq!(
        (&scrub["files"], &scrub["skipped"]),
        (&0.into(), &1.into()),
        "{scrub}"
    );
    // Then where it belongs: read through the plugin and found not to be a page.
    std::fs::rename(&stray, kvdir.join(format!("{home:02x}/notes"))).unwrap();
    let scrub = json(&mut args("scrub"));
    assert_eq!(
        (&scrub["files"], &scrub["raw"]),
        (&1.into(), &1.into()),
        "{scrub}"
    );
}
