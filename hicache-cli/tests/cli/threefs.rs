//! A build with the `3fs` feature (`cargo test -p hicache-cli --features 3fs`): `hicache
//! plugins` shows 3FS unusable on a normal dir with the reason, and usable — and auto's
//! choice, above POSIX — on a dir of the testkit's stand-in mount.

use super::{hicache, json_output};

fn plugins(store: &std::path::Path, library: &std::path::Path) -> serde_json::Value {
    let cfg = store.parent().unwrap().join("hicache-3fs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[plugin.3fs]\nusrbio_path = {:?}\n",
            library.display().to_string()
        ),
    )
    .unwrap();
    // The section names no active plugin: `auto` chooses, as the config asks through the
    // environment.
    json_output(
        hicache()
            .env("HICACHE_BACKEND_PLUGIN", "auto")
            .args(["plugins", "--json", "--config"])
            .arg(&cfg)
            .arg("--dir")
            .arg(store),
    )
}

fn three_fs(out: &serde_json::Value) -> &serde_json::Value {
    out["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "3FS")
        .expect("3FS is listed")
}

#[test]
fn plugins_shows_3fs_unusable_off_3fs_and_chosen_on_a_mount() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let library = hicache_testkit::standins::usrbio(dir.path()).unwrap();
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let out = plugins(&plain.join("kv"), &library);
    let row = three_fs(&out);
    assert_eq!(row["usable"], false, "{row}");
    assert!(row.to_string().contains("not on a 3FS mount"), "{row}");
    assert_eq!(out["auto_choice"], "POSIX");

    let mount = dir.path().join("mount");
    std::fs::create_dir(&mount).unwrap();
    hicache_testkit::standins::make_usrbio_mount(&mount).unwrap();
    let store = mount.join("kv");
    std::fs::create_dir(&store).unwrap();
    let out = plugins(&store, &library);
    let row = three_fs(&out);
    assert_eq!(row["usable"], true, "{row}");
    assert!(row.to_string().contains("test stand-in"), "{row}");
    assert_eq!(out["auto_choice"], "3FS");
}

/// `hicache bench --shared-pool` on the stand-in mount: 3FS moves the pool in place (nothing
/// copied); without the flag the report names the bounce and counts its bytes.
#[test]
fn bench_reports_whether_3fs_moved_the_pool_in_place() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let library = hicache_testkit::standins::usrbio(dir.path()).unwrap();
    let mount = dir.path().join("mount");
    std::fs::create_dir(&mount).unwrap();
    hicache_testkit::standins::make_usrbio_mount(&mount).unwrap();
    let store = mount.join("kv");
    let cfg = dir.path().join("hicache-3fs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[plugin.3fs]\nactive = true\nusrbio_path = {:?}\niov_bytes = 1048576\n",
            library.display().to_string()
        ),
    )
    .unwrap();
    let bench = |shared: bool| {
        let mut cmd = hicache();
        cmd.args([
            "bench",
            "--pages",
            "32",
            "--rounds",
            "1",
            "--ops",
            "write,read",
            "--json",
            "--config",
        ])
        .arg(&cfg)
        .arg("--dir")
        .arg(&store);
        if shared {
            cmd.arg("--shared-pool");
        }
        json_output(&mut cmd)
    };
    let shared = bench(true);
    assert_eq!(shared["plugin"], "3FS", "{shared}");
    assert_eq!(shared["verified"], true, "{shared}");
    assert_eq!(shared["shared_pool"], true, "{shared}");
    let path = shared["pool_path"].as_str().unwrap();
    assert!(path.starts_with("in place (USRBIO"), "{path}");
    let plain = bench(false);
    assert_eq!(plain["verified"], true, "{plain}");
    let path = plain["pool_path"].as_str().unwrap();
    assert!(
        path.starts_with("copied through 1 MiB USRBIO bounce iovs"),
        "{path}"
    );
    // 32 pages written and read back, each with its 4 KiB envelope header: every byte went
    // through the iovs twice.
    let moved = 2 * 32 * (plain["page_bytes"].as_u64().unwrap() + 4096);
    assert!(path.ends_with(&format!("; {moved} bytes so far")), "{path}");
    // Nothing left published on the mount or in /dev/shm.
    assert_eq!(
        std::fs::read_dir(mount.join("3fs-virt/iovs"))
            .unwrap()
            .count(),
        0
    );
}
