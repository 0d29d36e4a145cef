//! The plugin's face: probe verdicts and what build reuses, remove and usage, sync levels,
//! every declared parameter.

use std::sync::Arc;

use crate::{ENGINES, backend_with, engine_name, fill, geometry, keys, mha, walk, write_4k};
use hicache_core::raw::{AlignedBuf, ObjectKey, ReadItem, Slice, StorageBackend, WriteItem};
use hicache_core::{
    ConfigLoader, Error, FactValue, HiCache, HiCacheOptions, HostSlots, Layout, MemoryRegion,
    MissReason, MmapPool, ReadOutcome, StorageIdentity,
};
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig};

#[test]
fn probe_reports_unusable_dirs_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let problem = hicache_posix::probe_dir(&file.join("sub"), true).unwrap_err();
    assert!(
        problem.reason.contains("cannot create storage dir"),
        "{}",
        problem.reason
    );
    assert!(problem.hint.contains("--dir"));
    // A file, and the system's root dir (also through a link), are no storage dirs; nothing
    // is created in either.
    let problem = hicache_posix::probe_dir(&file, true).unwrap_err();
    assert!(
        problem.reason.contains("exists and is not a dir"),
        "{}",
        problem.reason
    );
    let to_root = dir.path().join("to-root");
    std::os::unix::fs::symlink("/", &to_root).unwrap();
    for system_root in [
        std::path::Path::new("/"),
        std::path::Path::new("/."),
        &to_root,
    ] {
        let problem = hicache_posix::probe_dir(system_root, true).unwrap_err();
        assert!(
            problem.reason.contains("system's root dir") && problem.hint.contains("--dir"),
            "{}: {}",
            system_root.display(),
            problem.reason
        );
        // The backend opens the dir before it creates any bucket dir in it.
        let config = PosixConfig {
            dirs: vec![system_root.to_path_buf()],
            direct_io: false,
            engine: EngineChoice::Threads,
            threads: 1,
            queue_depth: 8,
            sync: hicache_posix::SyncMode::None,
            spare_bytes: 0,
            cleaner: None,
            file_mode: 0o600,
            dir_mode: 0o700,
        };
        let err = PosixBackend::new(&config).unwrap_err().to_string();
        assert!(err.contains("system's root dir"), "{err}");
    }
    let ok = hicache_posix::probe_dir(dir.path(), true).unwrap();
    assert_eq!(ok.direct_io, Some(true));
    let config = ConfigLoader::new()
        .set("plugin", "posix")
        .set("storage_dir", file.join("sub").display().to_string())
        .load()
        .unwrap();
    let registry =
        hicache_core::PluginRegistry::from_descriptors([&hicache_posix::DESCRIPTOR]).unwrap();
    let err = registry.select(&config).unwrap_err();
    assert!(matches!(err, Error::PluginUnusable { .. }), "{err}");
}

