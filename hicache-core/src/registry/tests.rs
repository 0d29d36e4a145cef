use super::*;
use crate::config::{ConfigLoader, EnvSnapshot};
use crate::params::ParamSpec;

fn usable(_: &PluginContext<'_>) -> Probe {
    Probe::usable("fake")
}
fn unusable(_: &PluginContext<'_>) -> Probe {
    Probe::unusable("no mount", "mount it")
}
fn no_build(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    Err(Error::backend(
        "FAKE",
        format!("build not available in tests {}", ctx.params),
    ))
}
fn build_memory(_: &PluginContext<'_>) -> Result<DynBackend> {
    Ok(std::sync::Arc::new(
        crate::memory_backend::MemoryBackend::new(),
    ))
}

crate::plugin_params! {
    struct FakeParams {
        use_uring: Bool = "use_uring" => "io_uring";
        bucket: Str = "bucket" => "bucket", env(&["AWS_DEFAULT_BUCKET"]);
        secret_key: Str = "secret_key" => "secret", secret;
        mode: OneOf["dram", "dram_zc"] = "mode" => "mode";
    }
}
const PARAMS: &[ParamSpec] = FakeParams::SPECS;

macro_rules! fake {
    ($id:ident, $name:literal, $kind:ident, $prio:expr, $probe:ident, $build:ident) => {
        static $id: PluginDescriptor =
            PluginDescriptor::new($name, BackendKind::$kind, "fake", $probe, $build)
                .with_priority($prio)
                .with_params(PARAMS);
    };
}
fake!(THREEFS, "3FS", File, priority::THREEFS, unusable, no_build);
fake!(POSIX, "POSIX", File, priority::POSIX, usable, build_memory);
fake!(GDS_MT, "GDS_MT", File, priority::GDS_MT, usable, no_build);
fake!(GDS, "GDS", File, priority::GDS, usable, no_build);
fake!(OBJ, "OBJ", Object, priority::OBJ, usable, no_build);
fake!(
    POSIX_BROKEN,
    "POSIX",
    File,
    priority::POSIX,
    usable,
    no_build
);
fake!(POSIX_LOWER, "posix", File, 1, usable, no_build);
fake!(
    POSIX_DOWN,
    "POSIX",
    File,
    priority::POSIX,
    unusable,
    no_build
);

