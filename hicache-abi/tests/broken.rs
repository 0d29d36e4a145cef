//! Broken plugins, built on purpose, against the host: each gets a typed error that names
//! the file or the plugin, and none corrupts memory or takes the process down.

mod support;

use std::os::unix::fs::PermissionsExt;

use hicache_abi::{LoadError, load_dirs, load_file};
use hicache_core::raw::{
    AlignedBuf, BackendKind, DynBackend, MemoryRegion, ObjectKey, PluginContext, PluginDescriptor,
    Probe, ReadItem, Slice, WriteItem, params_for,
};
use hicache_core::{ConfigLoader, Error, Result};

fn c_load(
    name: &str,
    defines: &[&str],
) -> std::result::Result<&'static PluginDescriptor, LoadError> {
    let (_, file) = support::c_plugin(name, defines);
    load_file(&file)
}

#[test]
fn a_wrong_abi_version_is_refused_by_name() {
    let e = c_load("abi", &["HICACHE_BROKEN_ABI"]).unwrap_err();
    assert!(
        matches!(
            e,
            LoadError::AbiVersion {
                found: 99,
                expected: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("libabi.so") && e.to_string().contains("rebuild"),
        "{e}"
    );
}

#[test]
fn a_short_table_is_refused() {
    let e = c_load("short", &["HICACHE_BROKEN_SIZE"]).unwrap_err();
    assert!(matches!(e, LoadError::TableSize { found: 16, .. }), "{e:?}");
}

#[test]
fn a_null_name_is_refused_naming_the_field() {
    let e = c_load("nullname", &["HICACHE_BROKEN_NULL_NAME"]).unwrap_err();
    assert!(
        matches!(&e, LoadError::BadTable { field, .. } if field == "name"),
        "{e:?}"
    );
}

#[test]
fn a_null_function_is_refused_naming_the_field() {
    let e = c_load("nullsubmit", &["HICACHE_BROKEN_NULL_SUBMIT"]).unwrap_err();
    assert!(
        matches!(&e, LoadError::BadTable { field, .. } if field == "submit"),
        "{e:?}"
    );
}

#[test]
fn a_library_without_the_entry_is_not_a_plugin() {
    let e = c_load("noentry", &["HICACHE_BROKEN_NO_ENTRY"]).unwrap_err();
    assert!(matches!(e, LoadError::MissingSymbol { .. }), "{e:?}");
}

#[test]
fn an_entry_returning_null_failed_to_initialise() {
    let e = c_load("noinit", &["HICACHE_BROKEN_INIT"]).unwrap_err();
    assert!(matches!(e, LoadError::InitFailed { .. }), "{e:?}");
}

#[test]
fn a_file_that_is_not_a_library_cannot_be_opened() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("libtext.so");
    std::fs::write(&file, "not an ELF file").unwrap();
    let e = load_file(&file).unwrap_err();
    assert!(matches!(e, LoadError::CannotOpen { .. }), "{e:?}");
    let missing = load_file(&dir.path().join("libmissing.so")).unwrap_err();
    assert!(
        matches!(missing, LoadError::CannotOpen { .. }),
        "{missing:?}"
    );
    std::fs::create_dir(dir.path().join("libdir.so")).unwrap();
    let e = load_file(&dir.path().join("libdir.so")).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { reason, .. } if reason.contains("not a regular file")),
        "{e:?}"
    );
    // A plugin dir that is a file.
    let loaded = load_dirs(std::slice::from_ref(&file), &[]);
    assert!(loaded.plugins.is_empty());
    assert!(
        matches!(&loaded.rejected[..], [LoadError::Dir { dir, .. }] if *dir == file),
        "{:?}",
        loaded.rejected
    );
}

#[test]
fn links_and_files_others_may_write_are_refused() {
    let (_, real) = support::c_plugin("linked", &["HICACHE_PLUGIN_NAME=\"LINKED\""]);
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("liblink.so");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = load_file(&link).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { reason, .. } if reason.contains("symbolic link")),
        "{e:?}"
    );
    // A link that leads nowhere is refused as a link too, not reported as a missing file.
    let dangling = dir.path().join("libgone.so");
    std::os::unix::fs::symlink(dir.path().join("nowhere.so"), &dangling).unwrap();
    let e = load_file(&dangling).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { reason, .. } if reason.contains("symbolic link")),
        "{e:?}"
    );
    let open = dir.path().join("libopen.so");
    std::fs::copy(&real, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = load_file(&open).unwrap_err();
    assert!(
        matches!(&e, LoadError::Refused { reason, .. } if reason.contains("writable by every user")),
        "{e:?}"
    );
}