/// Selection probes once: the probe's facts reach `hicache plugins`, and the build takes the
/// probe's per-dir O_DIRECT verdict instead of testing again. Findings that say O_DIRECT was
/// refused make the build use buffered I/O on a dir where O_DIRECT works, which only
/// happens when the build reads them.
#[test]
fn the_build_uses_what_the_probe_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pages");
    std::fs::create_dir(&root).unwrap();
    let config = ConfigLoader::new()
        .set("plugin", "posix")
        .set("storage_dir", root.display().to_string())
        .load()
        .unwrap();
    let registry =
        hicache_core::PluginRegistry::from_descriptors([&hicache_posix::DESCRIPTOR]).unwrap();
    let probed = registry.probe_all(&config);
    let facts: Vec<(&str, &FactValue)> = probed[0]
        .facts
        .iter()
        .map(|f| (f.name.as_str(), &f.value))
        .collect();
    assert!(
        facts.contains(&("engine", &FactValue::Text("threads".into()))),
        "{facts:?}"
    );
    assert!(
        facts.contains(&("direct I/O", &FactValue::Flag(true))),
        "{facts:?}"
    );
    assert!(
        facts
            .iter()
            .any(|(n, v)| *n == "alignment" && matches!(v, FactValue::Bytes(a) if *a >= 512)),
        "{facts:?}"
    );
    assert!(
        facts
            .iter()
            .any(|(n, v)| *n == "free" && matches!(v, FactValue::Bytes(b) if *b > 0)),
        "{facts:?}"
    );
    let selection = registry.select_probed(&config, &probed).unwrap();
    let found = selection
        .findings
        .get::<hicache_posix::PosixFindings>()
        .unwrap();
    assert_eq!(found.dirs[0].as_ref().unwrap().direct_io, Some(true));
    let backend = registry.build(&config, &selection).unwrap();
    assert!(backend.info().capability.direct_io);

    let mut refused = found.clone();
    let dir_probe = refused.dirs[0].as_mut().unwrap();
    dir_probe.direct_io = Some(false);
    dir_probe.direct_io_error = Some("planted: refused".into());
    let planted = hicache_core::raw::Probe::usable("planted").with_findings(refused);
    let params = hicache_core::raw::params_for(&hicache_posix::DESCRIPTOR, &config).unwrap();
    let ctx =
        hicache_core::raw::PluginContext::new(&config, &params).with_findings(planted.findings());
    let backend = hicache_posix::DESCRIPTOR.build(&ctx).unwrap();
    assert!(!backend.info().capability.direct_io);
}

#[tokio::test]
async fn remove_and_usage() {
    for engine in ENGINES {
        remove_and_usage_with(engine).await;
    }
}

async fn remove_and_usage_with(engine: EngineChoice) {
    let dir = tempfile::tempdir().unwrap();
    let b = backend_with(dir.path(), false, engine);
    let buf = AlignedBuf::zeroed(4096, 4096).unwrap();
    let region = b.register(MemoryRegion::from_aligned(buf)).unwrap();
    let key = ObjectKey::new("obj").unwrap();
    let segs = [Slice::new(region, 0, 4096)];
    write_4k(&b, region, &key).await;
    assert_eq!(
        b.exists(std::slice::from_ref(&key)).await[0]
            .as_ref()
            .unwrap(),
        &true
    );
    assert!(b.remove(std::slice::from_ref(&key)).await[0].is_ok());
    assert!(b.remove(std::slice::from_ref(&key)).await[0].is_ok());
    assert_eq!(
        b.exists(std::slice::from_ref(&key)).await[0]
            .as_ref()
            .unwrap(),
        &false
    );
    let r = b
        .read(&[ReadItem {
            key: &key,
            segments: &segs,
        }])
        .await;
    assert_eq!(
        r[0].as_ref().unwrap(),
        &ReadOutcome::Miss(MissReason::NotFound)
    );
    let u = b.usage().await.unwrap();
    assert!(u.total_bytes.unwrap() > 0);
    b.deregister(region).unwrap();
    assert!(b.deregister(region).is_err());
}

