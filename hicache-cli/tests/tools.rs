//! `doctor`, `scrub` and `bench` on real filesystems, including ones mounted for the test:
//! ramfs (no O_DIRECT) and a read-only tmpfs (unwritable). Mounting needs root, which the
//! project's machines and CI have; without it these tests fail loudly rather than skip.
#![cfg(feature = "posix")]

use std::ffi::CString;

use hicache_testkit::fixtures::TestMount;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hicache::{
    Config, ConfigLoader, HiCache, HiCacheOptions, HostSlots, Layout, MmapPool, PageKey,
    StorageIdentity, scatter_page,
};
use hicache_cli::bench::{BenchOptions, ModelShape};
use hicache_cli::doctor::{DoctorOptions, Status};
use hicache_cli::scrub::{ScrubOptions, scrub};

/// Mounts a filesystem for a test; without root this fails loudly.
fn mount(fstype: &str, options: &str) -> TestMount {
    TestMount::new(fstype, options)
        .unwrap_or_else(|e| panic!("mount -t {fstype} failed ({e}); these tests need root"))
}

fn config(dirs: &[&Path], extra: &[(&str, &str)]) -> Config {
    let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let mut l = ConfigLoader::new().set("storage_dir", list.join(","));
    for (k, v) in extra {
        l = l.set(*k, *v);
    }
    l.load().unwrap()
}

fn options(model: ModelShape, page_tokens: u64, layout: Layout, host_gib: f64) -> DoctorOptions {
    DoctorOptions {
        geometry: model.geometry(page_tokens, layout, 4).unwrap(),
        host_pool_bytes: (host_gib * (1u64 << 30) as f64) as u64,
        host_pool_origin: format!("--host-gib {host_gib}"),
        round_trip_pages: 2,
        progress: false,
    }
}

fn doctor(config: &Config, opts: &DoctorOptions) -> hicache_cli::doctor::DoctorReport {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(hicache_cli::doctor::run(
            hicache::registry_for(config),
            config,
            opts,
        ))
}

fn default_opts() -> DoctorOptions {
    options(
        ModelShape::Custom {
            page_bytes: 64 << 10,
        },
        16,
        Layout::PageFirst,
        0.5,
    )
}

#[test]
fn doctor_passes_on_a_good_dir() {
    let dir = tempfile::tempdir().unwrap();
    let report = doctor(&config(&[dir.path()], &[]), &default_opts());
    assert!(report.ok(), "{report:#?}");
    let rt = report.step("round trip").unwrap();
    assert_eq!(rt.status, Status::Pass, "{rt:?}");
    assert!(rt.details[0].contains("verified"));
}

#[test]
fn doctor_explains_a_missing_dir() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("not-yet");
    let report = doctor(&config(&[&missing], &[]), &default_opts());
    let step = report.step("storage dirs").unwrap();
    assert_eq!(step.status, Status::Warn, "{step:?}");
    assert!(
        step.details[0].contains("did not exist") && step.fixes[0].contains("mkdir -p"),
        "{step:?}"
    );
}

#[test]
fn doctor_explains_a_filesystem_without_o_direct() {
    let ramfs = mount("ramfs", "");
    let report = doctor(&config(&[ramfs.path()], &[]), &default_opts());
    let step = report.step("storage dirs").unwrap();
    assert_eq!(step.status, Status::Warn, "{step:?}");
    assert!(
        step.details
            .iter()
            .any(|d| d.contains("ramfs") && d.contains("refuses O_DIRECT")),
        "{step:?}"
    );
    assert!(
        step.fixes
            .iter()
            .any(|f| f.contains("use_direct_io = false")),
        "{step:?}"
    );
    // It still works, buffered: the round trip passes.
    assert_eq!(report.step("round trip").unwrap().status, Status::Pass);
}

#[test]
fn doctor_explains_an_unwritable_dir() {
    let ro = mount("tmpfs", "ro,size=1m");
    let report = doctor(&config(&[ro.path()], &[]), &default_opts());
    assert!(!report.ok());
    let step = report.step("storage dirs").unwrap();
    assert_eq!(step.status, Status::Fail, "{step:?}");
    assert!(
        step.details
            .iter()
            .any(|d| d.contains("Read-only file system")),
        "{step:?}"
    );
    assert!(step.fixes.iter().any(|f| f.contains("--dir")), "{step:?}");
}

