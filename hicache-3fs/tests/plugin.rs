//! The 3FS plugin as selection sees it, against the USRBIO stand-in: its parameters, what
//! the probe says on bad input, without the library and on a dir that is not on 3FS, and
//! auto-selection above POSIX on a mount.

mod support;

use std::path::Path;

use hicache_3fs::{DESCRIPTOR, ThreeFsParams};
use hicache_core::raw::{PluginContext, params_for};
use hicache_core::{ConfigLoader, PluginRegistry};
use hicache_posix::FileLayerParams;
use hicache_testkit::params::{check_params_read_by, read_by};
use hicache_testkit::standins::make_usrbio_mount;

fn config(store: &Path, extra: &[(&str, &str)]) -> hicache_core::Result<hicache_core::Config> {
    let mut loader = ConfigLoader::new()
        .set("storage_dir", store.display().to_string())
        .set(
            "plugin.3fs.usrbio_path",
            support::library().display().to_string(),
        );
    for (k, v) in extra {
        loader = loader.set(format!("plugin.3fs.{k}"), *v);
    }
    loader.load()
}

/// The probe's verdict, as text, and whether it is usable.
fn verdict(config: &hicache_core::Config) -> Result<String, String> {
    let params = params_for(&DESCRIPTOR, config).map_err(|e| e.to_string())?;
    let probe = DESCRIPTOR.probe(&PluginContext::new(config, &params));
    let text = probe.verdict().to_string();
    if probe.verdict().is_usable() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn mount() -> tempfile::TempDir {
    let m = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    make_usrbio_mount(m.path()).unwrap();
    m
}

#[test]
fn every_declared_parameter_reaches_the_plugin() {
    check_params_read_by(
        &DESCRIPTOR,
        &[&read_by::<ThreeFsParams>, &read_by::<FileLayerParams>],
    );
}

#[test]
fn bad_parameters_are_refused_by_name() {
    let m = mount();
    for (extra, named) in [
        (("iov_bytes", "100"), "iov_bytes"),
        (("iov_bytes", "4096"), "iov_bytes"),
        (("iov_bytes", "4294967296"), "iov_bytes"),
        (("ring_entries", "0"), "ring_entries"),
        (("ring_entries", "5000"), "ring_entries"),
        (("threads", "0"), "threads"),
        (("sync", "maybe"), "sync"),
        (("engine", "uring"), "engine"),
        (("io_batch", "65"), "io_batch"),
        (("io_batch_timeout_ms", "5"), "io_batch_timeout_ms"),
    ] {
        let e = config(&m.path().join("kv"), &[extra])
            .map_err(|e| e.to_string())
            .and_then(|c| verdict(&c))
            .expect_err(named);
        assert!(e.contains(named), "{extra:?}: {e}");
    }
    let e = config(
        &m.path().join("kv"),
        &[("io_batch", "8"), ("io_batch_timeout_ms", "2000")],
    )
    .map_err(|e| e.to_string())
    .and_then(|c| verdict(&c))
    .unwrap_err();
    assert!(
        e.contains("io_batch_timeout_ms") && e.contains("0..=1000"),
        "{e}"
    );
    let ok = config(
        &m.path().join("kv"),
        &[("io_batch", "8"), ("io_batch_timeout_ms", "1")],
    )
    .unwrap();
    verdict(&ok).unwrap();
}

#[test]
fn the_probe_says_what_is_missing_and_creates_nothing() {
    let plain = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // The trap: the library is there, the dir is not on 3FS.
    let e = verdict(&config(plain.path(), &[]).unwrap()).unwrap_err();
    assert!(
        e.contains("not on a 3FS mount") && e.contains("hf3fs_fuse"),
        "{e}"
    );
    // No library.
    let missing = plain.path().join("lib").join("libhf3fs_api_shared.so");
    let c = config(plain.path(), &[("usrbio_path", missing.to_str().unwrap())]).unwrap();
    let e = verdict(&c).unwrap_err();
    assert!(
        e.contains(missing.to_str().unwrap()) && e.contains("usrbio_path"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(plain.path()).unwrap().count(), 0);
    // Dirs under two different mounts.
    let (a, b) = (mount(), mount());
    let two = ConfigLoader::new()
        .set(
            "storage_dir",
            format!("{},{}", a.path().display(), b.path().display()),
        )
        .set(
            "plugin.3fs.usrbio_path",
            support::library().display().to_string(),
        )
        .load()
        .unwrap();
    let e = verdict(&two).unwrap_err();
    assert!(e.contains("2 different 3FS mounts"), "{e}");
}

#[test]
fn auto_picks_3fs_above_posix_on_a_mount_and_posix_elsewhere() {
    let registry =
        PluginRegistry::from_descriptors([&hicache_posix::DESCRIPTOR, &DESCRIPTOR]).unwrap();
    assert_eq!(registry.plugins()[0].name, "3FS");
    let m = mount();
    let on = config(&m.path().join("kv"), &[]).unwrap();
    let (backend, selection) = registry.open(&on).unwrap();
    assert_eq!(selection.plugin.name, "3FS");
    assert_eq!(backend.info().name, "3FS");
    let plain = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let off = config(plain.path(), &[]).unwrap();
    let (_, selection) = registry.open(&off).unwrap();
    assert_eq!(selection.plugin.name, "POSIX");
}
