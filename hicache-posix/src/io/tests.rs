//! The blocking operations against real files: publish, read, stat, unlink, recycling,
//! links and FIFOs under a root, sync modes.

use super::*;
use crate::beneath::RootDir;
use crate::name::{NAME_CAP, Name, hex};
use crate::root::FlushCounter;
use hicache_core::{MissReason, ReadOutcome};

use crate::config::SyncMode::{self, Data, Full, None as NoSync};
use crate::protocol::OpKind;
use std::os::unix::fs::symlink;

/// Runs one operation of `kind` on object `name` with blocking calls, as the thread pool
/// runs a plan's item without a data path.
fn run_item(
    root: &Root,
    kind: OpKind,
    sync: SyncMode,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    scratch: &mut Scratch,
) -> Result<Outcome, IoFailure> {
    let expected = iov.iter().map(|v| v.iov_len as u64).sum();
    let op = Op::new(root, kind, sync, bucket, name, expected)?;
    run(root, op, iov, scratch, None)
}

/// Room for one operation, as one I/O thread holds it.
fn scratch() -> Scratch {
    Scratch::new(4096).unwrap()
}

fn write_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
    sync: SyncMode,
) -> Result<(), IoFailure> {
    run_item(root, OpKind::Write, sync, bucket, name, iov, &mut scratch()).map(|_| ())
}

fn read_object(
    root: &Root,
    bucket: [u8; 2],
    name: &[u8],
    iov: &[libc::iovec],
) -> Result<ReadOutcome, IoFailure> {
    match run_item(
        root,
        OpKind::Read,
        NoSync,
        bucket,
        name,
        iov,
        &mut scratch(),
    )? {
        Outcome::Read(outcome) => Ok(outcome),
        other => panic!("a read ended with {other:?}"),
    }
}

fn object_exists(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<bool, IoFailure> {
    match run_item(
        root,
        OpKind::Exists,
        NoSync,
        bucket,
        name,
        &[],
        &mut scratch(),
    )? {
        Outcome::Exists(found) => Ok(found),
        other => panic!("exists ended with {other:?}"),
    }
}

fn remove_object(root: &Root, bucket: [u8; 2], name: &[u8]) -> Result<(), IoFailure> {
    run_item(
        root,
        OpKind::Remove,
        NoSync,
        bucket,
        name,
        &[],
        &mut scratch(),
    )
    .map(|_| ())
}

fn root(dir: &std::path::Path, direct: bool) -> Root {
    std::fs::create_dir_all(dir.join("ab")).unwrap();
    Root {
        dir: RootDir::open(dir, 0o700).unwrap(),
        direct,
        spares: None,
        file_mode: 0o600,
        flushed: FlushCounter::default(),
    }
}

fn recycling_root(dir: &std::path::Path) -> Root {
    std::fs::create_dir_all(dir.join("ab")).unwrap();
    let rd = RootDir::open(dir, 0o700).unwrap();
    let spares = crate::spare::SparePool::new(&rd, 200, 0o700).unwrap();
    Root {
        dir: rd,
        direct: false,
        spares: Some(spares),
        file_mode: 0o600,
        flushed: FlushCounter::default(),
    }
}

fn iov(buf: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

#[test]
fn write_read_stat_remove() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    let mut a = vec![1u8; 100];
    let mut b = vec![2u8; 50];
    write_object(&r, *b"ab", b"obj", &[iov(&mut a), iov(&mut b)], Full).unwrap();
    assert!(object_exists(&r, *b"ab", b"obj").unwrap());
    let on_disk = std::fs::read(dir.path().join("ab/obj")).unwrap();
    assert_eq!(on_disk.len(), 150);
    let mut x = vec![0u8; 120];
    let mut y = vec![0u8; 30];
    let out = read_object(&r, *b"ab", b"obj", &[iov(&mut x), iov(&mut y)]).unwrap();
    assert_eq!(out, ReadOutcome::Hit);
    assert!(x[..100].iter().all(|v| *v == 1) && x[100..].iter().all(|v| *v == 2));
    assert!(y.iter().all(|v| *v == 2));
    let mut short = vec![0u8; 149];
    assert!(matches!(
        read_object(&r, *b"ab", b"obj", &[iov(&mut short)]).unwrap(),
        ReadOutcome::Miss(MissReason::SizeMismatch {
            expected: 149,
            found: 150
        })
    ));
    assert_eq!(
        read_object(&r, *b"ab", b"none", &[iov(&mut short)]).unwrap(),
        ReadOutcome::Miss(MissReason::NotFound)
    );
    remove_object(&r, *b"ab", b"obj").unwrap();
    remove_object(&r, *b"ab", b"obj").unwrap();
    assert!(!object_exists(&r, *b"ab", b"obj").unwrap());
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path().join("ab")).unwrap().count(), 0);
}