/// `sync` must reach the kernel: each level is checked by counting the flushes that returned
/// success, per engine (a backend that never flushed would pass every read-back test).
#[tokio::test]
async fn sync_levels_flush_what_they_promise_on_both_engines() {
    use hicache_posix::{Flushes, SyncMode};
    const N: usize = 12;
    for engine in ENGINES {
        for (sync, expect) in [
            (SyncMode::None, Flushes { files: 0, dirs: 0 }),
            (
                SyncMode::Data,
                Flushes {
                    files: N as u64,
                    dirs: 0,
                },
            ),
            (
                SyncMode::Full,
                Flushes {
                    files: N as u64,
                    dirs: N as u64,
                },
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = PosixConfig {
                dirs: vec![dir.path().to_path_buf()],
                direct_io: false,
                engine,
                threads: 4,
                queue_depth: 64,
                sync,
                spare_bytes: 1 << 30,
                cleaner: None,
                file_mode: 0o600,
                dir_mode: 0o700,
            };
            let backend = Arc::new(PosixBackend::new(&cfg).unwrap());
            let cache = HiCache::with_backend(
                backend.clone(),
                ConfigLoader::new().load().unwrap(),
                HiCacheOptions::new(StorageIdentity::single("m")),
            )
            .unwrap();
            let pool = Arc::new(MmapPool::new(geometry(Layout::PageFirst, 4, mha())).unwrap());
            cache.register_pool(pool.clone()).unwrap();
            let ks = keys("sync", N);
            let pages: Vec<u64> = (0..N as u64).collect();
            for &p in &pages {
                fill(&pool, p, p as u8);
            }
            let label = format!("{} sync={sync:?}", engine_name(engine));
            let done = cache
                .batch_set(&ks, HostSlots::Pages(&pages))
                .await
                .unwrap();
            assert!(done.iter().all(|r| r.is_ok()), "{label}: {done:?}");
            assert_eq!(backend.flushes(), expect, "{label}");
            let got = cache
                .batch_get(&ks, HostSlots::Pages(&pages))
                .await
                .unwrap();
            assert!(
                got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
                "{label}"
            );
            assert_eq!(backend.flushes(), expect, "{label}: reads flush nothing");
        }
    }
}

/// Every parameter the POSIX plugin declares is accepted from a config file and reaches
/// the typed structs it reads (its own and the file layer's).
#[test]
fn every_declared_parameter_reaches_the_plugin() {
    use hicache_testkit::params::{check_params_read_by, read_by};
    check_params_read_by(
        &hicache_posix::DESCRIPTOR,
        &[
            &read_by::<hicache_posix::PosixParams>,
            &read_by::<hicache_posix::FileLayerParams>,
        ],
    );
}

/// The spare files waiting in the bucket dirs under `root` (`.s<tag>-<id>`).
fn spare_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    walk(root)
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(".s") && !p.to_string_lossy().contains(".hicache-spare")
        })
        .collect()
}

/// The bucket dir key `k`'s object lives in.
fn bucket_of(b: &PosixBackend, k: &str) -> std::path::PathBuf {
    b.object_path(&ObjectKey::new(k).unwrap())
        .parent()
        .unwrap()
        .to_owned()
}

/// Both engines recycle object files: a removed object's file waits as a spare in its bucket
/// dir and carries the next write of the same size there, and a replaced object's file the
/// write after the replacement (seen by the spare names in the bucket dirs and by inode
/// numbers).
#[tokio::test]
async fn both_engines_recycle_the_files_of_removed_and_replaced_objects() {
    use std::os::unix::fs::MetadataExt;
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
        let id = b.register(buf).unwrap();
        let segments = [Slice::new(id, 0, 4096)];
        // Inodes of the spares waiting in the bucket dirs.
        let spares = || -> Vec<u64> {
            spare_files(dir.path())
                .into_iter()
                .map(|p| std::fs::metadata(p).unwrap().ino())
                .collect()
        };
        // Keys in one bucket dir: spares serve writes in their own dir.
        let bucket = |k: &str| bucket_of(&b, k);
        let mut keys = vec!["a".to_string()];
        keys.extend(
            (0..100_000)
                .map(|i| format!("k{i}"))
                .filter(|k| bucket(k) == bucket("a"))
                .take(3),
        );
        let [ka, kb, kc, kd] = [0, 1, 2, 3].map(|i| keys[i].clone());
        let write = |name: String| {
            let b = &b;
            let segments = &segments;
            async move {
                let key = ObjectKey::new(name).unwrap();
                let w = b
                    .write(&[WriteItem {
                        key: &key,
                        segments,
                    }])
                    .await;
                assert!(w[0].is_ok(), "{engine:?}: {:?}", w[0]);
                std::fs::metadata(b.object_path(&key)).unwrap().ino()
            }
        };
        let a = write(ka.clone()).await;
        assert_eq!(spares(), Vec::<u64>::new());
        let removed = b.remove(&[ObjectKey::new(ka).unwrap()]).await;
        assert!(removed[0].is_ok(), "{removed:?}");
        assert_eq!(
            spares(),
            [a],
            "{engine:?}: the removed file waits as a spare"
        );
        assert_eq!(write(kb).await, a, "{engine:?}: and carries the next write");
        assert_eq!(spares(), Vec::<u64>::new());
        let replaced = write(kc.clone()).await;
        let c = write(kc).await;
        assert_ne!(c, replaced);
        assert_eq!(
            spares(),
            [replaced],
            "{engine:?}: the replaced file waits as a spare"
        );
        assert_eq!(
            write(kd).await,
            replaced,
            "{engine:?}: and carries the write after"
        );
    }
}

