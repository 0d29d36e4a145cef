//! The GDS and GDS_MT plugins as selection sees them, against the stand-in cuFile: their
//! parameters, what the probe says on bad input and on a machine without cuFile, the
//! priority order, and how a failed cuFile call reaches the caller.

mod support;

use hicache_core::raw::{
    BackendKind, DynBackend, ObjectKey, PluginContext, PluginDescriptor, ReadItem, Slice,
    WriteItem, params_for,
};
use hicache_core::{ConfigLoader, Error, MemoryRegion, PluginRegistry};
use hicache_gds::{BatchParams, CuFileParams, GDS, GDS_DESCRIPTOR, GDS_MT, GDS_MT_DESCRIPTOR};
use hicache_posix::FileLayerParams;
use hicache_testkit::params::{check_params_read_by, read_by};

/// A dir on the build's filesystem (O_DIRECT works there; /tmp may be tmpfs).
fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn section(plugin: &PluginDescriptor) -> String {
    format!("plugin.{}", plugin.name.to_ascii_lowercase())
}

/// A config for `plugin` over `store` with the stand-in and `extra` settings.
fn config(
    plugin: &PluginDescriptor,
    store: &std::path::Path,
    extra: &[(&str, &str)],
) -> hicache_core::Result<hicache_core::Config> {
    let mut loader = ConfigLoader::new()
        .set("storage_dir", store.display().to_string())
        .set(
            format!("{}.cufile_path", section(plugin)),
            support::cufile().display().to_string(),
        );
    for (k, v) in extra {
        loader = loader.set(format!("{}.{k}", section(plugin)), *v);
    }
    loader.load()
}

/// The probe's verdict and, when usable, the backend built from its findings.
fn open(
    plugin: &'static PluginDescriptor,
    config: &hicache_core::Config,
) -> Result<DynBackend, String> {
    let params = params_for(plugin, config).map_err(|e| e.to_string())?;
    let ctx = PluginContext::new(config, &params);
    let probe = plugin.probe(&ctx);
    if !probe.verdict().is_usable() {
        return Err(probe.verdict().to_string());
    }
    plugin
        .build(&ctx.with_findings(probe.findings()))
        .map_err(|e| e.to_string())
}

#[test]
fn every_declared_parameter_reaches_the_plugins() {
    check_params_read_by(
        &GDS_MT_DESCRIPTOR,
        &[&read_by::<CuFileParams>, &read_by::<FileLayerParams>],
    );
    check_params_read_by(
        &GDS_DESCRIPTOR,
        &[
            &read_by::<CuFileParams>,
            &read_by::<FileLayerParams>,
            &read_by::<BatchParams>,
        ],
    );
}

#[test]
fn both_are_file_plugins_ranked_below_posix() {
    let registry = PluginRegistry::from_descriptors([
        &hicache_posix::DESCRIPTOR,
        &GDS_DESCRIPTOR,
        &GDS_MT_DESCRIPTOR,
    ])
    .unwrap();
    let order: Vec<&str> = registry.plugins().iter().map(|p| p.name).collect();
    assert_eq!(order, ["POSIX", GDS_MT, GDS]);
    assert!(
        [&GDS_DESCRIPTOR, &GDS_MT_DESCRIPTOR]
            .iter()
            .all(|p| p.kind == BackendKind::File)
    );
}

