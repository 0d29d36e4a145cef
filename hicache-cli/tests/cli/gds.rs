//! A build with the `gds` feature (`cargo test -p hicache-cli --features gds`): `hicache
//! plugins` lists GDS and GDS_MT with their verdicts — unusable with the paths tried where
//! cuFile is absent, usable over the testkit's stand-in cuFile.

use super::{hicache, json_output};

fn config(dir: &std::path::Path, cufile: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("hicache.toml");
    let lib = cufile.display().to_string();
    std::fs::write(
        &path,
        format!(
            "[plugin.gds]\ncufile_path = {lib:?}\n[plugin.gds_mt]\nactive = true\ncufile_path = {lib:?}\n"
        ),
    )
    .unwrap();
    path
}

fn row<'a>(rows: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {rows:?}"))
}

#[test]
fn plugins_shows_both_gds_plugins_unusable_without_cufile() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere").join("libcufile.so.0");
    let cfg = config(dir.path(), &missing);
    let run = |json: bool| {
        let mut cmd = hicache();
        cmd.arg("plugins");
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .arg("--config")
            .arg(&cfg)
            .arg("--dir")
            .arg(dir.path().join("store"))
            .output()
            .unwrap();
        // GDS_MT, the plugin the config asks for, is unusable: the command says so by its
        // exit status, after listing every plugin.
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let out: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let rows = out["plugins"].as_array().unwrap();
    for name in ["GDS", "GDS_MT"] {
        let r = row(rows, name);
        assert_eq!(r["usable"], false, "{r}");
        let text = r.to_string();
        assert!(
            text.contains(missing.to_str().unwrap()) && text.contains("cufile_path"),
            "{text}"
        );
    }
    let text = run(false);
    assert!(
        text.contains("GDS_MT")
            && text.contains("GDS ")
            && text.contains("unusable: cannot load cuFile"),
        "{text}"
    );
}

#[test]
fn plugins_shows_both_usable_over_the_stand_in() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cufile = hicache_testkit::standins::cufile(dir.path()).unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let out = json_output(
        hicache()
            .args(["plugins", "--json", "--config"])
            .arg(config(dir.path(), &cufile))
            .arg("--dir")
            .arg(&store),
    );
    let rows = out["plugins"].as_array().unwrap();
    for name in ["GDS", "GDS_MT"] {
        let r = row(rows, name);
        assert_eq!(r["usable"], true, "{r}");
        let text = r.to_string();
        assert!(
            text.contains("test stand-in") && text.contains("block written and read back"),
            "{text}"
        );
    }
}
