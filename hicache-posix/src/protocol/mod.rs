//! What an object operation's system calls mean, decided in one place for both engines:
//! [`op`] writes each operation as phases of steps with one interpreter of their results
//! (the thread pool runs the steps one by one, io_uring as a linked chain); the rules it
//! applies are here.
//!
//! **Read**: `open(name) → read(expected bytes + a guard block) → close`. The guard asks for
//! bytes past the expected end in the same call, so one read of the opened file proves its
//! length: no `stat` before the open that a concurrent replacement could slip past, and no
//! `fstat` after it. Only a miss looks closer, at the name again (the file is closed by
//! then), to report the stored size and to refuse what is not a regular file.
//!
//! **Exists**: `stat(name)` without following links: a regular file exists, a link is an
//! error, anything else is absent.
//!
//! **Publish** (a write staged in a spare file): `renameat2(RENAME_NOREPLACE)` publishes a new
//! key in one call; a stored key ([`AfterRename::Exchange`]) is replaced by
//! `renameat2(RENAME_EXCHANGE)`, which leaves the replaced file under the spare's name to be
//! [recycled](recycle). A filesystem without `renameat2` flags, or a key that vanished between
//! the two calls, falls back to a plain rename.
//!
//! **Remove**: a regular file is renamed to a spare name in its bucket dir and is
//! [recycled](recycle); anything
//! else under the name is unlinked (a link itself, never what it points to).

pub(crate) mod op;

use std::io;

use hicache_core::raw::AlignedBuf;
use hicache_core::{MissReason, ReadOutcome};

/// The operation a plan performs on every item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Write,
    Read,
    Exists,
    Remove,
}

/// The successful outcome of one item.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done,
    Read(ReadOutcome),
    Exists(bool),
}

/// Bytes a read asks for past the object's expected end (at least; a direct-I/O root with a
/// larger alignment gets a guard of its alignment).
pub(crate) const GUARD_LEN: usize = 4096;

/// Room for the bytes past an object's expected end. The kernel writes there only when the
/// stored file is longer than expected; nothing ever reads it.
#[derive(Debug)]
pub(crate) struct Guard(AlignedBuf);

impl Guard {
    /// A guard for roots whose direct-I/O alignment is at most `align`.
    pub(crate) fn new(align: u64) -> io::Result<Self> {
        let len = GUARD_LEN.max(usize::try_from(align).unwrap_or(usize::MAX));
        AlignedBuf::zeroed(len, len)
            .map(Guard)
            .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e.to_string()))
    }

    /// The guard as one iovec, appended after an object's iovecs.
    pub(crate) fn iovec(&mut self) -> libc::iovec {
        libc::iovec {
            iov_base: self.0.as_mut_ptr().cast(),
            iov_len: self.0.len(),
        }
    }
}

/// What the stored file turned out to be, looked up only when a read did not fit.
pub(crate) struct Stored {
    /// A regular file.
    pub(crate) regular: bool,
    /// Its size.
    pub(crate) size: u64,
}

/// The outcome of a read that asked for `expected` bytes and a guard: `got` bytes landed
/// before the object's expected end and `beyond` in the guard. `look` tells what is stored,
/// for a read that did not fit (None when it cannot be told: the size is then what the read
/// saw).
pub(crate) fn read_outcome(
    expected: u64,
    got: u64,
    beyond: u64,
    look: impl FnOnce() -> Option<Stored>,
) -> io::Result<ReadOutcome> {
    if got == expected && beyond == 0 {
        return Ok(ReadOutcome::Hit);
    }
    let found = match look() {
        Some(stored) if !stored.regular => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a regular file",
            ));
        }
        Some(stored) => stored.size,
        None => got + beyond,
    };
    Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
        expected,
        found,
    }))
}

/// Whether an error from opening or stating a name means it is absent.
pub(crate) fn is_missing(errno: i32) -> bool {
    errno == libc::ENOENT || errno == libc::ENOTDIR
}

/// Whether a name exists as an object, from its file type (`st_mode & S_IFMT`) as `stat`
/// reports it without following links.
pub(crate) fn exists_by_type(kind: u32) -> io::Result<bool> {
    match kind {
        libc::S_IFLNK => Err(io::Error::from_raw_os_error(libc::ELOOP)),
        kind => Ok(kind == libc::S_IFREG),
    }
}

/// What comes after a publishing rename of a staged spare, from its result.
#[derive(Debug)]
pub(crate) enum AfterRename {
    /// The object is published.
    Published,
    /// The key is stored already: exchange the staged file with it.
    Exchange,
    /// `renameat2` flags are not supported here (turn them off) or there was nothing to
    /// exchange with: a plain rename publishes.
    Rename {
        /// Whether the filesystem refused the flags.
        unsupported: bool,
    },
    /// The bucket dir is gone: recreate it, then rename.
    BucketGone,
    /// The publish failed.
    Failed(io::Error),
}

