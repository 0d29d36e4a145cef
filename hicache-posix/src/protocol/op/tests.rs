//! The interpreter alone: results handed in as an engine would (values, or minus the errno),
//! and the next phase or outcome it decides. The engines' own tests run the same operations
//! against real files.

use super::*;
use crate::beneath::RootDir;
use crate::root::FlushCounter;
use Step::*;
use hicache_core::{MissReason, ReadOutcome};

fn root(dir: &std::path::Path, recycling: bool) -> Root {
    std::fs::create_dir_all(dir.join("ab")).unwrap();
    let rd = RootDir::open(dir, 0o700).unwrap();
    let spares = recycling.then(|| crate::spare::SparePool::new(&rd, 1 << 20, 0o700).unwrap());
    Root {
        dir: rd,
        direct: false,
        spares,
        file_mode: 0o600,
        flushed: FlushCounter::default(),
    }
}

fn write(r: &Root, iov: &[libc::iovec]) -> Op {
    let expected = iov.iter().map(|v| v.iov_len as u64).sum();
    Op::new(r, OpKind::Write, SyncMode::None, *b"ab", b"k", expected).unwrap()
}

fn err(errno: i32) -> i64 {
    -i64::from(errno)
}

fn outcome(next: Next) -> Result<Outcome, IoFailure> {
    match next {
        Next::Done(result) => result,
        Next::Run => panic!("the operation goes on"),
    }
}

#[test]
fn a_short_write_continues_from_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    let (mut a, mut b) = ([1u8; 6], [2u8; 4]);
    let iov = [
        libc::iovec {
            iov_base: a.as_mut_ptr().cast(),
            iov_len: 6,
        },
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: 4,
        },
    ];
    let mut op = write(&r, &iov);
    let first = [OpenStaged, Write, Close, Publish(Rename::Plain)];
    assert_eq!(op.steps().as_slice(), first);
    // 7 of 10 bytes: the link broke, the file is still open.
    let next = op.advance(&r, &iov, &[0, 7, NOT_RUN, NOT_RUN]);
    assert!(matches!(next, Next::Run));
    assert!(op.is_open());
    assert_eq!(
        op.steps().as_slice(),
        [Write, Close, Publish(Rename::Plain)]
    );
    assert_eq!((op.written(), op.remaining()), (7, 3));
    let rest = op.write_iov(&iov);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].iov_len, 3);
    assert_eq!(rest[0].iov_base as usize, b.as_ptr() as usize + 1);
    // Two more, then one: published.
    assert!(matches!(
        op.advance(&r, &iov, &[2, NOT_RUN, NOT_RUN]),
        Next::Run
    ));
    assert_eq!((op.written(), op.write_iov(&iov)[0].iov_len), (9, 1));
    let done = outcome(op.advance(&r, &iov, &[1, 0, 0])).unwrap();
    assert!(matches!(done, Outcome::Done));
    assert!(!op.is_open());
}

#[test]
fn a_write_that_makes_no_progress_fails_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    let mut a = [1u8; 8];
    let iov = [libc::iovec {
        iov_base: a.as_mut_ptr().cast(),
        iov_len: 8,
    }];
    let mut op = write(&r, &iov);
    // The staged temp file exists, as the open step made it.
    std::fs::write(
        dir.path()
            .join("ab")
            .join(String::from_utf8_lossy(op.tmp().as_bytes()).as_ref()),
        b"",
    )
    .unwrap();
    let e = outcome(op.advance(&r, &iov, &[0, 0, NOT_RUN, NOT_RUN])).unwrap_err();
    assert_eq!(e.op, "pwritev");
    assert!(e.error.to_string().contains("short write: 0 of 8"), "{e:?}");
    assert_eq!(std::fs::read_dir(dir.path().join("ab")).unwrap().count(), 0);
    // A failed write step reports its errno.
    let mut op = write(&r, &iov);
    let e = outcome(op.advance(&r, &iov, &[0, err(libc::ENOSPC), NOT_RUN, NOT_RUN])).unwrap_err();
    assert_eq!(e.error.raw_os_error(), Some(libc::ENOSPC));
}