static POSIX_LOOKALIKE: PluginDescriptor = PluginDescriptor::new(
    "POSIX",
    BackendKind::File,
    "a built-in plugin of this test",
    |_| Probe::unusable("test", "test"),
    |_: &PluginContext<'_>| -> Result<DynBackend> { Err(Error::backend("POSIX", "test")) },
);

#[test]
fn a_dir_loads_its_plugins_and_reports_the_rest() {
    let (dir, _) = support::c_plugin("dirscan", &["HICACHE_PLUGIN_NAME=\"DIRSCAN\""]);
    // A second library of the same name, a built-in's name, a broken one and a file
    // that is not a library, all in one dir.
    let (_, twin) = support::c_plugin("dirscan-twin", &["HICACHE_PLUGIN_NAME=\"DIRSCAN\""]);
    std::fs::copy(&twin, dir.join("libzz-twin.so")).unwrap();
    let (_, posix) = support::c_plugin("posix-name", &["HICACHE_PLUGIN_NAME=\"POSIX\""]);
    std::fs::copy(&posix, dir.join("libposix.so")).unwrap();
    let (_, abi) = support::c_plugin("dirscan-abi", &["HICACHE_BROKEN_ABI"]);
    std::fs::copy(&abi, dir.join("libold.so")).unwrap();
    std::fs::write(dir.join("README.txt"), "ignored: not a .so").unwrap();
    let missing = dir.join("no-such-dir");

    let loaded = load_dirs(&[dir.clone(), missing.clone()], &[&POSIX_LOOKALIKE]);
    let names: Vec<&str> = loaded.plugins.iter().map(|p| p.name).collect();
    assert_eq!(names, ["DIRSCAN"]);
    assert_eq!(
        loaded.plugins[0].origin.to_string(),
        dir.join("libdirscan.so").display().to_string()
    );
    let reasons: Vec<String> = loaded.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(loaded.rejected.len(), 4, "{reasons:#?}");
    assert!(
        loaded
            .rejected
            .iter()
            .any(|e| matches!(e, LoadError::AbiVersion { .. }))
    );
    assert!(loaded.rejected.iter().any(|e| matches!(
        e,
        LoadError::DuplicateName { name, taken_by, .. } if name == "POSIX" && taken_by == "built-in"
    )));
    assert!(loaded.rejected.iter().any(|e| matches!(
        e,
        LoadError::DuplicateName { name, path, .. } if name == "DIRSCAN" && path.ends_with("libzz-twin.so")
    )));
    assert!(loaded.rejected.iter().any(|e| matches!(
        e,
        LoadError::Dir { dir, .. } if *dir == missing
    )));
    // Loading again opens nothing new: the same descriptor comes back.
    let again = load_dirs(&[dir], &[&POSIX_LOOKALIKE]);
    assert!(std::ptr::eq(again.plugins[0], loaded.plugins[0]));
}

fn host_buffer(b: &DynBackend, len: usize) -> (hicache_core::raw::RegionId, MemoryRegion) {
    let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(len, 4096).unwrap());
    let id = b.register(region.clone()).unwrap();
    (id, region)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Writes, reads, asks and removes 3 keys; returns every per-item result as text.
fn exercise(b: &DynBackend) -> Vec<String> {
    let (id, _region) = host_buffer(b, 3 * 4096);
    let keys: Vec<ObjectKey> = (0..3)
        .map(|i| ObjectKey::new(format!("k{i}")).unwrap())
        .collect();
    let segs: Vec<[Slice; 1]> = (0..3).map(|i| [Slice::new(id, i * 4096, 4096)]).collect();
    let rt = runtime();
    let writes: Vec<WriteItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, s)| WriteItem { key, segments: s })
        .collect();
    let reads: Vec<ReadItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, s)| ReadItem { key, segments: s })
        .collect();
    let mut out = Vec::new();
    out.extend(
        rt.block_on(b.write(&writes))
            .into_iter()
            .map(|r| format!("{r:?}")),
    );
    out.extend(
        rt.block_on(b.read(&reads))
            .into_iter()
            .map(|r| format!("{r:?}")),
    );
    out.extend(
        rt.block_on(b.exists(&keys))
            .into_iter()
            .map(|r| format!("{r:?}")),
    );
    out.extend(
        rt.block_on(b.remove(&keys))
            .into_iter()
            .map(|r| format!("{r:?}")),
    );
    // Every pin is gone once the calls returned: the region deregisters.
    b.deregister(id).unwrap();
    out
}

fn broken_backend(name: &str, defines: &[&str]) -> (DynBackend, tempfile::TempDir) {
    let plugin = c_load(name, defines).unwrap();
    let store = tempfile::tempdir().unwrap();
    (support::open(plugin, store.path()).unwrap(), store)
}