#[test]
fn doctor_explains_an_unusable_requested_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let report = doctor(
        &config(&[&file.join("sub")], &[("plugin", "posix")]),
        &default_opts(),
    );
    let step = report.step("plugins").unwrap();
    assert_eq!(step.status, Status::Fail, "{step:?}");
    assert!(
        step.details
            .iter()
            .any(|d| d.contains("POSIX was requested but is unusable")),
        "{step:?}"
    );
    assert!(!report.ok());
    let report = doctor(
        &config(&[dir.path()], &[("plugin", "3fs")]),
        &default_opts(),
    );
    let step = report.step("plugins").unwrap();
    assert!(
        step.details
            .iter()
            .any(|d| d.contains("unknown plugin `3FS`")),
        "{step:?}"
    );
}

#[test]
fn doctor_explains_a_stride_that_breaks_alignment() {
    let dir = tempfile::tempdir().unwrap();
    // 1536-byte pages: two spans of 768 bytes, aligned to no direct-I/O alignment.
    let opts = options(
        ModelShape::Custom { page_bytes: 1536 },
        16,
        Layout::PageFirst,
        0.5,
    );
    let report = doctor(&config(&[dir.path()], &[]), &opts);
    let step = report.step("geometry").unwrap();
    assert_eq!(step.status, Status::Warn, "{step:?}");
    assert!(
        step.details.iter().any(|d| d.contains("bounce")),
        "{step:?}"
    );
    assert_eq!(
        report.step("round trip").unwrap().status,
        Status::Pass,
        "bounce mode still round-trips"
    );
}

#[test]
fn doctor_explains_a_ratio_that_exceeds_memory() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(
        ModelShape::Custom {
            page_bytes: 64 << 10,
        },
        16,
        Layout::PageFirst,
        100_000.0,
    );
    let report = doctor(&config(&[dir.path()], &[]), &opts);
    let step = report.step("memory").unwrap();
    assert_eq!(step.status, Status::Fail, "{step:?}");
    assert!(step.fixes[0].contains("--ratio"), "{step:?}");
    assert!(!report.ok());
}

#[test]
fn doctor_warns_when_env_overrides_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        format!(
            "storage_dir = \"{}\"\nuse_direct_io = true\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let cfg = ConfigLoader::new()
        .file(&file)
        .env(hicache::EnvSnapshot::from_pairs([(
            "HICACHE_USE_DIRECT_IO",
            "false",
        )]))
        .load()
        .unwrap();
    let report = doctor(&cfg, &default_opts());
    let step = report.step("config").unwrap();
    assert_eq!(step.status, Status::Warn, "{step:?}");
    assert!(
        step.details
            .iter()
            .any(|d| d.contains("HICACHE_USE_DIRECT_IO") && d.contains("overrides")),
        "{step:?}"
    );
}

fn store_pages(dir: &Path, n: u64) -> (Vec<PathBuf>, String) {
    let cfg = config(&[dir], &[("plugin", "posix")]);
    let cache = hicache::open(cfg, HiCacheOptions::new(StorageIdentity::single("m"))).unwrap();
    let geometry = ModelShape::Custom {
        page_bytes: 64 << 10,
    }
    .geometry(16, Layout::PageFirst, n)
    .unwrap();
    let pool = Arc::new(MmapPool::new(geometry).unwrap());
    let report = cache.register_pool(pool.clone()).unwrap();
    let keys: Vec<PageKey> = (0..n)
        .map(|i| PageKey::new(format!("scrub{i:059}")).unwrap())
        .collect();
    for p in 0..n {
        scatter_page(pool.as_ref(), p, &vec![p as u8 + 1; 64 << 10]).unwrap();
    }
    let pages: Vec<u64> = (0..n).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt
        .block_on(cache.batch_set(&keys, HostSlots::Pages(&pages)))
        .unwrap();
    assert!(r.iter().all(|r| r.is_ok()));
    let backend = hicache::posix::PosixBackend::new(&hicache::posix::PosixConfig {
        dirs: vec![dir.to_path_buf()],
        direct_io: false,
        engine: hicache::posix::EngineChoice::Threads,
        threads: 1,
        queue_depth: 64,
        sync: hicache::posix::SyncMode::None,
        spare_bytes: 1 << 30,
        cleaner: None,
        file_mode: 0o600,
        dir_mode: 0o700,
    })
    .unwrap();
    let paths = keys
        .iter()
        .map(|k| backend.object_path(&cache.object_names(k).unwrap()[0]))
        .collect();
    (paths, report.namespace)
}

