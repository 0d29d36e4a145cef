//! Plugins loaded at run time: `hicache plugins` and `doctor` show where each came from and
//! why a file in a plugin dir was not loaded.

use std::path::Path;

use super::{hicache, json_output, success};

/// The C example plugin, renamed `VENDOR`, and a build of it for another ABI version, in
/// one plugin dir.
fn plugin_dir(dir: &Path) {
    let files = [
        ("hicache_plugin.h", hicache_abi::HEADER),
        ("cfile.c", hicache_abi::examples::CFILE_C),
    ];
    let vendor = ["HICACHE_PLUGIN_NAME=\"VENDOR\""];
    hicache_testkit::cc::shared_library(&files, &vendor, &dir.join("libvendor.so")).unwrap();
    let old = ["HICACHE_BROKEN_ABI"];
    hicache_testkit::cc::shared_library(&files, &old, &dir.join("libold.so")).unwrap();
}

#[test]
fn plugins_lists_a_loaded_plugin_with_its_file_and_the_files_not_loaded() {
    let plugins = tempfile::tempdir().unwrap();
    plugin_dir(plugins.path());
    let store = tempfile::tempdir().unwrap();
    let out = json_output(
        hicache()
            .args(["plugins", "--json", "--dir"])
            .arg(store.path())
            .env("HICACHE_PLUGIN_DIR", plugins.path()),
    );
    let rows = out["plugins"].as_array().unwrap();
    let vendor = rows
        .iter()
        .find(|r| r["name"] == "VENDOR")
        .expect("VENDOR is listed");
    assert_eq!(
        vendor["source"],
        plugins.path().join("libvendor.so").display().to_string()
    );
    assert_eq!(vendor["usable"], true, "{vendor}");
    let posix = rows.iter().find(|r| r["name"] == "POSIX").unwrap();
    assert_eq!(posix["source"], "built-in");
    let not_loaded = out["not_loaded"].as_array().unwrap();
    assert_eq!(not_loaded.len(), 1, "{not_loaded:?}");
    assert!(
        not_loaded[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("libold.so")
    );
    assert!(
        not_loaded[0]["reason"]
            .as_str()
            .unwrap()
            .contains("plugin ABI version 99"),
        "{not_loaded:?}"
    );

    let text = success(
        hicache()
            .args(["plugins", "--dir"])
            .arg(store.path())
            .env("HICACHE_PLUGIN_DIR", plugins.path()),
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("source: built-in"), "{text}");
    assert!(
        text.contains(&format!(
            "source: {}",
            plugins.path().join("libvendor.so").display()
        )),
        "{text}"
    );
    assert!(
        text.contains("not loaded:") && text.contains("libold.so"),
        "{text}"
    );
}

#[test]
fn a_loaded_plugin_is_selected_by_name_and_doctor_warns_about_the_rest() {
    let plugins = tempfile::tempdir().unwrap();
    plugin_dir(plugins.path());
    let store = tempfile::tempdir().unwrap();
    let config = store.path().join("hicache.toml");
    std::fs::write(
        &config,
        format!(
            "plugin_dirs = [{:?}]\n[plugin.vendor]\nactive = true\nfsync = false\n",
            plugins.path().display().to_string()
        ),
    )
    .unwrap();
    let out = json_output(
        hicache()
            .args(["doctor", "--json", "--config"])
            .arg(&config)
            .arg("--dir")
            .arg(store.path().join("data")),
    );
    let text = out.to_string();
    assert!(text.contains("selected plugin VENDOR"), "{text}");
    assert!(text.contains("fsync=false"), "{text}");
    assert!(
        text.contains("plugin file not loaded") && text.contains("libold.so"),
        "{text}"
    );
}

#[test]
fn a_missing_plugin_dir_is_reported_and_the_built_ins_still_work() {
    let store = tempfile::tempdir().unwrap();
    let missing = store.path().join("no-plugins-here");
    let out = json_output(
        hicache()
            .args(["plugins", "--json", "--dir"])
            .arg(store.path())
            .env("HICACHE_PLUGIN_DIR", &missing),
    );
    assert_eq!(out["auto_choice"], "POSIX");
    let reason = out["not_loaded"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("no-plugins-here") && reason.contains("HICACHE_PLUGIN_DIR"),
        "{reason}"
    );
}
