//! The loader end to end: sources, precedence, validation, hostile input.
use super::*;
use std::io::Write;
use std::path::Path;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    p
}

#[test]
fn defaults() {
    let cfg = ConfigLoader::new().load().unwrap();
    assert_eq!(cfg.plugin.value, PluginChoice::Auto);
    assert_eq!(
        cfg.storage_dirs.value,
        vec![PathBuf::from(DEFAULT_STORAGE_DIR)]
    );
    assert!(cfg.use_direct_io.value);
    assert_eq!(cfg.use_direct_io.source, Source::Default);
}

#[test]
fn precedence_file_env_api_with_provenance() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.toml",
        "use_direct_io = true\nplugin = \"posix\"\nstorage_dir = \"/a\"\n",
    );
    let env = EnvSnapshot::from_pairs([
        ("HICACHE_USE_DIRECT_IO", "false"),
        ("HICACHE_STORAGE_DIR", "/b, /c"),
    ]);
    let cfg = ConfigLoader::new()
        .file(&file)
        .env(env)
        .set("storage_dir", "/d")
        .load()
        .unwrap();
    assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
    assert_eq!(cfg.plugin.source, Source::File(file.clone()));
    assert!(!cfg.use_direct_io.value);
    assert_eq!(
        cfg.use_direct_io.source,
        Source::Env("HICACHE_USE_DIRECT_IO".into())
    );
    assert_eq!(
        cfg.use_direct_io.overridden,
        vec![(Source::File(file), "true".into())]
    );
    assert_eq!(cfg.storage_dirs.value, vec![PathBuf::from("/d")]);
    assert_eq!(cfg.storage_dirs.source, Source::Api);
    assert_eq!(cfg.storage_dirs.overridden.len(), 2);

    let cfg = ConfigLoader::new()
        .env(EnvSnapshot::from_pairs([("HICACHE_STORAGE_DIR", "/b")]))
        .set_flag("--dir", "storage_dir", "/d")
        .load()
        .unwrap();
    assert_eq!(cfg.storage_dirs.value, vec![PathBuf::from("/d")]);
    assert_eq!(cfg.storage_dirs.source, Source::Flag("--dir".into()));
    assert_eq!(cfg.storage_dirs.source.to_string(), "flag --dir");
}

#[test]
fn transfer_mode_is_auto_or_bounce() {
    assert_eq!(
        ConfigLoader::new().load().unwrap().transfer_mode.value,
        TransferChoice::Auto
    );
    let env = EnvSnapshot::from_pairs([("HICACHE_TRANSFER_MODE", "Bounce")]);
    let cfg = ConfigLoader::new().env(env).load().unwrap();
    assert_eq!(cfg.transfer_mode.value, TransferChoice::Bounce);
    assert_eq!(
        cfg.transfer_mode.source,
        Source::Env("HICACHE_TRANSFER_MODE".into())
    );
    let err = ConfigLoader::new()
        .set("transfer_mode", "zerocopy")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("transfer_mode") && err.contains("bounce"),
        "{err}"
    );
}

#[test]
fn sglang_env_aliases_and_conflicts() {
    let env = EnvSnapshot::from_pairs([
        ("SGLANG_HICACHE_NIXL_BACKEND_PLUGIN", "posix"),
        ("SGLANG_HICACHE_NIXL_USE_DIRECT_IO", "false"),
        ("HICACHE_STORAGE_DIR", "/x"),
        ("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR", "/y"),
    ]);
    let cfg = ConfigLoader::new().env(env).load().unwrap();
    assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
    assert_eq!(
        cfg.plugin.source,
        Source::Env("SGLANG_HICACHE_NIXL_BACKEND_PLUGIN".into())
    );
    assert!(!cfg.use_direct_io.value, "the string false must mean false");
    assert_eq!(cfg.storage_dirs.value, vec![PathBuf::from("/x")]);
    assert!(
        cfg.warnings.iter().any(|w| w.contains("disagree")),
        "{:?}",
        cfg.warnings
    );
    let cfg = ConfigLoader::new()
        .env(EnvSnapshot::from_pairs([(
            "HICACHE_BACKEND_PLUGIN",
            "AUTO",
        )]))
        .load()
        .unwrap();
    assert_eq!(cfg.plugin.value, PluginChoice::Auto);
}