#[test]
fn a_stored_key_is_exchanged_and_a_filesystem_without_flags_renames() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), true);
    let mut a = [1u8; 8];
    let iov = [libc::iovec {
        iov_base: a.as_mut_ptr().cast(),
        iov_len: 8,
    }];
    let mut op = write(&r, &iov);
    let first = op.steps();
    assert_eq!(first.as_slice()[3], Publish(Rename::NoReplace));
    assert!(matches!(
        op.advance(&r, &iov, &[0, 8, 0, err(libc::EEXIST)]),
        Next::Run
    ));
    assert_eq!(op.steps().as_slice(), [Publish(Rename::Exchange)]);
    // The key went between the two calls: a plain rename publishes.
    assert!(matches!(
        op.advance(&r, &iov, &[err(libc::ENOENT)]),
        Next::Run
    ));
    assert_eq!(op.steps().as_slice(), [Publish(Rename::Plain)]);
    assert!(matches!(
        outcome(op.advance(&r, &iov, &[0])).unwrap(),
        Outcome::Done
    ));
    // A filesystem that refuses the flags: plain renames from now on.
    let mut op = write(&r, &iov);
    assert!(matches!(
        op.advance(&r, &iov, &[0, 8, 0, err(libc::EINVAL)]),
        Next::Run
    ));
    assert_eq!(op.steps().as_slice(), [Publish(Rename::Plain)]);
    assert!(!r.spares.as_ref().unwrap().exchange.load(Ordering::Relaxed));
    let op = write(&r, &iov);
    assert_eq!(op.steps().as_slice()[3], Publish(Rename::Plain));
}

#[test]
fn opens_that_raced_a_rename_run_again_a_few_times() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    let mut op = Op::new(&r, OpKind::Read, SyncMode::None, *b"ab", b"k", 8).unwrap();
    let raced = [err(libc::EAGAIN), NOT_RUN, NOT_RUN, NOT_RUN];
    for _ in 0..OPEN_RETRIES {
        assert!(matches!(op.advance(&r, &[], &raced), Next::Run));
    }
    let e = outcome(op.advance(&r, &[], &raced)).unwrap_err();
    assert_eq!((e.op, e.error.raw_os_error()), ("open", Some(libc::EAGAIN)));
}

#[test]
fn a_read_is_judged_by_what_it_and_its_guard_saw() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    let read = |res: [i64; 4]| {
        let mut op = Op::new(&r, OpKind::Read, SyncMode::None, *b"ab", b"k", 8).unwrap();
        assert_eq!(op.steps().as_slice(), [OpenObject, Read, Guard, Close]);
        outcome(op.advance(&r, &[], &res))
    };
    let hit = read([0, 8, 0, 0]).unwrap();
    assert!(matches!(hit, Outcome::Read(ReadOutcome::Hit)));
    let missing = read([err(libc::ENOENT), NOT_RUN, NOT_RUN, NOT_RUN]).unwrap();
    assert!(matches!(
        missing,
        Outcome::Read(ReadOutcome::Miss(MissReason::NotFound))
    ));
    // Longer than expected: the size is looked up under the name.
    std::fs::write(dir.path().join("ab/k"), [0u8; 20]).unwrap();
    let longer = read([0, 8, 12, 0]).unwrap();
    assert!(matches!(
        longer,
        Outcome::Read(ReadOutcome::Miss(MissReason::SizeMismatch {
            expected: 8,
            found: 20
        }))
    ));
    let e = read([0, err(libc::EIO), 0, 0]).unwrap_err();
    assert_eq!((e.op, e.error.raw_os_error()), ("preadv", Some(libc::EIO)));
}