#[test]
fn scrub_finds_torn_corrupt_foreign_and_stale_files_and_deletes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, namespace) = store_pages(dir.path(), 6);
    // 0: bit flip; 1: truncated; 2: another object's bytes; 3, 4, 5: valid.
    let mut b = std::fs::read(&paths[0]).unwrap();
    let n = b.len();
    b[n - 10] ^= 1;
    std::fs::write(&paths[0], b).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[1])
        .unwrap();
    f.set_len(5000).unwrap();
    std::fs::copy(&paths[3], &paths[2]).unwrap();
    // A temporary file of a killed writer, an hour old.
    let bucket = paths[4].parent().unwrap();
    let stale = bucket.join(".t1234-5");
    // A spare a writer keeps for reuse, as old: not a page, never judged or deleted.
    let spare = bucket.join(".s0123456789abcdef-1f");
    for f in [&stale, &spare] {
        std::fs::write(f, b"partial").unwrap();
        let old = CString::new(f.to_str().unwrap()).unwrap();
        let times = [libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        }; 2];
        // SAFETY: NUL-terminated path and a two-element array, as utimensat wants.
        let rc = unsafe { libc::utimensat(libc::AT_FDCWD, old.as_ptr(), times.as_ptr(), 0) };
        assert_eq!(rc, 0);
    }

    let opts = ScrubOptions {
        dirs: vec![dir.path().to_path_buf()],
        delete: false,
        namespace: Some(namespace.clone()),
        temp_age: std::time::Duration::from_secs(60),
        progress: false,
    };
    let report = scrub(&opts).unwrap();
    assert_eq!(report.files, 7, "{report:#?}");
    assert_eq!(report.valid, 3);
    assert_eq!(report.count("torn"), 1, "{report:#?}");
    assert_eq!(report.count("corrupt"), 2, "{report:#?}");
    assert_eq!(report.count("stale-temp"), 1);
    // With another namespace, the valid objects are foreign.
    let foreign = scrub(&ScrubOptions {
        namespace: Some("0000000000000000".into()),
        ..opts.clone()
    })
    .unwrap();
    assert_eq!(foreign.count("foreign"), 3);
    let deleted = scrub(&ScrubOptions {
        delete: true,
        ..opts.clone()
    })
    .unwrap();
    assert!(deleted.findings.iter().all(|f| f.deleted));
    assert!(spare.exists(), "a spare is left alone");
    let again = scrub(&opts).unwrap();
    assert_eq!(
        (again.files, again.valid, again.findings.len()),
        (3, 3, 0),
        "{again:#?}"
    );
}

#[test]
fn bench_verifies_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&[dir.path()], &[]);
    let cache = Arc::new(hicache::open(cfg, HiCacheOptions::default()).unwrap());
    let opts = BenchOptions {
        geometry: ModelShape::Custom {
            page_bytes: 64 << 10,
        }
        .geometry(16, Layout::PageFirst, 1)
        .unwrap(),
        pages: 40,
        batch: 8,
        streams: 2,
        rounds: 2,
        write: true,
        read: true,
        exists: true,
        keep: false,
        progress: false,
        shared_pool: false,
        memory_fs: false,
    };
    let report = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(hicache_cli::bench::run(cache.clone(), &opts))
        .unwrap();
    assert!(report.verified, "{report:#?}");
    assert_eq!(
        report.pool_path.as_deref(),
        Some("in place (preadv/pwritev)"),
        "{report:#?}"
    );
    assert_eq!(report.write_rounds.len(), 2);
    assert!(report.write_gbps > 0.0 && report.read_gbps > 0.0 && report.exists_keys_per_s > 0.0);
    let json = serde_json::to_value(&report).unwrap();
    for field in [
        "plugin",
        "page_bytes",
        "pages",
        "batch",
        "write_gbps",
        "read_gbps",
        "exists_keys_per_s",
        "verified",
    ] {
        assert!(json.get(field).is_some(), "JSON lacks {field}");
    }
    // The pages were removed afterwards.
    let _: &HiCache = &cache;
}