#[test]
fn strict_booleans() {
    for (text, want) in [
        ("true", true),
        ("False", false),
        ("0", false),
        ("yes", true),
        ("off", false),
    ] {
        let cfg = ConfigLoader::new()
            .set("use_direct_io", text)
            .load()
            .unwrap();
        assert_eq!(cfg.use_direct_io.value, want, "{text}");
    }
    let err = ConfigLoader::new()
        .env(EnvSnapshot::from_pairs([(
            "HICACHE_USE_DIRECT_IO",
            "maybe",
        )]))
        .load()
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("use_direct_io")
            && msg.contains("HICACHE_USE_DIRECT_IO")
            && msg.contains("maybe"),
        "{msg}"
    );
    assert!(
        ConfigLoader::new()
            .set("l3_cleaner_enabled", 2)
            .load()
            .is_err()
    );
}

#[test]
fn fully_qualified_form() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.toml",
        "use_direct_io = false\n[plugin.obj]\nactive = false\nbucket = \"b\"\n[plugin.posix]\nactive = true\nuse_uring = \"true\"\n[plugin.gds]\nactive = true\n",
    );
    let cfg = ConfigLoader::new().file(&file).load().unwrap();
    assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
    let posix = cfg.section("posix").unwrap();
    assert_eq!(posix.params.len(), 1, "active is not a parameter");
    assert!(posix.params.get("use_uring").is_some());
    assert!(cfg.warnings.iter().any(|w| w.contains("both active")));
    assert!(!cfg.use_direct_io.value);
}

#[test]
fn relative_dirs_in_a_file_are_relative_to_the_file_and_bind_mounts_are_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.toml",
        "storage_dir = [\"pages\", \"/abs\"]\n",
    );
    let cfg = ConfigLoader::new().file(&file).load().unwrap();
    assert_eq!(
        cfg.storage_dirs.value,
        vec![dir.path().join("pages"), PathBuf::from("/abs")]
    );
    for hostile in [
        "storage_dir = [\"\"]\n",
        "storage_dir = []\n",
        "storage_dir = [1]\n",
    ] {
        let file = write(dir.path(), "h.toml", hostile);
        let err = ConfigLoader::new().file(&file).load().unwrap_err();
        assert!(err.to_string().contains("storage_dir"), "{hostile}: {err}");
    }
    // The same dir under two names that no path resolution merges: a bind mount.
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let src = std::ffi::CString::new(a.to_str().unwrap()).unwrap();
    let dst = std::ffi::CString::new(b.to_str().unwrap()).unwrap();
    // SAFETY: NUL-terminated paths; a bind mount of one temp dir onto another.
    let mounted = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    } == 0;
    if mounted {
        let err = check_dir_list("storage_dir", vec![a.clone(), b.clone()], &Source::Api);
        // SAFETY: unmounting what was mounted above.
        unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
        assert!(
            err.is_err(),
            "a bind mount of the same dir was accepted twice"
        );
    } else {
        eprintln!("skipped the bind-mount half: mount needs root");
    }
}

#[test]
fn all_inactive_is_a_clear_error_unless_env_picks() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.json",
        r#"{"plugin": {"posix": {"active": false}, "obj": {}}}"#,
    );
    let err = ConfigLoader::new().file(&file).load().unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("no plugin section is active") && msg.contains("[plugin.posix]"),
        "{msg}"
    );
    let cfg = ConfigLoader::new()
        .file(&file)
        .env(EnvSnapshot::from_pairs([(
            "HICACHE_BACKEND_PLUGIN",
            "posix",
        )]))
        .load()
        .unwrap();
    assert_eq!(cfg.plugin.value, PluginChoice::Named("POSIX".into()));
}