#[test]
fn a_wrong_result_count_fails_every_item_with_a_contract_error() {
    let (b, _store) = broken_backend(
        "count",
        &["HICACHE_BROKEN_COUNT", "HICACHE_PLUGIN_NAME=\"COUNT\""],
    );
    let results = exercise(&b);
    assert_eq!(results.len(), 12);
    for r in &results {
        assert!(
            r.contains("PluginContract")
                && r.contains("completed a batch of 3 items with 4 results"),
            "{r}"
        );
    }
}

#[test]
fn an_index_outside_the_batch_is_a_contract_error() {
    let (b, _store) = broken_backend(
        "index",
        &["HICACHE_BROKEN_INDEX", "HICACHE_PLUGIN_NAME=\"INDEX\""],
    );
    let results = exercise(&b);
    // Item 0's result named item 10: item 0 has none, and says which index was wrong.
    for op in results.chunks(3) {
        assert!(
            op[0].contains("PluginContract") && op[0].contains("item 10"),
            "{op:?}"
        );
    }
    assert!(results[1].starts_with("Ok"), "{results:?}");
}

#[test]
fn a_repeated_index_is_a_contract_error() {
    let (b, _store) = broken_backend(
        "dup",
        &["HICACHE_BROKEN_DUP", "HICACHE_PLUGIN_NAME=\"DUP\""],
    );
    for r in exercise(&b) {
        assert!(r.contains("PluginContract"), "{r}");
    }
}

#[test]
fn an_unknown_status_is_a_contract_error() {
    let (b, _store) = broken_backend(
        "status",
        &["HICACHE_BROKEN_STATUS", "HICACHE_PLUGIN_NAME=\"STATUS\""],
    );
    for r in exercise(&b) {
        assert!(
            r.contains("PluginContract") && r.contains("status 42"),
            "{r}"
        );
    }
}

#[test]
fn a_null_result_array_is_a_contract_error() {
    let (b, _store) = broken_backend(
        "nullresults",
        &[
            "HICACHE_BROKEN_NULL_RESULTS",
            "HICACHE_PLUGIN_NAME=\"NULLRESULTS\"",
        ],
    );
    for r in exercise(&b) {
        assert!(
            r.contains("PluginContract") && r.contains("NULL result array"),
            "{r}"
        );
    }
}

#[test]
fn a_null_instance_from_open_is_a_contract_error() {
    let plugin = c_load(
        "nullinstance",
        &[
            "HICACHE_BROKEN_NULL_INSTANCE",
            "HICACHE_PLUGIN_NAME=\"NULLINSTANCE\"",
        ],
    )
    .unwrap();
    let store = tempfile::tempdir().unwrap();
    let e = support::open(plugin, store.path()).unwrap_err();
    assert!(
        matches!(&e, Error::PluginContract { detail, .. } if detail.contains("NULL instance")),
        "{e:?}"
    );
}

#[test]
fn a_second_completion_of_a_batch_is_ignored() {
    let (b, _store) = broken_backend(
        "twice",
        &["HICACHE_BROKEN_TWICE", "HICACHE_PLUGIN_NAME=\"TWICE\""],
    );
    let results = exercise(&b);
    assert!(results[..3].iter().all(|r| r == "Ok(())"), "{results:?}");
    assert!(results[3..6].iter().all(|r| r == "Ok(Hit)"), "{results:?}");
}

#[test]
fn an_invalid_capability_fails_the_build_naming_the_field() {
    let plugin = c_load(
        "align",
        &["HICACHE_BROKEN_ALIGN", "HICACHE_PLUGIN_NAME=\"ALIGN\""],
    )
    .unwrap();
    let store = tempfile::tempdir().unwrap();
    let e = support::open(plugin, store.path()).unwrap_err();
    assert!(
        matches!(&e, Error::PluginContract { detail, .. } if detail.contains("capability.io_alignment is 3")),
        "{e:?}"
    );
}

#[test]
fn a_panicking_rust_plugin_reports_errors_and_the_host_lives_on() {
    let (_, file) = support::rust_plugin("panicky");
    let plugin = load_file(&file).unwrap();
    let store = tempfile::tempdir().unwrap();
    let b = support::open(plugin, store.path()).unwrap();
    for r in exercise(&b) {
        assert!(
            r.contains("the plugin panicked") && r.contains("on purpose"),
            "{r}"
        );
    }
    let usage = runtime().block_on(b.usage()).unwrap_err();
    assert!(usage.to_string().contains("panicked"), "{usage}");

    let config = ConfigLoader::new()
        .set("storage_dir", store.path().to_str().unwrap())
        .set("plugin.panicky.probe_panics", true)
        .load()
        .unwrap();
    let params = params_for(plugin, &config).unwrap();
    let probe = plugin.probe(&PluginContext::new(&config, &params));
    assert!(
        probe.verdict().to_string().contains("the probe panicked"),
        "{}",
        probe.verdict()
    );
}