/// Both raw loops move every page in every round, read back what they wrote, name
/// themselves, and leave nothing in the dir they ran in.
#[test]
fn raw_baselines_verify_and_clean_up() {
    use hicache_cli::bench::{RawLoop, raw_baseline};
    let dir = tempfile::tempdir().unwrap();
    for (how, label) in [(RawLoop::InPlace, "RAW"), (RawLoop::Publish, "RAW-PUBLISH")] {
        for direct in [true, false] {
            let raw = raw_baseline(dir.path(), 64 << 10, 16, 4, direct, 3, how).unwrap();
            assert!(raw.verified, "{how:?} {raw:#?}");
            assert_eq!(raw.plugin, label);
            assert_eq!((raw.write_rounds.len(), raw.read_rounds.len()), (3, 3));
            for round in raw.write_rounds.iter().chain(&raw.read_rounds) {
                assert_eq!(round.failed_pages, 0, "{how:?} {raw:#?}");
                assert_eq!(round.bytes, 16 << 16);
            }
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(left.is_empty(), "{how:?} left {left:?}");
        }
        // A dir that is a file: a typed error naming it, not a panic.
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let err = raw_baseline(&file, 64 << 10, 4, 2, false, 1, how).unwrap_err();
        assert!(err.to_string().contains("a-file"), "{err}");
        std::fs::remove_file(&file).unwrap();
    }
}