#[test]
fn unknown_keys_get_suggestions() {
    let err = ConfigLoader::new()
        .set("use_directio", true)
        .load()
        .unwrap_err();
    assert!(
        err.to_string().contains("did you mean `use_direct_io`"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.toml",
        "storage_dirr = \"/a\"\n[plugin.posix]\nactive = true\n",
    );
    let err = ConfigLoader::new().file(&file).load().unwrap_err();
    assert!(
        err.to_string().contains("did you mean `storage_dir`"),
        "{err}"
    );
    let bad = write(dir.path(), "bad.toml", "[plugin]\nposix = 3\n");
    assert!(ConfigLoader::new().file(&bad).load().is_err());
}

#[test]
fn flat_form_keeps_engine_keys_out_of_plugin_params() {
    let cfg = ConfigLoader::new()
        .extra_config(r#"{"use_uring": "true", "use_direct_io": false, "prefetch_threshold": 512, "interface_v1": true}"#)
        .load()
        .unwrap();
    assert_eq!(cfg.flat_params.len(), 1);
    assert_eq!(
        cfg.flat_params.get("use_uring").unwrap().source,
        Source::Inline
    );
    assert!(!cfg.use_direct_io.value);
    assert_eq!(
        cfg.engine.values["prefetch_threshold"].value,
        RawValue::Int(512)
    );
    let err = ConfigLoader::new()
        .extra_config(r#"{"prefetch_threshold": "lots"}"#)
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("integer"), "{err}");
}

#[test]
fn file_formats() {
    let dir = tempfile::tempdir().unwrap();
    let json = write(dir.path(), "c.json", r#"{"use_direct_io": "false"}"#);
    assert!(
        !ConfigLoader::new()
            .file(format!("@{}", json.display()))
            .load()
            .unwrap()
            .use_direct_io
            .value
    );
    // A path that is not UTF-8 names its own file, with or without the `@`.
    let odd = {
        use std::os::unix::ffi::OsStrExt;
        dir.path()
            .join(std::ffi::OsStr::from_bytes(b"\xff\xfe.toml"))
    };
    std::fs::write(&odd, "use_direct_io = false\n").unwrap();
    std::fs::write(
        dir.path().join("\u{fffd}\u{fffd}.toml"),
        "use_direct_io = true\n",
    )
    .unwrap();
    let mut at = std::ffi::OsString::from("@");
    at.push(odd.as_os_str());
    for path in [odd.clone(), PathBuf::from(at)] {
        let config = ConfigLoader::new().file(&path).load().unwrap();
        assert!(!config.use_direct_io.value, "{}", path.display());
    }
    let ini = write(dir.path(), "c.ini", "x=1");
    let err = ConfigLoader::new().file(&ini).load().unwrap_err();
    assert!(
        err.to_string().contains("unsupported config format `.ini`"),
        "{err}"
    );
    let leaky = write(
        dir.path(),
        "s.toml",
        "[plugin.obj]\naccess_key = \"AKIA\"\nsecret_key = \"hunter2-very-secret\nbucket = \"b\"\n",
    );
    let err = ConfigLoader::new()
        .file(&leaky)
        .load()
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid TOML at line"), "{err}");
    assert!(
        !err.contains("hunter2"),
        "a parse error echoed a secret: {err}"
    );
    let broken = write(dir.path(), "b.toml", "use_direct_io = ");
    assert!(
        ConfigLoader::new()
            .file(&broken)
            .load()
            .unwrap_err()
            .to_string()
            .contains("invalid TOML")
    );
    assert!(
        ConfigLoader::new()
            .file(dir.path().join("missing.toml"))
            .load()
            .is_err()
    );
    assert!(
        ConfigLoader::new()
            .extra_config("{not json")
            .load()
            .is_err()
    );
}

#[test]
fn dir_lists() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir(&a).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let list = format!(" {}, ,{} ", a.display(), dir.path().join("b").display());
    let dirs = parse_dir_list("storage_dir", &list, &Source::Api).unwrap();
    assert_eq!(dirs, vec![a.clone(), dir.path().join("b")]);
    let dup = format!("{},{}", a.display(), link.display());
    let err = parse_dir_list("storage_dir", &dup, &Source::Api).unwrap_err();
    assert!(err.to_string().contains("duplicate path"), "{err}");
    let dup2 = format!("{}/x,{}/x", a.display(), link.display());
    assert!(
        parse_dir_list("storage_dir", &dup2, &Source::Api).is_err(),
        "missing dirs under the same real parent"
    );
    assert!(parse_dir_list("storage_dir", " , ", &Source::Api).is_err());
}

#[test]
fn watermarks() {
    assert!(
        ConfigLoader::new()
            .set("l3_cleaner_low_watermark", "85")
            .load()
            .is_err()
    );
    let cfg = ConfigLoader::new()
        .set("l3_cleaner_high_watermark", "90.5")
        .load()
        .unwrap();
    assert_eq!(cfg.cleaner_high_watermark.value, 90.5);
    assert!(
        ConfigLoader::new()
            .set("l3_cleaner_high_watermark", 150)
            .load()
            .is_err()
    );
}

/// Loading `key = value` fails with an `InvalidConfig` naming the key and saying `says`.
fn refused(key: &str, value: serde_json::Value, says: &str) {
    let err = ConfigLoader::new()
        .set(key, value.clone())
        .load()
        .expect_err(&format!("{key} = {value} must be refused"));
    let text = err.to_string();
    assert!(
        matches!(err, crate::Error::InvalidConfig { .. })
            && text.contains(key)
            && text.contains(says),
        "{key} = {value}: {text}"
    );
}

/// Every bad cleaner value is a typed error that names its key and says what is allowed.
#[test]
fn cleaner_keys_refuse_bad_values() {
    refused("l3_cleaner_high_watermark", "NaN".into(), "outside 0..=100");
    refused("l3_cleaner_low_watermark", "nan".into(), "outside 0..=100");
    refused("l3_cleaner_high_watermark", (-1).into(), "outside 0..=100");
    refused("l3_cleaner_high_watermark", "inf".into(), "outside 0..=100");
    refused("l3_cleaner_low_watermark", "80".into(), "must be lower");
    refused("l3_cleaner_low_watermark", "high".into(), "percent");
    refused("l3_cleaner_max_bytes", "lots".into(), "not a size");
    refused("l3_cleaner_max_bytes", (-5).into(), "byte count");
    refused("max_size", "1.5 XB".into(), "not a size");
    refused(
        "l3_cleaner_min_free_bytes",
        true.into(),
        "byte count or a size",
    );
    refused("l3_cleaner_interval_s", 0.into(), "outside 0.05..=86400");
    refused("l3_cleaner_interval_s", "NaN".into(), "outside");
    refused("l3_cleaner_min_age_s", (-1).into(), "outside 0..=86400");
    // Far out of range: shown in exponent form, not as hundreds of digits.
    refused(
        "l3_cleaner_high_watermark",
        1e300.into(),
        "1e300 is outside 0..=100",
    );
    refused(
        "l3_cleaner_interval_s",
        "1e-300".into(),
        "1e-300 is outside 0.05..=86400",
    );
    refused(
        "l3_cleaner_min_age_s",
        (-2.5e20).into(),
        "-2.5e20 is outside 0..=86400",
    );
    refused("l3_cleaner_interval_s", 100_000.into(), "100000 is outside");
    refused(
        "l3_cleaner_max_removals_per_s",
        0.into(),
        "outside 1..=1000000",
    );
    refused("l3_cleaner_max_removals_per_s", 2.5.into(), "whole number");
    refused("l3_cleaner_scope", "mine".into(), "not one of hicache, all");
}

#[test]
fn cleaner_sizes_take_sglang_units_and_names() {
    let cfg = ConfigLoader::new()
        .set("max_size", "1.5GiB")
        .set("min_free_space", "20 GB")
        .load()
        .unwrap();
    assert_eq!(cfg.cleaner_max_bytes.value, 3 << 29);
    assert_eq!(cfg.cleaner_min_free_bytes.value, 20_000_000_000);
    let s = cfg.cleaner().unwrap();
    assert_eq!(
        (s.max_bytes, s.min_free_bytes),
        (Some(3 << 29), Some(20_000_000_000))
    );
    let off = ConfigLoader::new()
        .set("l3_cleaner_max_bytes", "0")
        .set("l3_cleaner_enabled", false)
        .load()
        .unwrap();
    assert_eq!(off.cleaner_max_bytes.value, 0);
    assert!(off.cleaner().is_none());
}

#[test]
fn entries_redact_secrets() {
    let cfg = ConfigLoader::new()
        .set("plugin.obj.secret_key", "hunter2")
        .set("plugin.obj.bucket", "b")
        .load()
        .unwrap();
    let entries = cfg.entries();
    let secret = entries
        .iter()
        .find(|e| e.key == "plugin.obj.secret_key")
        .unwrap();
    assert_eq!(secret.value, "***");
    assert!(!format!("{entries:?}").contains("hunter2"));
    assert!(!format!("{cfg:?}").contains("hunter2"));
    assert!(
        entries
            .iter()
            .any(|e| e.key == "plugin.obj.bucket" && e.value == "b")
    );
}

#[test]
fn an_environment_snapshot_takes_owned_or_borrowed_pairs() {
    assert_eq!(
        EnvSnapshot::from_pairs(std::env::vars()),
        EnvSnapshot::from_process()
    );
    let owned = EnvSnapshot::from_pairs([("HICACHE_NAMING".to_string(), "sglang".to_string())]);
    let borrowed = EnvSnapshot::from_pairs([("HICACHE_NAMING", "sglang")]);
    assert_eq!(owned, borrowed);
    assert_eq!(owned.get("HICACHE_NAMING"), Some("sglang"));
    assert_eq!(EnvSnapshot::default().get("HICACHE_NAMING"), None);
}

/// A value that is not UTF-8 never panics a snapshot (`std::env::vars()` would). Where hicache
/// reads it (a key's variable, its SGLang alias, `HICACHE_CONFIG`, a plugin's fallback) it is
/// an error naming the variable; anywhere else it is ignored.
#[test]
fn environment_values_that_are_not_utf8_are_errors_where_read() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let bad = || OsString::from_vec(vec![b'/', 0xff, 0xfe]);
    let snapshot = |name: &str| {
        EnvSnapshot::from_os_pairs([
            (OsString::from("HICACHE_NAMING"), OsString::from("sglang")),
            (OsString::from(name), bad()),
            (OsString::from_vec(vec![b'X', 0xff]), OsString::from("x")),
        ])
    };
    let unrelated = snapshot("SOME_OTHER_TOOL");
    assert_eq!(unrelated.get("SOME_OTHER_TOOL"), None);
    assert_eq!(
        unrelated.get_for("HICACHE_NAMING", "naming").unwrap(),
        Some("sglang")
    );
    let config = ConfigLoader::new().env(unrelated).load().unwrap();
    assert_eq!(config.naming.value, NamingScheme::Sglang);

    for (var, key) in [
        ("HICACHE_STORAGE_DIR", "storage_dir"),
        ("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR", "storage_dir"),
        ("HICACHE_CONFIG", "config file"),
    ] {
        let e = ConfigLoader::new().env(snapshot(var)).load().unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, crate::Error::InvalidConfig { .. })
                && text.contains(var)
                && text.contains(key)
                && text.contains("UTF-8"),
            "{var}: {text}"
        );
    }
    // Set later as UTF-8, the variable counts again; set later as not UTF-8, it is gone.
    let fixed = EnvSnapshot::from_os_pairs([
        (OsString::from("HICACHE_STORAGE_DIR"), bad()),
        (
            OsString::from("HICACHE_STORAGE_DIR"),
            OsString::from("/data"),
        ),
    ]);
    assert_eq!(
        fixed.get_for("HICACHE_STORAGE_DIR", "storage_dir").unwrap(),
        Some("/data")
    );
    let broken = EnvSnapshot::from_os_pairs([
        (
            OsString::from("HICACHE_STORAGE_DIR"),
            OsString::from("/data"),
        ),
        (OsString::from("HICACHE_STORAGE_DIR"), bad()),
    ]);
    assert!(
        broken
            .get_for("HICACHE_STORAGE_DIR", "storage_dir")
            .is_err()
    );
    assert_eq!(broken.get("HICACHE_STORAGE_DIR"), None);
}