#[test]
fn missing_bucket_dir_is_recreated_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    std::fs::remove_dir(dir.path().join("ab")).unwrap();
    let mut a = vec![3u8; 10];
    write_object(&r, *b"ab", b"obj", &[iov(&mut a)], NoSync).unwrap();
    assert!(object_exists(&r, *b"ab", b"obj").unwrap());
}

#[test]
fn errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    // A file where the bucket dir belongs: creating the bucket dir fails.
    std::fs::write(dir.path().join("cd"), b"").unwrap();
    let mut a = vec![3u8; 10];
    let e = write_object(&r, *b"cd", b"obj", &[iov(&mut a)], NoSync).unwrap_err();
    assert_eq!(e.op, "open bucket dir");
    assert_eq!(e.path, dir.path().join("cd"));
    let long = vec![b'x'; NAME_CAP];
    let e = read_object(&r, *b"ab", &long, &[iov(&mut a)]).unwrap_err();
    assert_eq!(e.op, "build name");
}

#[test]
fn replaced_and_removed_objects_are_recycled() {
    let dir = tempfile::tempdir().unwrap();
    let r = recycling_root(dir.path());
    let pool = r.spares.as_ref().unwrap();
    let mut a = vec![1u8; 100];
    let mut b = vec![2u8; 100];
    write_object(&r, *b"ab", b"k", &[iov(&mut a)], NoSync).unwrap();
    assert_eq!(pool.len(), 0);
    // Replacing k keeps the old file as a spare; the new content is published.
    write_object(&r, *b"ab", b"k", &[iov(&mut b)], NoSync).unwrap();
    assert_eq!(pool.len(), 1);
    assert_eq!(
        std::fs::read(dir.path().join("ab/k")).unwrap(),
        vec![2u8; 100]
    );
    // Once no read is in flight, the next 100-byte object reuses that spare in place.
    let mut probe = vec![0u8; 100];
    assert_eq!(
        read_object(&r, *b"ab", b"k", &[iov(&mut probe)]).unwrap(),
        ReadOutcome::Hit
    );
    let mut c = vec![3u8; 100];
    write_object(&r, *b"ab", b"other", &[iov(&mut c)], NoSync).unwrap();
    assert_eq!(pool.len(), 0);
    assert_eq!(
        std::fs::read(dir.path().join("ab/other")).unwrap(),
        vec![3u8; 100]
    );
    assert_eq!(
        std::fs::read(dir.path().join("ab/k")).unwrap(),
        vec![2u8; 100]
    );
    // A spare of another size is not used.
    remove_object(&r, *b"ab", b"other").unwrap();
    assert_eq!(pool.len(), 1);
    let mut d = vec![4u8; 50];
    write_object(&r, *b"ab", b"small", &[iov(&mut d)], NoSync).unwrap();
    assert_eq!(pool.len(), 1);
    assert_eq!(
        std::fs::read(dir.path().join("ab/small")).unwrap(),
        vec![4u8; 50]
    );
    // The cap (200 bytes) holds: a spare that would exceed it is unlinked, not pooled.
    remove_object(&r, *b"ab", b"k").unwrap();
    remove_object(&r, *b"ab", b"small").unwrap();
    assert_eq!(pool.len(), 2);
    assert!(!dir.path().join("ab/k").exists());
    // The spares lie in the bucket dir, under names no key can take.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("ab"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_encoded_bytes())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.iter().all(|n| crate::name::spare_tag(n).is_some()),
        "{names:?}"
    );
    // A write to a bucket dir without spares takes one from another dir.
    let mut e = vec![5u8; 100];
    write_object(&r, *b"cd", b"elsewhere", &[iov(&mut e)], NoSync).unwrap();
    assert_eq!(pool.len(), 1);
    assert_eq!(
        std::fs::read(dir.path().join("cd/elsewhere")).unwrap(),
        vec![5u8; 100]
    );
    assert_eq!(std::fs::read_dir(dir.path().join("ab")).unwrap().count(), 1);
    assert_eq!(std::fs::read_dir(dir.path().join("cd")).unwrap().count(), 1);
}