fn registry(list: &[&'static PluginDescriptor]) -> PluginRegistry {
    PluginRegistry::from_descriptors(list.iter().copied()).unwrap()
}

fn auto() -> Config {
    ConfigLoader::new().load().unwrap()
}

#[test]
fn order_is_deterministic_whatever_the_input_order() {
    let a = registry(&[&OBJ, &GDS, &POSIX, &THREEFS, &GDS_MT]);
    let b = registry(&[&GDS_MT, &THREEFS, &OBJ, &POSIX, &GDS]);
    let names = |r: &PluginRegistry| r.plugins().iter().map(|p| p.name).collect::<Vec<_>>();
    assert_eq!(names(&a), ["3FS", "POSIX", "GDS_MT", "GDS", "OBJ"]);
    assert_eq!(names(&a), names(&b));
}

#[test]
fn auto_takes_first_usable_and_explains() {
    let r = registry(&[&OBJ, &GDS, &POSIX, &THREEFS, &GDS_MT]);
    let s = r.select(&auto()).unwrap();
    assert_eq!(s.plugin.name, "POSIX");
    assert_eq!(s.considered.len(), 5);
    assert!(!s.considered[0].verdict.is_usable());
    assert!(s.considered[2..].iter().all(|c| !c.probed));
    let line = s.summary();
    assert!(
        line.contains("selected plugin POSIX")
            && line.contains("3FS [unusable: no mount; hint: mount it]"),
        "{line}"
    );
}

#[test]
fn explicit_unusable_is_an_error_not_a_fallback() {
    let r = registry(&[&THREEFS, &POSIX]);
    let cfg = ConfigLoader::new().set("plugin", "3fs").load().unwrap();
    let err = r.select(&cfg).unwrap_err();
    assert!(matches!(&err, Error::PluginUnusable { plugin, .. } if plugin == "3FS"));
    assert!(err.to_string().contains("mount it"));
}

#[test]
fn unknown_and_case_insensitive_names() {
    let r = registry(&[&POSIX, &GDS]);
    let cfg = ConfigLoader::new().set("plugin", "Posix").load().unwrap();
    assert_eq!(r.select(&cfg).unwrap().plugin.name, "POSIX");
    let cfg = ConfigLoader::new().set("plugin", "posx").load().unwrap();
    let err = r.select(&cfg).unwrap_err();
    assert!(err.to_string().contains("did you mean `POSIX`"), "{err}");
}

#[test]
fn duplicates_are_errors_but_the_same_static_is_merged() {
    assert!(PluginRegistry::from_descriptors([&POSIX, &POSIX]).is_ok());
    let err = PluginRegistry::from_descriptors([&POSIX, &POSIX_LOWER]).unwrap_err();
    assert!(matches!(err, Error::DuplicatePlugin { .. }));
}

#[test]
fn nothing_usable_lists_every_reason() {
    let r = registry(&[&THREEFS, &POSIX_DOWN]);
    let err = r.select(&auto()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("3FS: unusable: no mount") && msg.contains("POSIX"),
        "{msg}"
    );
    let empty = registry(&[]);
    assert!(empty.select(&auto()).is_err());
}

#[test]
fn auto_skips_a_plugin_whose_build_fails() {
    let r = registry(&[&POSIX_BROKEN, &GDS_MT, &OBJ]);
    let err = r.open(&auto()).unwrap_err();
    // Every plugin failed to build; each reason is reported.
    let msg = err.to_string();
    assert!(
        msg.contains("POSIX: unusable: build failed") && msg.contains("OBJ"),
        "{msg}"
    );
    let r = registry(&[&THREEFS, &POSIX]);
    let (backend, sel) = r.open(&auto()).unwrap();
    assert_eq!(sel.plugin.name, "POSIX");
    assert_eq!(backend.info().name, "MEMORY");
}

#[test]
fn params_are_typed_checked_and_redacted() {
    let r = registry(&[&POSIX]);
    let cfg = ConfigLoader::new()
        .set("plugin.posix.use_uring", "false")
        .set("plugin.posix.secret_key", "hunter2")
        .set("plugin.posix.mode", "DRAM_ZC")
        .env(EnvSnapshot::from_pairs([(
            "AWS_DEFAULT_BUCKET",
            "envbucket",
        )]))
        .load()
        .unwrap();
    let s = r.select(&cfg).unwrap();
    let p = FakeParams::from_params(&s.params);
    assert!(!p.use_uring.unwrap().value);
    let bucket = p.bucket.unwrap();
    assert_eq!(bucket.value, "envbucket");
    assert_eq!(
        bucket.source,
        crate::config::Source::Env("AWS_DEFAULT_BUCKET".into())
    );
    assert_eq!(p.mode.unwrap().value, "dram_zc");
    assert_eq!(p.secret_key.unwrap().value, "hunter2");
    assert!(!s.summary().contains("hunter2"));
    assert!(!format!("{:?}", s.params).contains("hunter2"));

    let cfg = ConfigLoader::new()
        .set("plugin.posix.bucket", "cfg")
        .env(EnvSnapshot::from_pairs([(
            "AWS_DEFAULT_BUCKET",
            "envbucket",
        )]))
        .load()
        .unwrap();
    assert_eq!(
        FakeParams::from_params(&r.select(&cfg).unwrap().params)
            .bucket
            .unwrap()
            .value,
        "cfg",
        "config beats the env fallback"
    );

    // A fallback variable whose value is not UTF-8 is an error naming it, not "unset".
    let cfg = ConfigLoader::new()
        .env(EnvSnapshot::from_os_pairs([(
            std::ffi::OsString::from("AWS_DEFAULT_BUCKET"),
            std::os::unix::ffi::OsStringExt::from_vec(vec![0xff]),
        )]))
        .load()
        .unwrap();
    let err = r.select(&cfg).unwrap_err().to_string();
    assert!(
        err.contains("AWS_DEFAULT_BUCKET") && err.contains("bucket") && err.contains("UTF-8"),
        "{err}"
    );

    let cfg = ConfigLoader::new()
        .set("plugin.posix.use_urin", "true")
        .load()
        .unwrap();
    let err = r.select(&cfg).unwrap_err();
    assert!(
        err.to_string().contains("did you mean `use_uring`"),
        "{err}"
    );
    let cfg = ConfigLoader::new()
        .set("plugin.posix.use_uring", "perhaps")
        .load()
        .unwrap();
    assert!(r.select(&cfg).is_err());
    let cfg = ConfigLoader::new()
        .set("plugin.posix.secret_key", 5)
        .load()
        .unwrap();
    let err = r.select(&cfg).unwrap_err().to_string();
    assert!(err.contains("***") && !err.contains('5'), "{err}");
}

#[test]
fn a_top_level_typo_is_one_error_before_any_probe() {
    let r = registry(&[&THREEFS, &POSIX, &OBJ]);
    for plugin in ["auto", "POSIX"] {
        let cfg = ConfigLoader::new()
            .extra_config(&format!(r#"{{"plugin": "{plugin}", "storge_dir": "/x"}}"#))
            .load()
            .unwrap();
        let e = r.select(&cfg).unwrap_err();
        assert!(matches!(e, Error::UnknownConfigKey { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("`storge_dir`"), "{text}");
        assert!(text.contains("did you mean `storage_dir`"), "{text}");
        assert_eq!(text.matches("storge_dir").count(), 1, "{text}");
    }
    // A parameter some plugin takes is not a typo.
    let cfg = ConfigLoader::new()
        .extra_config(r#"{"plugin": "auto", "use_uring": true}"#)
        .load()
        .unwrap();
    assert!(r.select(&cfg).is_ok());
}

#[test]
fn a_loader_told_the_plugins_rejects_a_typo_at_load_once() {
    let plugins: &[&'static PluginDescriptor] = &[&THREEFS, &POSIX, &OBJ];
    let e = ConfigLoader::new()
        .plugins(plugins)
        .extra_config(r#"{"plugin": "auto", "storge_dir": "/x"}"#)
        .load()
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::UnknownConfigKey { .. }), "{text}");
    assert!(text.contains("did you mean `storage_dir`"), "{text}");
    assert!(text.contains("the top level of inline config"), "{text}");
    assert_eq!(text.matches("storge_dir").count(), 1, "{text}");
    // A parameter one of the plugins takes loads, flat or in its section.
    ConfigLoader::new()
        .plugins(plugins)
        .extra_config(r#"{"use_uring": true}"#)
        .load()
        .unwrap();
    ConfigLoader::new()
        .plugins(plugins)
        .set("plugin.posix.use_uring", true)
        .load()
        .unwrap();
    // A section key its plugin does not take is refused; a section of a plugin this
    // build lacks is left for selection.
    let e = ConfigLoader::new()
        .plugins(plugins)
        .set("plugin.posix.use_urng", true)
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[plugin.posix]") && e.contains("did you mean `use_uring`"),
        "{e}"
    );
    ConfigLoader::new()
        .plugins(plugins)
        .set("plugin.gds.whatever", 1)
        .load()
        .unwrap();
    // Without the list, the same config loads and selection refuses it.
    ConfigLoader::new()
        .set("plugin.posix.use_urng", true)
        .load()
        .unwrap();
}

/// Odd keys (empty, very long, non-ASCII, a dotted name, a non-table section) are one
/// error each at load, never a panic, and name what was written.
#[test]
fn hostile_keys_are_errors_at_load() {
    let plugins: &[&'static PluginDescriptor] = &[&POSIX, &OBJ];
    let long = "k".repeat(10_000);
    for doc in [
        r#"{"": 1}"#.to_string(),
        format!(r#"{{"{long}": 1}}"#),
        r#"{"stórage_dir": "/x"}"#.to_string(),
        r#"{"plugin.posix.engine": "threads"}"#.to_string(),
        r#"{"plugin": {"posix": 5}}"#.to_string(),
        r#"{"plugin": {"posix": {"active": true, "": 1}}}"#.to_string(),
    ] {
        let e = ConfigLoader::new()
            .plugins(plugins)
            .extra_config(&doc)
            .load()
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::UnknownConfigKey { .. } | Error::InvalidConfig { .. }
            ),
            "{doc}: {e}"
        );
    }
}

#[test]
fn flat_params_steer_auto_to_a_plugin_they_fit() {
    static NO_PARAMS: PluginDescriptor =
        PluginDescriptor::new("3FS", BackendKind::File, "fake", usable, no_build)
            .with_priority(priority::THREEFS);
    let r = registry(&[&NO_PARAMS, &POSIX]);
    let cfg = ConfigLoader::new()
        .extra_config(r#"{"use_uring": "true"}"#)
        .load()
        .unwrap();
    let s = r.select(&cfg).unwrap();
    assert_eq!(s.plugin.name, "POSIX");
    assert!(s.considered[0].verdict.to_string().contains("use_uring"));
}

/// Found by [`counting_probe`]; its build requires it.
#[derive(Debug, PartialEq)]
struct Slots(u32);

static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn counting_probe(_: &PluginContext<'_>) -> Probe {
    PROBES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Probe::usable("8 slots")
        .fact("/dev/fake0", "slots", 8u64)
        .with_findings(Slots(8))
}

fn build_with_findings(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    match ctx.findings::<Slots>() {
        Some(Slots(8)) => build_memory(ctx),
        other => Err(Error::backend("FAKE", format!("findings: {other:?}"))),
    }
}

static FINDER: PluginDescriptor = PluginDescriptor::new(
    "FINDER",
    BackendKind::File,
    "fake",
    counting_probe,
    build_with_findings,
);

#[test]
fn the_probe_runs_once_and_its_build_gets_the_findings() {
    let r = registry(&[&FINDER, &OBJ]);
    let cfg = auto();
    let before = PROBES.load(std::sync::atomic::Ordering::SeqCst);
    let probed = r.probe_all(&cfg);
    assert_eq!(probed[0].facts[0].value, crate::FactValue::Count(8));
    let selection = r.select_probed(&cfg, &probed).unwrap();
    assert_eq!(selection.plugin.name, "FINDER");
    r.build(&cfg, &selection).unwrap();
    assert_eq!(PROBES.load(std::sync::atomic::Ordering::SeqCst) - before, 1);
    // open probes once and builds with the findings; a build without them fails.
    r.open(&cfg).unwrap();
    assert_eq!(PROBES.load(std::sync::atomic::Ordering::SeqCst) - before, 2);
    let params = params_for(&FINDER, &cfg).unwrap();
    let e = FINDER
        .build(&PluginContext::new(&cfg, &params))
        .err()
        .unwrap();
    assert!(e.to_string().contains("findings: None"), "{e}");
}

#[test]
fn a_section_for_a_plugin_the_registry_lacks_is_a_warning_with_the_fix() {
    let r = registry(&[&POSIX]);
    let cfg = ConfigLoader::new()
        .set("plugin.acme.depth", 4)
        .set("plugin.posix.use_uring", true)
        .load()
        .unwrap();
    let warnings = r.unregistered_sections(&cfg);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("[plugin.acme]") && warnings[0].contains("registered: POSIX"));
    let s = r.select(&cfg).unwrap();
    assert_eq!(s.warnings, warnings);
    // A third-party name that is not registered: the error says how plugins get registered.
    let e = Error::unknown_plugin("ACME", ["POSIX"]).to_string();
    assert!(
        e.contains("dropped by the linker") && e.contains("plugin_dirs"),
        "{e}"
    );
    // One of hicache's own: the feature is the fix.
    let e = Error::unknown_plugin("OBJ", ["POSIX"]).to_string();
    assert!(e.contains("`obj` feature") && !e.contains("linker"), "{e}");
}