/// A flag's value is checked like any explicit value, and its errors name the flag.
#[test]
fn hostile_flag_values_are_errors_naming_the_flag() {
    let e = ConfigLoader::new()
        .set_flag("--direct-io", "use_direct_io", "maybe")
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("use_direct_io") && e.contains("flag --direct-io"),
        "{e}"
    );
    let e = ConfigLoader::new()
        .set_flag("--dir", "storage_dir", 7)
        .load()
        .unwrap_err()
        .to_string();
    assert!(e.contains("storage_dir") && e.contains("flag --dir"), "{e}");
    let e = ConfigLoader::new()
        .set_flag("--dri", "storge_dir", "/x")
        .load()
        .unwrap_err()
        .to_string();
    assert!(e.contains("did you mean `storage_dir`"), "{e}");
}

#[test]
fn plugin_dirs_take_a_list_or_a_comma_string_and_name_themselves_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.toml",
        "plugin_dirs = [\"plugins\", \"/opt/p\"]\n",
    );
    let cfg = ConfigLoader::new().file(&file).load().unwrap();
    assert_eq!(
        cfg.plugin_dirs.value,
        vec![dir.path().join("plugins"), PathBuf::from("/opt/p")],
        "a relative dir of a file is relative to the file"
    );
    let env = EnvSnapshot::from_pairs([("HICACHE_PLUGIN_DIR", "/a, /b")]);
    let cfg = ConfigLoader::new().env(env).load().unwrap();
    assert_eq!(
        cfg.plugin_dirs.value,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert_eq!(
        cfg.plugin_dirs.source,
        Source::Env("HICACHE_PLUGIN_DIR".into())
    );
    assert!(
        ConfigLoader::new()
            .load()
            .unwrap()
            .plugin_dirs
            .value
            .is_empty()
    );

    for (value, says) in [
        (serde_json::json!(5), "plugin_dirs"),
        (serde_json::json!(["/a", "/a"]), "duplicate path"),
        (serde_json::json!(["/a", ""]), "empty"),
        (serde_json::json!(" , "), "no directory"),
    ] {
        let e = ConfigLoader::new()
            .set("plugin_dirs", value.clone())
            .load()
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("plugin_dirs") && text.contains(says),
            "{value}: {text}"
        );
    }
}