/// A FIFO planted in place of a spare file never hangs the write that recycles it: on both
/// engines the write goes to a new file, and the FIFO is not taken as a page.
#[tokio::test]
async fn a_fifo_planted_as_a_spare_never_hangs_a_write() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
        let id = b.register(buf).unwrap();
        let segments = [Slice::new(id, 0, 4096)];
        let next = (0..100_000)
            .map(|i| format!("k{i}"))
            .find(|k| bucket_of(&b, k) == bucket_of(&b, "a"))
            .unwrap();
        let (ka, kn) = (ObjectKey::new("a").unwrap(), ObjectKey::new(next).unwrap());
        let w = b
            .write(&[WriteItem {
                key: &ka,
                segments: &segments,
            }])
            .await;
        assert!(w[0].is_ok(), "{w:?}");
        let removed = b.remove(std::slice::from_ref(&ka)).await;
        assert!(removed[0].is_ok(), "{removed:?}");
        let spare = spare_files(dir.path())
            .pop()
            .expect("the removed file waits as a spare");
        std::fs::remove_file(&spare).unwrap();
        nix::unistd::mkfifo(&spare, nix::sys::stat::Mode::S_IRWXU).unwrap();

        let items = [WriteItem {
            key: &kn,
            segments: &segments,
        }];
        // Pinned here, not in the timeout: a dropped write waits for its I/O to end.
        let mut write = std::pin::pin!(b.write(&items));
        let wait = std::time::Duration::from_secs(20);
        let Ok(got) = tokio::time::timeout(wait, &mut write).await else {
            // A reader comes, so a writer stuck in `open` goes: the test fails, not hangs.
            let _ = std::fs::File::open(&spare);
            let _ = write.await;
            panic!("{engine:?}: a write that recycles a FIFO hung");
        };
        // The open fails at once (`ENXIO`), the FIFO's name is let go, and the page goes
        // to a new file.
        assert!(got[0].is_ok(), "{engine:?}: {got:?}");
        assert!(std::fs::metadata(b.object_path(&kn)).unwrap().is_file());
        assert!(std::fs::symlink_metadata(&spare).is_err(), "{engine:?}");
        let back = b.exists(std::slice::from_ref(&kn)).await;
        assert!(matches!(back[0], Ok(true)), "{engine:?}: {back:?}");
        b.deregister(id).unwrap();
    }
}

/// Someone cleans the root while the backend runs (every bucket dir, with the spares in
/// them, and the spare dir removed): on both engines reads of what was there miss, and writes
/// recreate what they need and go on (the pooled spares that went are replaced by new files).
#[tokio::test]
async fn a_cleaned_root_keeps_working_on_both_engines() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = MemoryRegion::from_aligned(AlignedBuf::zeroed(9 * 4096, 4096).unwrap());
        let id = b.register(buf).unwrap();
        let from = [Slice::new(id, 0, 4096)];
        // A page of the region per read: targets in one call must not overlap.
        let into: Vec<[Slice; 1]> = (1..9).map(|i| [Slice::new(id, i * 4096, 4096)]).collect();
        let keys: Vec<ObjectKey> = (0..8)
            .map(|i| ObjectKey::new(format!("k{i}")).unwrap())
            .collect();
        let items: Vec<WriteItem<'_>> = keys
            .iter()
            .map(|key| WriteItem {
                key,
                segments: &from,
            })
            .collect();
        assert!(b.write(&items).await.iter().all(|r| r.is_ok()));
        // The first round's removals leave spares behind, so the next writes stage in them.
        let removed = b.remove(&keys[..4]).await;
        assert!(removed.iter().all(|r| r.is_ok()), "{removed:?}");
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            std::fs::remove_dir_all(entry.unwrap().path()).unwrap();
        }
        let reads: Vec<ReadItem<'_>> = keys
            .iter()
            .zip(&into)
            .map(|(key, segments)| ReadItem { key, segments })
            .collect();
        let got = b.read(&reads).await;
        assert!(
            got.iter()
                .all(|r| matches!(r, Ok(ReadOutcome::Miss(MissReason::NotFound)))),
            "{engine:?}: {got:?}"
        );
        for round in 0..2 {
            let written = b.write(&items).await;
            assert!(
                written.iter().all(|r| r.is_ok()),
                "{engine:?} round {round}: {written:?}"
            );
            let got = b.read(&reads).await;
            assert!(
                got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
                "{engine:?} round {round}: {got:?}"
            );
        }
    }
}

