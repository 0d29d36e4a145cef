//! What must never happen: pages readable by others, links followed out of a root, space
//! leaked on a full filesystem, one unreadable page failing its neighbours.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{
    ENGINES, backend, backend_with, connector_with, fill, geometry, keys, mha, page, walk, write_4k,
};
use hicache_core::raw::{AlignedBuf, ObjectKey, ReadItem, Slice, StorageBackend, WriteItem};
use hicache_core::{
    ConfigLoader, Error, HostSlots, Layout, MemoryRegion, MissReason, MmapPool, ReadOutcome,
};
use hicache_posix::EngineChoice;

/// Pages are private to their owner by default (they come from users' prompts): files 0600,
/// dirs 0700; other modes are a parameter, and modes that lock the owner out are refused.
#[tokio::test]
async fn pages_and_dirs_are_private_by_default() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: umask only changes this process's file-creation mask; 0 shows the modes as set.
    let old = unsafe { libc::umask(0) };
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let b = backend_with(&root, false, engine);
        let buf = AlignedBuf::zeroed(4096, 4096).unwrap();
        let region = b.register(MemoryRegion::from_aligned(buf)).unwrap();
        let key = ObjectKey::new("private").unwrap();
        let w = b
            .write(&[WriteItem {
                key: &key,
                segments: &[Slice::new(region, 0, 4096)],
            }])
            .await;
        assert!(w[0].is_ok(), "{engine:?}: {w:?}");
        let file = b.object_path(&key);
        assert_eq!(mode(&file), 0o600, "{engine:?}: {}", file.display());
        assert_eq!(
            mode(file.parent().unwrap()),
            0o700,
            "{engine:?}: bucket dir"
        );
        assert_eq!(mode(&root), 0o700, "{engine:?}: storage dir");
    }
    // SAFETY: restores the mask read above.
    unsafe { libc::umask(old) };

    let dir = tempfile::tempdir().unwrap();
    let load = |extra: &str| {
        ConfigLoader::new()
            .set("storage_dir", dir.path().display().to_string())
            .set("plugin", "posix")
            .set(format!("plugin.posix.{extra}"), 0o400)
            .load()
            .and_then(|c| {
                let registry =
                    hicache_core::PluginRegistry::from_descriptors([&hicache_posix::DESCRIPTOR])?;
                registry.open(&c).map(drop)
            })
    };
    for param in ["file_mode", "dir_mode"] {
        let err = load(param).unwrap_err().to_string();
        assert!(err.contains(param), "{err}");
    }
}

/// A link planted under a root, at the bucket level or under a key, is refused with
/// `Error::UnsafePath` by both engines; nothing outside the root is read or written.
#[tokio::test]
async fn links_under_a_root_are_refused_with_a_typed_error() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, vec![7u8; 4096]).unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = AlignedBuf::zeroed(4096, 4096).unwrap();
        let region = b.register(MemoryRegion::from_aligned(buf)).unwrap();
        let segs = [Slice::new(region, 0, 4096)];
        // A page that is a link to a file outside the root.
        let page = ObjectKey::new("page").unwrap();
        std::os::unix::fs::symlink(&victim, b.object_path(&page)).unwrap();
        let r = b
            .read(&[ReadItem {
                key: &page,
                segments: &segs,
            }])
            .await;
        assert!(
            matches!(r[0], Err(Error::UnsafePath { .. })),
            "{engine:?}: {:?}",
            r[0]
        );
        let e = b.exists(std::slice::from_ref(&page)).await;
        assert!(
            matches!(e[0], Err(Error::UnsafePath { .. })),
            "{engine:?}: {:?}",
            e[0]
        );
        // A bucket dir that is a link: writes into it are refused.
        let other = (0..1000)
            .map(|i| ObjectKey::new(format!("k{i}")).unwrap())
            .find(|k| b.object_path(k).parent() != b.object_path(&page).parent())
            .unwrap();
        let bucket = b.object_path(&other).parent().unwrap().to_path_buf();
        std::fs::remove_dir(&bucket).unwrap();
        std::os::unix::fs::symlink(outside.path(), &bucket).unwrap();
        let w = b
            .write(&[WriteItem {
                key: &other,
                segments: &segs,
            }])
            .await;
        match &w[0] {
            Err(err @ Error::UnsafePath { path, .. }) => {
                assert!(path.starts_with(dir.path()), "{path:?}");
                assert!(err.to_string().contains("symbolic link"), "{err}");
            }
            other => panic!("{engine:?}: {other:?}"),
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read(&victim).unwrap(), vec![7u8; 4096]);
        b.deregister(region).unwrap();
    }
}