#[test]
fn hicache_config_names_the_file_when_no_file_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let named = write(dir.path(), "named.toml", "naming = \"sglang\"\n");
    let given = write(dir.path(), "given.toml", "page_format = \"raw\"\n");
    let env = || EnvSnapshot::from_pairs([("HICACHE_CONFIG", named.to_str().unwrap())]);

    let cfg = ConfigLoader::new().env(env()).load().unwrap();
    assert_eq!(cfg.naming.value, NamingScheme::Sglang);
    assert_eq!(cfg.naming.source, Source::File(named.clone()));

    // A file given to the loader wins; HICACHE_CONFIG is not read at all.
    let cfg = ConfigLoader::new().file(&given).env(env()).load().unwrap();
    assert_eq!(cfg.naming.value, NamingScheme::Hicache);
    assert_eq!(cfg.page_format.value, PageFormat::Raw);

    // Without the environment, the variable means nothing.
    let cfg = ConfigLoader::new().load().unwrap();
    assert_eq!(cfg.naming.value, NamingScheme::Hicache);

    let missing = EnvSnapshot::from_pairs([("HICACHE_CONFIG", "/no/such/hicache.toml")]);
    let e = ConfigLoader::new().env(missing).load().unwrap_err();
    assert!(
        matches!(&e, crate::Error::ConfigFile { reason, .. } if reason.contains("named by HICACHE_CONFIG")),
        "{e}"
    );
}

