//! What a careless or hostile neighbour plants under an object's name — a FIFO, a link out of
//! the storage dir, a file that grew — is never read as the page and never hangs a read.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use hicache_core::raw::{AlignedBuf, MemoryRegion, ObjectKey, ReadItem, Slice, WriteItem};
use hicache_core::{MissReason, ReadOutcome};

/// KVDIR's calls do their work before they return: one poll finishes them.
fn now<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a KVDIR call did not finish at once"),
    }
}

fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == name {
            return Some(path);
        }
        if path.is_dir()
            && let Some(found) = find(&path, name)
        {
            return Some(found);
        }
    }
    None
}

#[test]
fn planted_names_are_never_read_as_pages() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, [7u8; 4096]).unwrap();
    let b = kvdir::open(dir.path()).unwrap();
    let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
    let id = b.register(region).unwrap();
    let segments = [Slice::new(id, 0, 4096)];
    let key = ObjectKey::new("page").unwrap();
    let wrote = now(b.write(&[WriteItem {
        key: &key,
        segments: &segments,
    }]));
    assert!(wrote[0].is_ok(), "{wrote:?}");
    let stored = find(dir.path(), "page").expect("the page's file");
    assert!(stored.is_file());
    let read = || {
        now(b.read(&[ReadItem {
            key: &key,
            segments: &segments,
        }]))
        .remove(0)
    };

    // A FIFO nobody writes: an error at once, not a read that waits for a writer.
    std::fs::remove_file(&stored).unwrap();
    nix::unistd::mkfifo(&stored, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| tx.send(read().is_err()).unwrap());
        let Ok(refused) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
            // A writer comes, so a read stuck opening the FIFO goes: the test fails, not hangs.
            let _ = std::fs::OpenOptions::new().write(true).open(&stored);
            panic!("a read hung on a FIFO planted as a page");
        };
        assert!(refused, "a FIFO was read as a page");
    });

    // A link out of the storage dir: refused, and the file it names is not read.
    std::fs::remove_file(&stored).unwrap();
    std::os::unix::fs::symlink(&secret, &stored).unwrap();
    let got = read();
    assert!(got.is_err(), "{got:?}");

    // A file that grew past the page: a size mismatch.
    std::fs::remove_file(&stored).unwrap();
    std::fs::write(&stored, vec![1u8; 1 << 20]).unwrap();
    let got = read();
    assert!(
        matches!(got, Ok(ReadOutcome::Miss(MissReason::SizeMismatch { .. }))),
        "{got:?}"
    );
    assert_eq!(std::fs::read(&secret).unwrap(), [7u8; 4096]);
    b.deregister(id).unwrap();
}