/// A filesystem that fills up mid-batch: the pages that did not fit fail one by one with
/// ENOSPC, the ones that fit read back exactly, nothing half-written is left, and removing
/// the pages gives all the space back (a second fill stores as many pages again).
#[tokio::test]
async fn a_full_filesystem_fails_writes_per_page_and_leaks_no_space() {
    for engine in [EngineChoice::Threads, EngineChoice::Uring] {
        let fs = hicache_testkit::fixtures::TestMount::new("tmpfs", "size=2m")
            .unwrap_or_else(|e| panic!("mount -t tmpfs failed ({e}); this test needs root"));
        let cache = connector_with(&[fs.path().to_path_buf()], false, "m", engine);
        const PAGES: u64 = 48;
        // 64 KiB pages: 3 MiB of pages for 2 MiB of filesystem.
        let g = geometry(Layout::PageFirst, 32, mha())
            .with_pages(2 * PAGES)
            .unwrap();
        let pool = Arc::new(MmapPool::new(g).unwrap());
        cache.register_pool(pool.clone()).unwrap();
        let data: Vec<Vec<u8>> = (0..PAGES).map(|p| fill(&pool, p, p as u8)).collect();
        let ks = keys("full", PAGES as usize);
        let src: Vec<u64> = (0..PAGES).collect();
        let dst: Vec<u64> = (PAGES..2 * PAGES).collect();
        let mut stored = Vec::new();
        let free_before = hicache_posix::space(fs.path()).unwrap().0;
        for round in 0..2 {
            let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await.unwrap();
            let written = set.iter().filter(|r| r.is_ok()).count();
            let full: Vec<String> = set
                .iter()
                .filter_map(|r| r.as_ref().err().map(ToString::to_string))
                .collect();
            assert!(written > 0, "{engine:?} round {round}: nothing fit");
            assert!(!full.is_empty(), "{engine:?} round {round}: everything fit");
            // Both engines continue a short write until the kernel says ENOSPC (one protocol,
            // `crate::protocol::op`): the page fails, named, and nothing is left behind.
            assert!(
                full.iter().all(|e| e.contains("os error 28")),
                "{engine:?}: {full:?}"
            );
            let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await.unwrap();
            for (i, (s, g)) in set.iter().zip(&got).enumerate() {
                match (s, g) {
                    (Ok(_), Ok(ReadOutcome::Hit)) => {
                        assert_eq!(page(&pool, dst[i]), data[i], "{engine:?} page {i}")
                    }
                    (Err(_), Ok(ReadOutcome::Miss(MissReason::NotFound))) => {}
                    other => panic!("{engine:?} round {round} page {i}: {other:?}"),
                }
            }
            let temps: Vec<String> = walk(fs.path())
                .into_iter()
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".t"))
                .map(|p| p.display().to_string())
                .collect();
            assert!(temps.is_empty(), "{engine:?}: {temps:?}");
            stored.push(written);
            for r in cache.batch_remove(&ks).await.unwrap() {
                r.unwrap();
            }
            // The kernel releases the file of a fixed io_uring slot that a failed chain
            // left open once the requests that used the slot are retired, which can be a
            // moment after the call returns (seen once under load: 29 pages fit after 30), so
            // tmpfs may give the space back late. Wait for it, up to 2 s: space that
            // never comes back still fails below. (The threads engine keeps removed files as
            // spares for the next round, so its free space does not come back, by design.)
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while engine == EngineChoice::Uring
                && hicache_posix::space(fs.path()).unwrap().0 < free_before
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        assert!(
            stored[1] >= stored[0],
            "{engine:?}: {} pages fit after removing {} (space leaked)",
            stored[1],
            stored[0]
        );
    }
}

const EACCES_DIR: &str = "HICACHE_TEST_EACCES_DIR";

/// Not a test on its own: run by `unreadable_pages_fail_one_by_one_for_an_unprivileged_user`
/// as user `nobody` (root reads any file, so permissions can only be tested without it).
#[test]
#[ignore = "the child process of unreadable_pages_fail_one_by_one_for_an_unprivileged_user"]
fn eacces_child_process() {
    use std::os::unix::fs::PermissionsExt;
    let dir = PathBuf::from(std::env::var(EACCES_DIR).expect("run by its parent test"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cache = connector_with(
            std::slice::from_ref(&dir),
            false,
            "m",
            EngineChoice::Threads,
        );
        let g = geometry(Layout::PageFirst, 16, mha())
            .with_pages(8)
            .unwrap();
        let pool = Arc::new(MmapPool::new(g).unwrap());
        cache.register_pool(pool.clone()).unwrap();
        let data: Vec<Vec<u8>> = (0..4).map(|p| fill(&pool, p, 40 + p as u8)).collect();
        let ks = keys("perm", 4);
        let set = cache
            .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
            .await
            .unwrap();
        assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
        let b = backend(&dir, false);
        for k in &ks[1..3] {
            let path = b.object_path(&cache.object_names(k).unwrap()[0]);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        }
        let got = cache
            .batch_get(&ks, HostSlots::Pages(&[4, 5, 6, 7]))
            .await
            .unwrap();
        for i in [0usize, 3] {
            assert!(
                matches!(got[i], Ok(ReadOutcome::Hit)),
                "page {i}: {:?}",
                got[i]
            );
            assert_eq!(page(&pool, 4 + i as u64), data[i]);
        }
        for i in [1usize, 2] {
            match &got[i] {
                Err(e) => assert!(e.to_string().contains("os error 13"), "page {i}: {e}"),
                other => panic!("page {i} is unreadable but read as {other:?}"),
            }
        }
        println!("eacces-child: checked");
    });
}