/// The exporter's keys: loopback only, a fixed port, a real path; each refusal names its key.
#[test]
fn metrics_keys_refuse_bad_values() {
    refused("metrics_listen", "0.0.0.0:9464".into(), "not a loopback");
    refused("metrics_listen", "10.1.2.3:9464".into(), "not a loopback");
    refused("metrics_listen", "[::]:9464".into(), "not a loopback");
    refused(
        "metrics_listen",
        "localhost:9464".into(),
        "not an IP address",
    );
    refused("metrics_listen", "127.0.0.1".into(), "not an IP address");
    refused("metrics_listen", "127.0.0.1:0".into(), "port 0");
    refused(
        "metrics_listen",
        "127.0.0.1:99999".into(),
        "not an IP address",
    );
    refused("metrics_listen", 9464.into(), "a string");
    refused("metrics_file", "a\0b".into(), "NUL");
    refused("metrics_file", 3.into(), "a string");
    refused("metrics_file_interval_s", 0.into(), "outside 0.1..=86400");
    refused("metrics_file_interval_s", "NaN".into(), "outside");

    let cfg = ConfigLoader::new()
        .set("metrics_listen", " [::1]:9464 ")
        .set("metrics_file", "/run/hicache.prom")
        .load()
        .unwrap();
    assert_eq!(
        cfg.metrics_listen.value,
        Some("[::1]:9464".parse().unwrap())
    );
    assert_eq!(
        cfg.metrics_file.value.as_deref(),
        Some(std::path::Path::new("/run/hicache.prom"))
    );
    let off = ConfigLoader::new()
        .set("metrics_listen", "")
        .load()
        .unwrap();
    assert_eq!(off.metrics_listen.value, None);
}