#[test]
fn scrub_survives_crafted_headers_and_huge_files_and_never_follows_links() {
    use hicache::raw::envelope::{HEADER_FIELDS_LEN, Header};
    let dir = tempfile::tempdir().unwrap();
    let (paths, namespace) = store_pages(dir.path(), 4);
    // 0: a header with a valid checksum whose payload length overflows the object size.
    let mut b = std::fs::read(&paths[0]).unwrap();
    let mut h = Header::decode(&b[..HEADER_FIELDS_LEN]).unwrap();
    h.payload_len = u64::MAX - 10;
    b[..HEADER_FIELDS_LEN].copy_from_slice(&h.encode());
    std::fs::write(&paths[0], &b).unwrap();
    // 1: a sparse 1 GiB object whose header promises all of it: streamed, not loaded.
    let mut b = std::fs::read(&paths[1]).unwrap();
    let mut h = Header::decode(&b[..HEADER_FIELDS_LEN]).unwrap();
    h.payload_len = (1 << 30) - h.header_len;
    b[..HEADER_FIELDS_LEN].copy_from_slice(&h.encode());
    std::fs::write(&paths[1], &b).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[1])
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    // 2: replaced by a link to a file outside the root; a bucket link too.
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"not hicache's").unwrap();
    std::fs::remove_file(&paths[2]).unwrap();
    std::os::unix::fs::symlink(&victim, &paths[2]).unwrap();
    let bucket_link = (0..=255u8)
        .map(|b| dir.path().join(format!("{b:02x}")))
        .find(|p| paths.iter().all(|page| page.parent() != Some(p.as_path())))
        .expect("a bucket without our pages");
    let _ = std::fs::remove_dir(&bucket_link);
    std::os::unix::fs::symlink(outside.path(), &bucket_link).unwrap();
    // A link beside the buckets (what a spare dir could be replaced by).
    std::os::unix::fs::symlink(outside.path(), dir.path().join(".hicache-spare-link")).unwrap();
    // A FIFO (opening it would block) and a dir among the pages: reported, kept.
    let fifo = paths[3].with_file_name("planted-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let subdir = paths[3].with_file_name("planted-dir");
    std::fs::create_dir(&subdir).unwrap();

    let opts = ScrubOptions {
        dirs: vec![dir.path().to_path_buf()],
        delete: true,
        namespace: Some(namespace.to_ascii_uppercase()),
        temp_age: std::time::Duration::from_secs(60),
        progress: false,
    };
    let report = scrub(&opts).unwrap();
    assert_eq!(report.valid, 1, "{report:#?}");
    assert_eq!(report.count("corrupt"), 2, "{report:#?}");
    assert_eq!(report.count("symlink"), 3, "{report:#?}");
    assert_eq!(report.count("not-a-file"), 2, "{report:#?}");
    for f in &report.findings {
        let kept = ["symlink", "not-a-file"].contains(&f.kind);
        assert_eq!(f.deleted, !kept, "{f:?}");
    }
    assert!(
        fifo.exists() && subdir.is_dir(),
        "what is not a file is left alone"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"not hicache's");
    assert!(
        std::fs::symlink_metadata(&paths[2]).is_ok(),
        "the link is left alone"
    );
    assert!(!paths[0].exists() && !paths[1].exists());

    // A namespace that is not 16 hex digits is refused before anything is touched.
    for bad in ["deadbeef", "", "zzzzzzzzzzzzzzzz", "0123456789abcdef0"] {
        let err = scrub(&ScrubOptions {
            namespace: Some(bad.into()),
            ..opts.clone()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--namespace"), "{err}");
    }
    assert!(paths[3].exists());
}

#[test]
fn bench_counts_only_successful_pages_and_names_the_first_failures() {
    use hicache_testkit::{FaultPlan, FaultyBackend};
    let faulty = FaultyBackend::new(
        Arc::new(hicache::MemoryBackend::new()),
        FaultPlan {
            seed: 11,
            eio: 0.25,
            ..FaultPlan::default()
        },
    );
    let injected = faulty.injected.clone();
    let cache = Arc::new(
        HiCache::with_backend(
            Arc::new(faulty),
            ConfigLoader::new().load().unwrap(),
            HiCacheOptions::default(),
        )
        .unwrap(),
    );
    let geometry = ModelShape::Custom {
        page_bytes: 64 << 10,
    }
    .geometry(16, Layout::PageFirst, 1)
    .unwrap();
    let opts = |read: bool| BenchOptions {
        geometry,
        pages: 64,
        batch: 8,
        streams: 2,
        rounds: 1,
        write: true,
        read,
        exists: false,
        keep: false,
        progress: false,
        shared_pool: false,
        memory_fs: false,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let report = rt
        .block_on(hicache_cli::bench::run(cache.clone(), &opts(true)))
        .unwrap();
    assert!(injected.total() > 0);
    let w = &report.write_rounds[0];
    assert!(w.failed_pages > 0, "{report:#?}");
    assert!(
        w.first_errors.iter().any(|e| e.starts_with("Io: ")),
        "{:?}",
        w.first_errors
    );
    // Pages per second counts the pages that were written, not the ones that failed.
    let written = report.pages - w.failed_pages;
    assert!(w.pages_per_s > 0.0 && written < report.pages);
    assert!(report.read_back && !report.verified, "{report:#?}");
    assert!(!report.read_rounds[0].first_errors.is_empty());

    let write_only = rt
        .block_on(hicache_cli::bench::run(cache, &opts(false)))
        .unwrap();
    assert!(!write_only.read_back && !write_only.verified);
}

#[test]
fn doctor_warns_about_a_storage_dir_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let report = doctor(&config(&[dir.path()], &[]), &default_opts());
    let step = report.step("storage dirs").unwrap();
    assert_eq!(step.status, Status::Warn, "{step:?}");
    assert!(
        step.details
            .iter()
            .any(|d| d.contains("readable by other users")),
        "{step:?}"
    );
    assert!(
        step.fixes.iter().any(|f| f.contains("chmod 700")),
        "{step:?}"
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let report = doctor(&config(&[dir.path()], &[]), &default_opts());
    assert_eq!(report.step("storage dirs").unwrap().status, Status::Pass);
}

#[test]
fn doctor_fails_on_links_at_every_level_and_touches_nothing_outside() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = store_pages(dir.path(), 2);
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"not hicache's").unwrap();
    // A page replaced by a link, a bucket replaced by a link, and a link inside the spare dirs.
    std::fs::remove_file(&paths[0]).unwrap();
    std::os::unix::fs::symlink(&victim, &paths[0]).unwrap();
    let bucket = (0..=255u8)
        .map(|b| dir.path().join(format!("{b:02x}")))
        .find(|p| paths.iter().all(|page| page.parent() != Some(p.as_path())))
        .unwrap();
    let _ = std::fs::remove_dir(&bucket);
    std::os::unix::fs::symlink(outside.path(), &bucket).unwrap();
    let spare = dir.path().join(".hicache-spare");
    std::fs::create_dir_all(&spare).unwrap();
    std::os::unix::fs::symlink(outside.path(), spare.join("planted")).unwrap();

    let report = doctor(&config(&[dir.path()], &[]), &default_opts());
    assert!(!report.ok(), "{report:#?}");
    let step = report.step("storage dirs").unwrap();
    assert_eq!(step.status, Status::Fail, "{step:?}");
    let listed = step
        .details
        .iter()
        .find(|d| d.contains("symbolic link(s)"))
        .unwrap_or_else(|| panic!("{step:?}"));
    assert!(listed.contains("3 symbolic link(s)"), "{listed}");
    for p in [&paths[0], &bucket, &spare.join("planted")] {
        assert!(listed.contains(&p.display().to_string()), "{listed}");
        assert!(
            std::fs::symlink_metadata(p)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"not hicache's");
    let outside_entries: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert_eq!(outside_entries.len(), 1, "doctor wrote outside the root");
}