#[test]
fn removals_recycle_regular_files_and_unlink_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), true);
    let remove = || Op::new(&r, OpKind::Remove, SyncMode::None, *b"ab", b"k", 0).unwrap();
    let mut op = remove();
    assert_eq!(op.steps().as_slice(), [StatName]);
    op.stx.stx_mode = libc::S_IFREG as u16;
    assert!(matches!(op.advance(&r, &[], &[0]), Next::Run));
    assert_eq!(op.steps().as_slice(), [MoveToSpare]);
    // The rename to a spare name failed: unlinked instead.
    assert!(matches!(
        op.advance(&r, &[], &[err(libc::ENOENT)]),
        Next::Run
    ));
    assert_eq!(op.steps().as_slice(), [Unlink]);
    assert!(outcome(op.advance(&r, &[], &[err(libc::ENOENT)])).is_ok());
    let mut op = remove();
    op.stx.stx_mode = libc::S_IFLNK as u16;
    assert!(matches!(op.advance(&r, &[], &[0]), Next::Run));
    assert_eq!(op.steps().as_slice(), [Unlink]);
    let e = outcome(op.advance(&r, &[], &[err(libc::EACCES)])).unwrap_err();
    assert_eq!(e.op, "unlink");
    // Without a spare pool a removal is one unlink.
    let plain = root(dir.path(), false);
    let op = Op::new(&plain, OpKind::Remove, SyncMode::None, *b"ab", b"k", 0).unwrap();
    assert_eq!(op.steps().as_slice(), [Unlink]);
}

#[test]
fn sync_modes_add_their_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), false);
    let op = |sync| Op::new(&r, OpKind::Write, sync, *b"ab", b"k", 8).unwrap();
    assert_eq!(
        op(SyncMode::Full).steps().as_slice(),
        [
            OpenStaged,
            Write,
            DataSync,
            Close,
            Publish(Rename::Plain),
            SyncDir
        ]
    );
    assert_eq!(op(SyncMode::Full).steps().as_slice().len(), MAX_STEPS);
    let mut full = op(SyncMode::Full);
    let mut a = [0u8; 8];
    let iov = [libc::iovec {
        iov_base: a.as_mut_ptr().cast(),
        iov_len: 8,
    }];
    // Published, but the dir's flush failed: reported.
    let e = outcome(full.advance(&r, &iov, &[0, 8, 0, 0, 0, err(libc::EIO)])).unwrap_err();
    assert_eq!(e.op, "fsync bucket dir");
    assert_eq!(r.flushed.get(), (1, 0));
}

#[test]
fn a_write_whose_bucket_dir_went_starts_over_in_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let r = root(dir.path(), true);
    let mut a = [1u8; 8];
    let iov = [libc::iovec {
        iov_base: a.as_mut_ptr().cast(),
        iov_len: 8,
    }];
    // The staged spare lies in the bucket dir: with the dir gone, the publish finds nothing.
    let mut op = write(&r, &iov);
    let staged = op.tmp().as_bytes().to_vec();
    std::fs::remove_dir_all(dir.path().join("ab")).unwrap();
    assert!(matches!(
        op.advance(&r, &iov, &[0, 8, 0, err(libc::ENOENT)]),
        Next::Run
    ));
    assert!(
        dir.path().join("ab").is_dir(),
        "the bucket dir is recreated"
    );
    assert_eq!(
        op.steps().as_slice(),
        [OpenStaged, Write, Close, Publish(Rename::NoReplace)],
        "the whole write runs again"
    );
    assert_eq!(op.written(), 0);
    assert_ne!(op.tmp().as_bytes(), staged, "under a new spare name");
    // Once only: the same again fails the write.
    assert!(outcome(op.advance(&r, &iov, &[0, 8, 0, err(libc::ENOENT)])).is_err());
    // A bucket dir that is still there: the staged file itself went, and the write fails.
    let mut op = write(&r, &iov);
    let e = outcome(op.advance(&r, &iov, &[0, 8, 0, err(libc::ENOENT)])).unwrap_err();
    assert_eq!(e.op, "rename");
}