#[test]
fn a_dropped_call_waits_for_the_plugin_and_leaves_nothing_pinned() {
    let (_, file) = support::rust_plugin("kvdir");
    let plugin = load_file(&file).unwrap();
    let store = tempfile::tempdir().unwrap();
    let b = support::open(plugin, store.path()).unwrap();
    let (id, region) = host_buffer(&b, 64 * 65536);
    let keys: Vec<ObjectKey> = (0..64)
        .map(|i| ObjectKey::new(format!("d{i}")).unwrap())
        .collect();
    let segs: Vec<[Slice; 1]> = (0..64)
        .map(|i| [Slice::new(id, i * 65536, 65536)])
        .collect();
    let writes: Vec<WriteItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, s)| WriteItem { key, segments: s })
        .collect();
    let rt = runtime();
    rt.block_on(async {
        let mut call = Box::pin(b.write(&writes));
        // Polled once (handed over), then dropped while the plugin works.
        let _ = futures_poll_once(call.as_mut()).await;
        drop(call);
    });
    assert_eq!(region.in_flight(), 0);
    b.deregister(id).unwrap();
}

async fn futures_poll_once<F: std::future::Future + Unpin>(mut fut: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut fut).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// A CFILE variant opened on a store holding objects `a1`, `a2`, `a3` (files CFILE lists).
fn listing_backend(name: &str, defines: &[&str]) -> (DynBackend, tempfile::TempDir) {
    let (b, store) = broken_backend(name, defines);
    for key in ["a1", "a2", "a3"] {
        std::fs::write(store.path().join("cfile").join(key), key).unwrap();
    }
    (b, store)
}

fn list(b: &DynBackend, limit: usize) -> Result<hicache_core::raw::ListPage> {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(b.list("", None, limit))
}

#[test]
fn a_plugin_lists_through_the_abi_page_by_page() {
    let (b, _store) = listing_backend("lister", &["HICACHE_PLUGIN_NAME=\"LISTER\""]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let all = rt
        .block_on(hicache_core::raw::list_all(b.as_ref(), "a", 2))
        .unwrap();
    let keys: Vec<&str> = all.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["a1", "a2", "a3"]);
    assert!(
        all.iter().all(|l| l.size == 2 && l.modified.is_some()),
        "{all:?}"
    );
    let none = rt.block_on(b.list("b", None, 10)).unwrap();
    assert!(none.objects.is_empty() && none.next.is_none(), "{none:?}");
    // A prefix no key can have, and cursors it never made: a page or InvalidBatch.
    assert!(
        rt.block_on(b.list("a\0", None, 10))
            .unwrap()
            .objects
            .is_empty()
    );
    let nul = hicache_core::raw::ListCursor("a\0b".into());
    let huge = hicache_core::raw::ListCursor("x".repeat(1 << 20));
    for cursor in [nul, huge] {
        let e = rt.block_on(b.list("", Some(&cursor), 10)).unwrap_err();
        assert!(matches!(e, Error::InvalidBatch { .. }), "{e:?}");
    }
}

#[test]
fn a_table_without_list_or_built_before_it_lists_as_unsupported() {
    for (name, define) in [
        ("nolist", "HICACHE_BROKEN_NO_LIST"),
        ("beforelist", "HICACHE_TABLE_BEFORE_LIST"),
    ] {
        let upper = name.to_uppercase();
        let plugin_name = format!("HICACHE_PLUGIN_NAME=\"{upper}\"");
        let (b, _store) = listing_backend(name, &[define, &plugin_name]);
        let e = list(&b, 10).unwrap_err();
        assert!(
            matches!(e, Error::Unsupported { .. }) && e.to_string().contains(&upper),
            "{define}: {e:?}"
        );
    }
}

#[test]
fn a_listing_that_breaks_the_contract_is_a_contract_error() {
    for (name, define, says) in [
        (
            "listover",
            "HICACHE_BROKEN_LIST_OVER",
            "3 objects for a page of at most 2",
        ),
        ("listkey", "HICACHE_BROKEN_LIST_KEY", "\"../escape\""),
        ("listsilent", "HICACHE_BROKEN_LIST_SILENT", "0 times"),
        ("listtwice", "HICACHE_BROKEN_LIST_TWICE", "more than once"),
    ] {
        let upper = name.to_uppercase();
        let plugin_name = format!("HICACHE_PLUGIN_NAME=\"{upper}\"");
        let (b, _store) = listing_backend(name, &[define, &plugin_name]);
        let e = list(&b, 2).unwrap_err();
        assert!(
            matches!(e, Error::PluginContract { .. })
                && e.to_string().contains(says)
                && e.to_string().contains(&upper),
            "{define}: {e}"
        );
    }
}
