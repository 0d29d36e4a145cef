//! `scrub` and `usage` through a plugin's listing: OBJ over a local dir (the plugin's own
//! listing code, the one S3's ListObjectsV2 goes through), linked into the command the way a
//! vendor links a plugin (`Commands::plugin`); POSIX dirs walked through the listing with
//! `--listing`; and plugins that cannot list, or list forever, refused with a typed error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use hicache::raw::{
    BackendInfo, ListCursor, ListPage, MemoryRegion, ObjectKey, ReadItem, RegionId, StorageBackend,
    Usage, WriteItem,
};
use hicache::{
    HiCache, HiCacheOptions, HostSlots, Layout, MemoryBackend, MmapPool, PageKey, ReadOutcome,
    StorageIdentity, scatter_page,
};
use hicache_cli::Commands;
use hicache_cli::bench::ModelShape;
use hicache_cli::scrub::{ListScrubOptions, scrub_backend};

const PAGE: u64 = 64 << 10;

/// A config file selecting OBJ over `store`.
fn obj_config(dir: &Path, store: &Path) -> PathBuf {
    let path = dir.join("obj.toml");
    std::fs::write(
        &path,
        format!(
            "[plugin.obj]\nactive = true\nurl = \"file://{}\"\n",
            store.display()
        ),
    )
    .unwrap();
    path
}

/// Stores `n` pages through OBJ and returns the pool's namespace.
fn store_pages(config_file: &Path, n: u64) -> String {
    let config = hicache::config_with(&[&hicache_obj::DESCRIPTOR])
        .file(config_file)
        .load()
        .unwrap();
    let registry = hicache::registry_with(&config, &[&hicache_obj::DESCRIPTOR]).unwrap();
    let cache = HiCache::open(
        &registry,
        config,
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    let geometry = ModelShape::Custom { page_bytes: PAGE }
        .geometry(16, Layout::PageFirst, n)
        .unwrap();
    let pool = Arc::new(MmapPool::new(geometry).unwrap());
    let report = cache.register_pool(pool.clone()).unwrap();
    let keys: Vec<PageKey> = (0..n)
        .map(|i| PageKey::new(format!("listed{i:058}")).unwrap())
        .collect();
    for p in 0..n {
        scatter_page(pool.as_ref(), p, &vec![p as u8 + 1; PAGE as usize]).unwrap();
    }
    let pages: Vec<u64> = (0..n).collect();
    let written = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(cache.batch_set(&keys, HostSlots::Pages(&pages)))
        .unwrap();
    assert!(written.iter().all(|r| r.is_ok()), "{written:?}");
    report.namespace
}

/// Every regular file under `dir`, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Runs the `hicache` command with OBJ linked in; returns its exit code and its JSON.
fn run(config: &Path, args: &[&str]) -> (ExitCode, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.json");
    let mut argv: Vec<String> = vec!["hicache".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.extend([
        "--config".into(),
        config.display().to_string(),
        "--json".into(),
        out.display().to_string(),
    ]);
    let code = Commands::new()
        .plugin(&hicache_obj::DESCRIPTOR)
        .run_args(argv);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    (code, serde_json::from_str(&text).unwrap_or_default())
}

fn count(report: &serde_json::Value, kind: &str) -> usize {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .count()
}

#[test]
fn scrub_and_usage_work_on_obj_through_its_listing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let config = obj_config(dir.path(), &store);
    let namespace = store_pages(&config, 6);
    let objects = files_under(&store);
    assert_eq!(objects.len(), 6, "{objects:?}");
    // 0: bit flip; 1: truncated; 2: another object's bytes; 3, 4, 5: valid; and an object
    // that is not a page at all.
    let mut b = std::fs::read(&objects[0]).unwrap();
    let n = b.len();
    b[n - 10] ^= 1;
    std::fs::write(&objects[0], b).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&objects[1])
        .unwrap()
        .set_len(5000)
        .unwrap();
    std::fs::copy(&objects[3], &objects[2]).unwrap();
    std::fs::write(store.join("notes.txt"), b"not a page").unwrap();

    let (code, usage) = run(&config, &["usage"]);
    assert_eq!(code, ExitCode::SUCCESS, "{usage}");
    assert_eq!(usage["plugin"], "OBJ");
    assert_eq!(usage["total"]["objects"], 7, "{usage}");
    let namespaces = usage["namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 2, "{usage}");
    let ours = namespaces
        .iter()
        .find(|n| n["namespace"] == namespace.as_str())
        .expect("our namespace is counted");
    assert_eq!(ours["objects"], 6, "{usage}");
    assert!(
        ours["oldest_age_s"].is_u64(),
        "local files have ages: {usage}"
    );
    // The cleaner's order over the pages in its default scope: ours, not `notes.txt`.
    let next = usage["next_to_evict"].as_array().unwrap();
    assert_eq!(next.len(), 6, "{usage}");
    assert!(
        next.iter()
            .all(|g| g["page"].as_str().unwrap().ends_with(namespace.as_str())),
        "{usage}"
    );
    let other = namespaces
        .iter()
        .find(|n| n["namespace"].is_null())
        .unwrap();
    assert_eq!(
        (other["objects"].as_u64(), other["bytes"].as_u64()),
        (Some(1), Some(10))
    );
    let (_, only) = run(&config, &["usage", "--prefix", "notes"]);
    assert_eq!(only["total"]["objects"], 1, "{only}");

    let (code, report) = run(&config, &["scrub", "--namespace", &namespace]);
    assert_eq!(code, ExitCode::FAILURE, "problems found: {report}");
    assert_eq!(report["files"], 7, "{report}");
    assert_eq!(report["valid"], 3, "{report}");
    assert_eq!(report["raw"], 1, "{report}");
    assert_eq!(count(&report, "torn"), 1, "{report}");
    assert_eq!(count(&report, "corrupt"), 2, "{report}");
    // With another namespace, the valid pages are foreign.
    let (_, foreign) = run(&config, &["scrub", "--namespace", "0000000000000000"]);
    assert_eq!(count(&foreign, "foreign"), 3, "{foreign}");

    let (code, deleted) = run(&config, &["scrub", "--namespace", &namespace, "--delete"]);
    assert_eq!(code, ExitCode::SUCCESS, "{deleted}");
    assert_eq!(deleted["findings"].as_array().unwrap().len(), 3);
    assert_eq!(files_under(&store).len(), 4, "removed through the plugin");
    let (code, again) = run(&config, &["scrub", "--namespace", &namespace]);
    assert_eq!(code, ExitCode::SUCCESS, "{again}");
    assert_eq!(
        (again["files"].as_u64(), again["valid"].as_u64()),
        (Some(4), Some(3))
    );
}

#[cfg(feature = "posix")]
#[test]
fn posix_dirs_scrub_the_same_through_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("posix.toml");
    let store = dir.path().join("store");
    std::fs::write(
        &config,
        format!(
            "plugin = \"posix\"\nstorage_dir = \"{}\"\nuse_direct_io = false\n",
            store.display()
        ),
    )
    .unwrap();
    let namespace = store_pages(&config, 4);
    let pages: Vec<PathBuf> = files_under(&store)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("listed"))
        .collect();
    assert_eq!(pages.len(), 4, "{pages:?}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&pages[0])
        .unwrap()
        .set_len(5000)
        .unwrap();
    let (_, files) = run(&config, &["scrub", "--namespace", &namespace]);
    let (_, listed) = run(&config, &["scrub", "--namespace", &namespace, "--listing"]);
    for report in [&files, &listed] {
        assert_eq!(report["valid"], 3, "{report}");
        assert_eq!(count(report, "torn"), 1, "{report}");
    }
}