#[test]
fn hex_names() {
    assert_eq!(hex(0, &mut [0; 16]), b"0");
    assert_eq!(hex(0xabc, &mut [0; 16]), b"abc");
    assert_eq!(hex(u64::MAX, &mut [0; 16]), b"ffffffffffffffff");
}

/// A link planted at every level a root has: bucket dir, page, spare file, temp name. Nothing outside the root is read, written or removed.
#[test]
fn links_at_every_level_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let snapshot = || {
        let mut names: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        (names, std::fs::read(&victim).unwrap())
    };
    let before = snapshot();
    for recycling in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let r = if recycling {
            recycling_root(dir.path())
        } else {
            root(dir.path(), false)
        };
        // A bucket dir that is a link: writes, reads, exists and removes refuse it.
        symlink(outside.path(), dir.path().join("cd")).unwrap();
        let mut a = vec![7u8; 8];
        let e = write_object(&r, *b"cd", b"k", &[iov(&mut a)], NoSync).unwrap_err();
        assert!(beneath::is_link_error(&e.error), "{e:?}");
        assert!(read_object(&r, *b"cd", b"victim", &[iov(&mut a)]).is_err());
        assert!(object_exists(&r, *b"cd", b"victim").is_err());
        assert!(remove_object(&r, *b"cd", b"victim").is_err());
        // A page that is a link: read and exists refuse it; a write replaces the link
        // (the name), never the file it points to; remove unlinks the link itself.
        symlink(&victim, dir.path().join("ab/page")).unwrap();
        let mut buf = vec![0u8; 8];
        let e = read_object(&r, *b"ab", b"page", &[iov(&mut buf)]).unwrap_err();
        assert!(beneath::is_link_error(&e.error), "{e:?}");
        let e = object_exists(&r, *b"ab", b"page").unwrap_err();
        assert!(beneath::is_link_error(&e.error), "{e:?}");
        write_object(&r, *b"ab", b"page", &[iov(&mut a)], NoSync).unwrap();
        assert_eq!(std::fs::read(dir.path().join("ab/page")).unwrap(), a);
        assert!(!dir.path().join("ab/page").is_symlink());
        symlink(&victim, dir.path().join("ab/page2")).unwrap();
        remove_object(&r, *b"ab", b"page2").unwrap();
        assert!(!dir.path().join("ab/page2").is_symlink());
        // Replacing and removing recycle; a later write reuses spares, never a link.
        write_object(&r, *b"ab", b"page", &[iov(&mut a)], NoSync).unwrap();
        remove_object(&r, *b"ab", b"page").unwrap();
        if recycling {
            let mut planted = 0;
            for e in std::fs::read_dir(dir.path().join("ab")).unwrap() {
                let e = e.unwrap();
                if crate::name::spare_tag(e.file_name().as_encoded_bytes()).is_some() {
                    std::fs::remove_file(e.path()).unwrap();
                    symlink(&victim, e.path()).unwrap();
                    planted += 1;
                }
            }
            assert!(planted > 0, "the spares lie in the bucket dir");
        }
        for i in 0..4 {
            let k = format!("n{i}");
            write_object(&r, *b"ab", k.as_bytes(), &[iov(&mut a)], NoSync).unwrap();
            assert!(!dir.path().join("ab").join(&k).is_symlink());
        }
        assert_eq!(snapshot(), before, "recycling = {recycling}");
    }
}

