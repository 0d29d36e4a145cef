//! The capacity cleaner as the commands see it: no one-off command runs one, and `doctor`
//! tells whether one runs on each storage dir, in which process, and its last pass.

use super::{hicache, success};

/// `usage`, `scrub` and doctor's round trip open the plugin with the cleaner left on in the
/// config, yet none of them takes a dir's cleaner (none creates its lock file).
#[test]
fn one_off_commands_never_run_the_cleaner() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let out = tmp.path().join("doctor.json");
    for args in [
        &["usage", "--dir"][..],
        &["scrub", "--listing", "--dir"][..],
        &["doctor", "--plugin", "posix", "--json"][..],
    ] {
        let mut cmd = hicache();
        cmd.args(args);
        if args[0] == "doctor" {
            cmd.arg(&out).arg("--dir");
        }
        cmd.arg(&dir).env("HICACHE_CONFIG", "");
        let _ = cmd.output().unwrap();
        assert!(
            !dir.join(hicache::posix::CLEANER_FILE).exists(),
            "{args:?} took the dir's cleaner"
        );
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(report["steps"].is_array(), "{report}");
}

/// With this process holding the dir's cleaner, `doctor` names it and its last pass.
#[test]
fn doctor_tells_who_runs_the_cleaner() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let mut settings = hicache::Config::default().cleaner().unwrap();
    settings.interval = std::time::Duration::from_millis(50);
    let cfg = hicache::posix::PosixConfig {
        dirs: vec![dir.clone()],
        direct_io: false,
        engine: hicache::posix::EngineChoice::Threads,
        threads: 1,
        queue_depth: 64,
        sync: hicache::posix::SyncMode::None,
        spare_bytes: 0,
        cleaner: Some(settings),
        file_mode: 0o600,
        dir_mode: 0o700,
    };
    let backend = hicache::posix::PosixBackend::new(&cfg).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while backend.cleaner().unwrap()[0].last_pass.is_none() {
        assert!(std::time::Instant::now() < deadline, "no pass");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = tmp.path().join("doctor.json");
    let _ = hicache()
        .args(["doctor", "--plugin", "posix", "--json"])
        .arg(&out)
        .arg("--dir")
        .arg(&dir)
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let dirs = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "storage dirs")
        .unwrap();
    let me = "cleaner runs in ";
    let pid = format!("pid {}; last pass at", std::process::id());
    assert!(
        dirs["details"].as_array().unwrap().iter().any(|d| d
            .as_str()
            .is_some_and(|d| d.contains(me) && d.contains(&pid))),
        "{dirs}"
    );
    assert!(backend.cleaner().unwrap()[0].elected, "doctor took nothing");
    drop(backend);
    let _ = success(
        hicache()
            .args(["doctor", "--plugin", "posix", "--json"])
            .arg(&out)
            .arg("--dir")
            .arg(&dir),
    );
    let report = std::fs::read_to_string(&out).unwrap();
    assert!(report.contains("no cleaner runs now"), "{report}");
}