/// A memory backend whose listing is broken in one way.
#[derive(Debug)]
struct BadLister {
    inner: MemoryBackend,
    /// `true`: every page hands back the cursor it was given; `false`: no listing at all.
    stuck: bool,
}

#[async_trait::async_trait]
impl StorageBackend for BadLister {
    fn info(&self) -> BackendInfo {
        let mut info = self.inner.info();
        info.name = "BADLIST".into();
        info
    }
    fn register(&self, region: MemoryRegion) -> hicache::Result<RegionId> {
        self.inner.register(region)
    }
    fn deregister(&self, id: RegionId) -> hicache::Result<()> {
        self.inner.deregister(id)
    }
    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<hicache::Result<()>> {
        self.inner.write(batch).await
    }
    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<hicache::Result<ReadOutcome>> {
        self.inner.read(batch).await
    }
    async fn exists(&self, keys: &[ObjectKey]) -> Vec<hicache::Result<bool>> {
        self.inner.exists(keys).await
    }
    async fn remove(&self, keys: &[ObjectKey]) -> Vec<hicache::Result<()>> {
        self.inner.remove(keys).await
    }
    async fn usage(&self) -> hicache::Result<Usage> {
        self.inner.usage().await
    }
    async fn list(
        &self,
        _prefix: &str,
        cursor: Option<&ListCursor>,
        _limit: usize,
    ) -> hicache::Result<ListPage> {
        if !self.stuck {
            return Err(hicache::Error::Unsupported {
                component: "BADLIST".into(),
                operation: "listing objects".into(),
            });
        }
        Ok(ListPage {
            objects: Vec::new(),
            next: Some(cursor.cloned().unwrap_or(ListCursor("again".into()))),
        })
    }
}

#[test]
fn a_plugin_that_cannot_list_or_lists_forever_is_a_typed_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for stuck in [false, true] {
        let backend = BadLister {
            inner: MemoryBackend::new(),
            stuck,
        };
        let scrubbed = rt.block_on(scrub_backend(&backend, &ListScrubOptions::default()));
        let usage = rt.block_on(hicache_cli::usage::usage(
            &backend,
            "",
            10,
            hicache::capacity::CleanerScope::Hicache,
            false,
        ));
        for err in [scrubbed.unwrap_err(), usage.unwrap_err()] {
            let text = err.to_string();
            assert!(text.contains("BADLIST"), "{text}");
            match stuck {
                false => assert!(matches!(err, hicache::Error::Unsupported { .. }), "{err:?}"),
                true => assert!(
                    matches!(err, hicache::Error::PluginContract { .. }) && text.contains("cursor"),
                    "{err:?}"
                ),
            }
        }
    }
    // A namespace that is not one is refused before anything is listed.
    let backend = BadLister {
        inner: MemoryBackend::new(),
        stuck: true,
    };
    let opts = ListScrubOptions {
        namespace: Some("../../etc".into()),
        ..Default::default()
    };
    let err = rt.block_on(scrub_backend(&backend, &opts)).unwrap_err();
    assert!(err.to_string().contains("--namespace"), "{err}");
}
