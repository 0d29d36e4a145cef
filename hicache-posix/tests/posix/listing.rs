//! Listing: only complete objects, over every root, page by page; a cursor from elsewhere is
//! a typed error; nothing beneath a root is followed or created.

use hicache_core::Error;
use hicache_core::MemoryRegion;
use hicache_core::raw::{AlignedBuf, ListCursor, ObjectKey, StorageBackend, list_all};

use super::{backend, write_4k};

#[tokio::test]
async fn only_complete_objects_are_listed_and_links_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("k-outside"), b"x").unwrap();
    let b = backend(dir.path(), false);
    let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
    let id = b.register(region).unwrap();
    let keys: Vec<ObjectKey> = (0..5)
        .map(|i| ObjectKey::new(format!("k-{i}")).unwrap())
        .collect();
    for k in &keys {
        write_4k(&b, id, k).await;
    }
    // A writer's temporary file, a dir and a link planted in a bucket, and a link bucket.
    let bucket = b.object_path(&keys[0]).parent().unwrap().to_path_buf();
    std::fs::write(bucket.join(".tmp-staged"), b"half").unwrap();
    std::fs::create_dir(bucket.join("k-dir")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("k-outside"), bucket.join("k-link")).unwrap();

    let listed = list_all(&b, "k-", 2).await.unwrap();
    let mut names: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    names.sort();
    assert_eq!(names, ["k-0", "k-1", "k-2", "k-3", "k-4"]);
    assert!(
        listed
            .iter()
            .all(|l| l.size == 4096 && l.modified.is_some())
    );
    assert!(list_all(&b, "other-", 2).await.unwrap().is_empty());

    for garbage in ["", "x/y/z", "0/zz/k", "9/00"] {
        let e = b
            .list("k-", Some(&ListCursor(garbage.into())), 2)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidBatch { .. }),
            "{garbage:?}: {e:?}"
        );
    }
    b.deregister(id).unwrap();
}

#[tokio::test]
async fn a_listing_covers_every_root() {
    let a = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    let cfg = hicache_posix::PosixConfig {
        dirs: vec![a.path().to_path_buf(), c.path().to_path_buf()],
        direct_io: false,
        engine: hicache_posix::EngineChoice::Threads,
        threads: 2,
        queue_depth: 64,
        sync: hicache_posix::SyncMode::None,
        spare_bytes: 0,
        cleaner: None,
        file_mode: 0o600,
        dir_mode: 0o700,
    };
    let b = hicache_posix::PosixBackend::new(&cfg).unwrap();
    let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
    let id = b.register(region).unwrap();
    let keys: Vec<ObjectKey> = (0..40)
        .map(|i| ObjectKey::new(format!("m-{i}")).unwrap())
        .collect();
    for k in &keys {
        write_4k(&b, id, k).await;
    }
    let roots: std::collections::BTreeSet<_> = keys
        .iter()
        .map(|k| {
            b.object_path(k)
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .to_path_buf()
        })
        .collect();
    assert_eq!(roots.len(), 2, "40 keys use both roots");
    let listed = list_all(&b, "m-", 7).await.unwrap();
    assert_eq!(listed.len(), 40);
    b.deregister(id).unwrap();
}