#[test]
fn unreadable_pages_fail_one_by_one_for_an_unprivileged_user() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    std::os::unix::fs::chown(&store, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A copy of this binary where `nobody` can reach it (the checkout may not be).
    let exe = dir.path().join("posix-test");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(&exe)
        .args([
            "--exact",
            "safety::eacces_child_process",
            "--ignored",
            "--nocapture",
        ])
        .env(EACCES_DIR, &store)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("eacces-child: checked"), "{text}");
}

/// A directory or a FIFO planted under an object's name is never read as a page, never
/// hangs a read, and does not exist as an object, on both engines.
#[tokio::test]
async fn what_is_not_a_file_under_a_name_is_never_a_page() {
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = AlignedBuf::zeroed(8192, 4096).unwrap();
        let region = b.register(MemoryRegion::from_aligned(buf)).unwrap();
        let (a, f) = (
            ObjectKey::new("a-dir").unwrap(),
            ObjectKey::new("a-fifo").unwrap(),
        );
        std::fs::create_dir(b.object_path(&a)).unwrap();
        nix::unistd::mkfifo(&b.object_path(&f), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (sa, sf) = (
            [Slice::new(region, 0, 4096)],
            [Slice::new(region, 4096, 4096)],
        );
        let got = b
            .read(&[
                ReadItem {
                    key: &a,
                    segments: &sa,
                },
                ReadItem {
                    key: &f,
                    segments: &sf,
                },
            ])
            .await;
        for r in &got {
            assert!(r.is_err(), "{engine:?}: {got:?}");
        }
        let found = b.exists(&[a.clone(), f.clone()]).await;
        assert!(
            found.iter().all(|r| matches!(r, Ok(false))),
            "{engine:?}: {found:?}"
        );
        assert!(b.object_path(&a).is_dir());
        b.deregister(region).unwrap();
    }
}

/// `exists` answers names it has seen from an index instead of a `stat`, and stays exactly
/// as true as a `stat` when another process removes, replaces or links over a page, or
/// removes and recreates its bucket dir.
#[tokio::test]
async fn exists_from_the_index_follows_every_outside_change() {
    for engine in [EngineChoice::Threads, EngineChoice::Uring] {
        let dir = tempfile::tempdir().unwrap();
        let b = backend_with(dir.path(), false, engine);
        let buf = AlignedBuf::zeroed(4096, 4096).unwrap();
        let region = b.register(MemoryRegion::from_aligned(buf)).unwrap();
        let key = ObjectKey::new("page").unwrap();
        let path = b.object_path(&key);
        let write = || write_4k(&b, region, &key);
        let exists = || async { b.exists(std::slice::from_ref(&key)).await.remove(0) };
        // Seen once by a stat, then answered by the index.
        let found_then_known = || async {
            assert!(exists().await.unwrap(), "{engine:?}");
            let before = b.exists_from_index();
            assert!(exists().await.unwrap(), "{engine:?}");
            assert_eq!(b.exists_from_index(), before + 1, "{engine:?}");
        };
        write().await;
        found_then_known().await;
        // Removed from outside.
        std::fs::remove_file(&path).unwrap();
        assert!(!exists().await.unwrap(), "{engine:?}");
        // A link renamed over it from outside: an error, as a stat says.
        write().await;
        found_then_known().await;
        let link = path.with_file_name("planted");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        std::fs::rename(&link, &path).unwrap();
        assert!(exists().await.is_err(), "{engine:?}");
        std::fs::remove_file(&path).unwrap();
        // The bucket dir removed and made again while the backend holds the old one.
        write().await;
        found_then_known().await;
        let bucket = path.parent().unwrap();
        std::fs::remove_dir_all(bucket).unwrap();
        std::fs::create_dir(bucket).unwrap();
        assert!(!exists().await.unwrap(), "{engine:?}");
        // A page another process publishes there is found, and then known.
        std::fs::write(&path, [0u8; 4096]).unwrap();
        found_then_known().await;
        std::fs::remove_file(&path).unwrap();
        assert!(!exists().await.unwrap(), "{engine:?}");
    }
}