/// `read_checked`: the thread pool runs the check on each object it read whole (a panicking
/// check fails its item only, and the engine lives on); io_uring leaves checks to the caller.
#[tokio::test]
async fn the_thread_pool_checks_reads_where_they_land() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = MemoryRegion::from_aligned(AlignedBuf::zeroed(4 * 4096, 4096).unwrap());
        let id = b.register(buf).unwrap();
        let ks: Vec<ObjectKey> = (0..3)
            .map(|i| ObjectKey::new(format!("chk{i}")).unwrap())
            .collect();
        for k in &ks[..2] {
            write_4k(&b, id, k).await;
        }
        let into: Vec<[Slice; 1]> = (1..4).map(|i| [Slice::new(id, i * 4096, 4096)]).collect();
        let items: Vec<ReadItem<'_>> = ks
            .iter()
            .zip(&into)
            .map(|(key, segments)| ReadItem { key, segments })
            .collect();
        let panicking = |i: usize, bytes: &[std::io::IoSlice<'_>]| {
            assert_eq!(bytes.iter().map(|s| s.len()).sum::<usize>(), 4096);
            if i == 0 {
                panic!("a check that panics");
            }
            Ok(())
        };
        let Some(got) = b.read_checked(&items, &panicking).await else {
            assert_eq!(
                engine,
                EngineChoice::Uring,
                "the thread pool checks its reads"
            );
            continue;
        };
        assert_eq!(engine, EngineChoice::Threads);
        assert!(got[0].is_err(), "{got:?}");
        assert_eq!(got[1].as_ref().unwrap(), &ReadOutcome::Hit);
        assert_eq!(
            got[2].as_ref().unwrap(),
            &ReadOutcome::Miss(MissReason::NotFound)
        );
        // The engine still serves reads after the panic.
        let refuse = |_: usize, _: &[std::io::IoSlice<'_>]| Err(MissReason::ChecksumMismatch);
        let again = b.read_checked(&items[1..2], &refuse).await.unwrap();
        assert_eq!(
            again[0].as_ref().unwrap(),
            &ReadOutcome::Miss(MissReason::ChecksumMismatch)
        );
    }
}