/// Paths that are not a config file's: no extension, a dir, a FIFO (reading it would block),
/// a device, and a file past the size limit, which is refused before it is read.
#[test]
fn config_paths_that_are_not_config_files() {
    let dir = tempfile::tempdir().unwrap();
    let load = |p: &Path| ConfigLoader::new().file(p).load().unwrap_err().to_string();

    let bare = write(dir.path(), "hicache", "use_direct_io = false");
    assert_eq!(
        super::loader::MAX_CONFIG_BYTES,
        1 << 20,
        "CONFIG.md says 1 MiB"
    );
    let e = load(&bare);
    assert!(e.contains("no extension") && e.contains("hicache"), "{e}");

    let as_dir = dir.path().join("d.toml");
    std::fs::create_dir(&as_dir).unwrap();
    let e = load(&as_dir);
    assert!(e.contains("d.toml"), "{e}");

    let fifo = dir.path().join("f.toml");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // No writer ever comes: a blocking open would hang here.
    let e = load(&fifo);
    assert!(
        e.contains("not a regular file") && e.contains("f.toml"),
        "{e}"
    );

    let device = dir.path().join("null.toml");
    std::os::unix::fs::symlink("/dev/null", &device).unwrap();
    let e = load(&device);
    assert!(
        e.contains("not a regular file") && e.contains("null.toml"),
        "{e}"
    );

    let big = dir.path().join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(super::loader::MAX_CONFIG_BYTES + 1).unwrap();
    let e = load(&big);
    assert!(e.contains("limit") && e.contains("big.json"), "{e}");

    let at_limit = dir.path().join("pad.json");
    let mut text = String::from("{}");
    text.push_str(&" ".repeat(super::loader::MAX_CONFIG_BYTES as usize - text.len()));
    std::fs::write(&at_limit, text).unwrap();
    ConfigLoader::new().file(&at_limit).load().unwrap();
}
