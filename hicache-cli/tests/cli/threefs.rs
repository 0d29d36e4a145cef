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
    std::fs::write(
        mount.join(hicache_testkit::standins::USRBIO_MOUNT_MARKER),
        b"",
    )
    .unwrap();
    let store = mount.join("kv");
    std::fs::create_dir(&store).unwrap();
    let out = plugins(&store, &library);
    let row = three_fs(&out);
    assert_eq!(row["usable"], true, "{row}");
    assert!(row.to_string().contains("test stand-in"), "{row}");
    assert_eq!(out["auto_choice"], "3FS");
}