#[test]
fn fifos_under_a_root_do_not_hang_reads() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    nix::unistd::mkfifo(&dir.path().join("ab/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut buf = vec![0u8; 8];
    assert!(read_object(&r, *b"ab", b"fifo", &[iov(&mut buf)]).is_err());
    assert!(!object_exists(&r, *b"ab", b"fifo").unwrap());
}

#[test]
fn every_sync_mode_publishes() {
    for mode in [NoSync, Data, Full] {
        let dir = tempfile::tempdir().unwrap();
        for r in [root(dir.path(), false), recycling_root(dir.path())] {
            let mut a = vec![9u8; 64];
            write_object(&r, *b"ab", b"k", &[iov(&mut a)], mode).unwrap();
            write_object(&r, *b"ab", b"k", &[iov(&mut a)], mode).unwrap();
            assert_eq!(std::fs::read(dir.path().join("ab/k")).unwrap(), a);
        }
    }
}

#[test]
fn temp_names_are_unpredictable_and_distinct() {
    let a = Name::temp();
    let b = Name::temp();
    assert_ne!(a.as_bytes(), b.as_bytes());
    assert!(a.as_bytes().starts_with(b".t"));
    // 16 random hex digits sit between ".t" and "-".
    let text = String::from_utf8(a.as_bytes().to_vec()).unwrap();
    let random = &text[2..text.find('-').unwrap()];
    assert!(random.len() >= 12, "{text}");
}

#[test]
fn a_removed_tree_is_recreated_under_a_running_root() {
    let dir = tempfile::tempdir().unwrap();
    for r in [root(dir.path(), false), recycling_root(dir.path())] {
        let mut a = vec![5u8; 32];
        write_object(&r, *b"ab", b"k", &[iov(&mut a)], NoSync).unwrap();
        std::fs::remove_dir_all(dir.path().join("ab")).unwrap();
        let _ = std::fs::remove_dir_all(dir.path().join(crate::spare::SPARE_DIR));
        let mut back = vec![0u8; 32];
        assert_eq!(
            read_object(&r, *b"ab", b"k", &[iov(&mut back)]).unwrap(),
            ReadOutcome::Miss(MissReason::NotFound)
        );
        for i in 0..3 {
            let k = format!("k{i}");
            write_object(&r, *b"ab", k.as_bytes(), &[iov(&mut a)], NoSync).unwrap();
            assert_eq!(
                read_object(&r, *b"ab", k.as_bytes(), &[iov(&mut back)]).unwrap(),
                ReadOutcome::Hit
            );
        }
    }
}

/// Spare names sit in shared bucket dirs and their ids are sequential, so another process
/// can take the next one first: the write picks another name and leaves what is there
/// alone (a link is not followed).
#[test]
fn a_taken_spare_name_is_skipped_and_left_alone() {
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let r = recycling_root(dir.path());
    let pool = r.spares.as_ref().unwrap();
    std::fs::create_dir_all(dir.path().join("ab")).unwrap();
    let planted = |id: u64| {
        dir.path()
            .join("ab")
            .join(String::from_utf8(pool.name(id).as_bytes().to_vec()).unwrap())
    };
    std::fs::write(planted(0), b"someone else's").unwrap();
    symlink(&victim, planted(1)).unwrap();
    let mut a = vec![6u8; 100];
    write_object(&r, *b"ab", b"k", &[iov(&mut a)], NoSync).unwrap();
    assert_eq!(std::fs::read(dir.path().join("ab/k")).unwrap(), a);
    assert_eq!(std::fs::read(planted(0)).unwrap(), b"someone else's");
    assert!(planted(1).is_symlink());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}