/// Reads the result of `renameat2(RENAME_NOREPLACE)` (`exchanged` false) or
/// `renameat2(RENAME_EXCHANGE)` (`exchanged` true) of a staged spare over the final name.
pub(crate) fn after_rename(result: io::Result<()>, exchanged: bool) -> AfterRename {
    let Err(e) = result else {
        return AfterRename::Published;
    };
    match e.raw_os_error() {
        Some(libc::EEXIST) if !exchanged => AfterRename::Exchange,
        Some(libc::EINVAL) | Some(libc::ENOSYS) => AfterRename::Rename { unsupported: true },
        // Exchange: the stored object went between the two calls, or the bucket dir did; a
        // plain rename publishes, recreating the dir when it has to.
        Some(libc::ENOENT) if exchanged => AfterRename::Rename { unsupported: false },
        Some(libc::ENOENT) => AfterRename::BucketGone,
        _ => AfterRename::Failed(e),
    }
}

/// Keeps the file now under spare `id` in bucket dir `bucket` for a later write when it is a
/// regular file and the pool has room; false when the caller must unlink it instead (a link
/// planted under the key is unlinked, never kept).
pub(crate) fn recycle(
    pool: &crate::spare::SparePool,
    bucket: [u8; 2],
    id: u64,
    found: io::Result<nix::sys::stat::FileStat>,
) -> bool {
    match found {
        Ok(st) if crate::beneath::is_file(&st) => pool.give(bucket, id, st.st_size as u64),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regular(size: u64) -> impl FnOnce() -> Option<Stored> {
        move || {
            Some(Stored {
                regular: true,
                size,
            })
        }
    }

    #[test]
    fn a_read_hits_only_when_the_file_ends_where_expected() {
        let never = || -> Option<Stored> { panic!("a hit looks no closer") };
        assert_eq!(read_outcome(8, 8, 0, never).unwrap(), ReadOutcome::Hit);
        let shorter = read_outcome(8, 5, 0, regular(5)).unwrap();
        assert_eq!(
            shorter,
            ReadOutcome::Miss(MissReason::SizeMismatch {
                expected: 8,
                found: 5
            })
        );
        // Longer than expected plus the guard: the stored size, not what the read saw.
        let longer = read_outcome(8, 8, 4096, regular(100_000)).unwrap();
        assert_eq!(
            longer,
            ReadOutcome::Miss(MissReason::SizeMismatch {
                expected: 8,
                found: 100_000
            })
        );
        let unknown = read_outcome(8, 8, 3, || None).unwrap();
        assert_eq!(
            unknown,
            ReadOutcome::Miss(MissReason::SizeMismatch {
                expected: 8,
                found: 11
            })
        );
    }

    #[test]
    fn what_is_not_a_regular_file_is_an_error_not_a_miss() {
        let fifo = || {
            Some(Stored {
                regular: false,
                size: 0,
            })
        };
        assert!(read_outcome(8, 0, 0, fifo).is_err());
    }

    #[test]
    fn links_are_errors_and_only_regular_files_exist() {
        assert!(exists_by_type(libc::S_IFLNK).is_err());
        assert!(exists_by_type(libc::S_IFREG).unwrap());
        assert!(!exists_by_type(libc::S_IFDIR).unwrap());
        assert!(!exists_by_type(libc::S_IFIFO).unwrap());
        assert!(is_missing(libc::ENOENT) && is_missing(libc::ENOTDIR));
        assert!(!is_missing(libc::EACCES));
    }

    #[test]
    fn a_publish_goes_on_by_what_the_rename_said() {
        let err = |n| Err(io::Error::from_raw_os_error(n));
        assert!(matches!(
            after_rename(Ok(()), false),
            AfterRename::Published
        ));
        assert!(matches!(
            after_rename(err(libc::EEXIST), false),
            AfterRename::Exchange
        ));
        assert!(matches!(
            after_rename(err(libc::EINVAL), false),
            AfterRename::Rename { unsupported: true }
        ));
        assert!(matches!(
            after_rename(err(libc::ENOENT), false),
            AfterRename::BucketGone
        ));
        assert!(matches!(
            after_rename(err(libc::ENOENT), true),
            AfterRename::Rename { unsupported: false }
        ));
        assert!(matches!(
            after_rename(err(libc::EACCES), true),
            AfterRename::Failed(_)
        ));
    }

    #[test]
    fn guards_cover_the_alignment() {
        let v = Guard::new(512).unwrap().iovec();
        assert_eq!(v.iov_len, GUARD_LEN);
        assert_eq!(v.iov_base as usize % GUARD_LEN, 0);
        let v = Guard::new(65536).unwrap().iovec();
        assert_eq!((v.iov_len, v.iov_base as usize % 65536), (65536, 0));
    }
}