/// `write_sealed`: the thread pool seals each object on the thread that writes it, under
/// O_DIRECT too (the sealed header goes from the worker's aligned copy); a panicking seal
/// fails its item only and stores nothing of it; io_uring leaves sealing to the caller.
#[tokio::test]
async fn the_thread_pool_seals_writes_where_they_are_sent() {
    for engine in ENGINES {
        for direct in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let b = backend_with(dir.path(), direct, engine);
            let buf = MemoryRegion::from_aligned(AlignedBuf::zeroed(8 * 4096, 4096).unwrap());
            buf.target(0, 6 * 4096, "test")
                .unwrap()
                .copy_from(0, &[0x5a; 6 * 4096])
                .unwrap();
            let bytes = |at: u64, len: u64| {
                buf.source(at, len, "test")
                    .unwrap()
                    .host_bytes()
                    .unwrap()
                    .to_vec()
            };
            let id = b.register(buf.clone()).unwrap();
            let ks: Vec<ObjectKey> = (0..3)
                .map(|i| ObjectKey::new(format!("seal{i}")).unwrap())
                .collect();
            let from: Vec<[Slice; 2]> = (0..3)
                .map(|i| {
                    [
                        Slice::new(id, 2 * i * 4096, 4096),
                        Slice::new(id, (2 * i + 1) * 4096, 4096),
                    ]
                })
                .collect();
            let items: Vec<WriteItem<'_>> = ks
                .iter()
                .zip(&from)
                .map(|(key, segments)| WriteItem { key, segments })
                .collect();
            let panicking = |i: usize, payload: &[std::io::IoSlice<'_>], header: &mut [u8]| {
                assert_eq!(payload.iter().map(|s| s.len()).sum::<usize>(), 4096);
                assert_eq!(header.len(), 4096);
                if i == 1 {
                    panic!("a seal that panics");
                }
                header[..4].copy_from_slice(b"SEAL");
                Ok(())
            };
            let Some(got) = b.write_sealed(&items, &panicking).await else {
                assert_eq!(
                    engine,
                    EngineChoice::Uring,
                    "the thread pool seals its writes"
                );
                continue;
            };
            assert_eq!(engine, EngineChoice::Threads);
            assert!(got[0].is_ok() && got[2].is_ok(), "{got:?}");
            let e = got[1].as_ref().unwrap_err().to_string();
            assert!(e.contains("seal panicked"), "{e}");
            let stored: Vec<bool> = b
                .exists(&ks)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_eq!(stored, [true, false, true], "direct {direct}");
            for k in [0, 2] {
                let into = [Slice::new(id, 6 * 4096, 2 * 4096)];
                let got = b
                    .read(&[ReadItem {
                        key: &ks[k],
                        segments: &into,
                    }])
                    .await;
                assert_eq!(got[0].as_ref().unwrap(), &ReadOutcome::Hit);
                let back = bytes(6 * 4096, 2 * 4096);
                assert_eq!(&back[..4], b"SEAL", "direct {direct}");
                assert!(back[4..].iter().all(|&x| x == 0x5a), "direct {direct}");
            }
            let source = bytes(0, 6 * 4096);
            assert!(
                source.iter().all(|&x| x == 0x5a),
                "the first segments are only read"
            );
        }
    }
}

/// Whether `dir` is on a memory filesystem, where the default is one I/O thread per CPU.
pub(crate) fn on_memory_fs(dir: &std::path::Path) -> bool {
    use nix::sys::statfs::{FsType, TMPFS_MAGIC, statfs};
    let kind = statfs(dir).unwrap().filesystem_type();
    // ramfs's magic (linux/magic.h), which neither nix nor libc names.
    kind == TMPFS_MAGIC || kind == FsType(0x8584_58f6)
}

/// The thread engine on `dirs` with its thread count left to the default.
fn default_threads_config(dirs: Vec<std::path::PathBuf>) -> PosixConfig {
    PosixConfig {
        dirs,
        direct_io: false,
        engine: EngineChoice::Threads,
        threads: 0,
        queue_depth: 256,
        sync: hicache_posix::SyncMode::None,
        spare_bytes: 1 << 20,
        cleaner: None,
        file_mode: 0o600,
        dir_mode: 0o700,
    }
}

#[test]
fn the_default_thread_count_follows_the_filesystem() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    for (label, parent) in crate::parents() {
        let dir = tempfile::tempdir_in(&parent).unwrap();
        let cfg = default_threads_config(vec![dir.path().to_path_buf()]);
        let b = PosixBackend::new(&cfg).unwrap();
        // Block filesystems get the raw loop's queue depth; memory ones a thread per CPU.
        let expected = if on_memory_fs(dir.path()) { cpus } else { 32 };
        assert_eq!(
            b.engine_description(),
            format!("threads ({expected})"),
            "{label}"
        );
    }
    // Roots on both kinds: the block filesystem's depth wins, since one slow root holds a
    // thread per request in flight.
    let dirs: Vec<tempfile::TempDir> = crate::parents()
        .iter()
        .map(|(_, parent)| tempfile::tempdir_in(parent).unwrap())
        .collect();
    let cfg = default_threads_config(dirs.iter().map(|d| d.path().to_path_buf()).collect());
    let all_memory = dirs.iter().all(|d| on_memory_fs(d.path()));
    let expected = if all_memory { cpus } else { 32 };
    assert_eq!(
        PosixBackend::new(&cfg).unwrap().engine_description(),
        format!("threads ({expected})"),
        "mixed roots"
    );
}