#[test]
fn bad_parameters_are_refused_by_name() {
    let store = dir();
    for (extra, named) in [
        (("batch_limit", "0"), "batch_limit"),
        (("batch_limit", "5000"), "batch_limit"),
        (("max_request_size", "100"), "max_request_size"),
        (("max_request_size", "0"), "max_request_size"),
        (("threads", "0"), "threads"),
        (("sync", "sometimes"), "sync"),
        (("file_mode", "0o400"), "file_mode"),
    ] {
        let e = config(&GDS_DESCRIPTOR, store.path(), &[extra])
            .map_err(|e| e.to_string())
            .and_then(|c| open(&GDS_DESCRIPTOR, &c).map(drop));
        let e = e.expect_err(named);
        assert!(e.contains(named), "{extra:?}: {e}");
    }
    // POSIX's engine choices and GDS's batch settings are not GDS_MT's parameters.
    for key in ["engine", "queue_depth", "batch_limit"] {
        let e = config(&GDS_MT_DESCRIPTOR, store.path(), &[(key, "8")])
            .map_err(|e| e.to_string())
            .and_then(|c| open(&GDS_MT_DESCRIPTOR, &c).map(drop))
            .expect_err(key);
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn without_cufile_both_are_unusable_with_the_paths_tried() {
    let store = dir();
    let missing = store.path().join("lib").join("libcufile.so.0");
    for plugin in [&GDS_DESCRIPTOR, &GDS_MT_DESCRIPTOR] {
        let c = config(
            plugin,
            store.path(),
            &[("cufile_path", missing.to_str().unwrap())],
        )
        .unwrap();
        let e = open(plugin, &c).expect_err("no library");
        assert!(
            e.contains(missing.to_str().unwrap()) && e.contains("cufile_path"),
            "{e}"
        );
        assert!(
            !missing.exists() && std::fs::read_dir(store.path()).unwrap().count() == 0,
            "the probe creates nothing"
        );
    }
}

#[test]
fn a_batch_limit_above_cufiles_io_batchsize_is_refused_by_the_probe() {
    let _turn = support::serial();
    let store = dir();
    let c = config(&GDS_DESCRIPTOR, store.path(), &[("batch_limit", "256")]).unwrap();
    let e = open(&GDS_DESCRIPTOR, &c).expect_err("over io_batchsize");
    assert!(
        e.contains("256") && e.contains("io_batchsize") && e.contains("GDS_MT"),
        "{e}"
    );
    let c = config(&GDS_DESCRIPTOR, store.path(), &[("batch_limit", "128")]).unwrap();
    open(&GDS_DESCRIPTOR, &c).unwrap();
}

#[test]
fn the_udev_trap_makes_both_unusable_with_its_hint() {
    let _turn = support::serial();
    let store = dir();
    support::fail("cuFileHandleRegister", 5027);
    let results: Vec<_> = [&GDS_DESCRIPTOR, &GDS_MT_DESCRIPTOR]
        .into_iter()
        .map(|p| open(p, &config(p, store.path(), &[]).unwrap()).map(drop))
        .collect();
    support::fail("cuFileHandleRegister", 0);
    for r in results {
        let e = r.expect_err("5027");
        assert!(
            e.contains("CU_FILE_HANDLE_NOT_REGISTERED") && e.contains("/run/udev/data"),
            "{e}"
        );
    }
}

fn region(len: usize) -> MemoryRegion {
    MemoryRegion::from_aligned(hicache_core::raw::AlignedBuf::zeroed(len, 4096).unwrap())
}

/// A failed cuFile transfer reaches the caller as an error of that item naming the call
/// and cuFile's error.
#[test]
fn a_failed_transfer_names_the_cufile_call_and_error() {
    // Injected failures are process-wide: the whole test takes its turn.
    let _turn = support::serial();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(failed_transfers());
}

async fn failed_transfers() {
    let store = dir();
    for (plugin, call, shown) in [
        (&GDS_MT_DESCRIPTOR, "cuFileRead", "cuFileRead"),
        (&GDS_DESCRIPTOR, "cuFileBatchIOSubmit", "cuFile batch read"),
    ] {
        let b = open(plugin, &config(plugin, store.path(), &[]).unwrap()).unwrap();
        let info = b.info();
        assert!(info.capability.device_memory && info.capability.host_memory);
        assert!(
            !info.capability.gpu_direct,
            "the stand-in is no GPUDirect path"
        );
        let memory = region(8192);
        let id = b.register(memory.clone()).unwrap();
        let k = ObjectKey::new(format!("{}-failing", plugin.name.to_lowercase())).unwrap();
        let segs = [Slice::new(id, 0, 4096)];
        let w = b
            .write(&[WriteItem {
                key: &k,
                segments: &segs,
            }])
            .await;
        assert!(w.iter().all(Result::is_ok), "{w:?}");
        support::fail(call, 5011);
        let r = b
            .read(&[ReadItem {
                key: &k,
                segments: &[Slice::new(id, 4096, 4096)],
            }])
            .await;
        support::fail(call, 0);
        match &r[..] {
            [Err(e @ Error::Io { op, .. })] => {
                assert_eq!(*op, shown, "{e}");
                assert!(e.to_string().contains("CU_FILE_CUDA_DRIVER_ERROR"), "{e}");
            }
            other => panic!("{}: {other:?}", plugin.name),
        }
        b.deregister(id).unwrap();
    }
}
