//! A data path plugged into the file layer (`PosixBackend::with_data_path`): its transfers
//! carry every object's bytes, a batching path gets several objects' transfers per call, and
//! what it refuses or fails is reported under the plugin's name.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::raw::{AlignedBuf, ObjectKey, ReadItem, Slice, StorageBackend, WriteItem};
use hicache_core::{Error, MemKind, MemoryRegion, ReadOutcome, Result};
use hicache_posix::data_path::{DataPath, Direction, Transfer};
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig, SyncMode};

/// `pwrite`/`pread` of host memory, counting calls; fails reads while `fail_reads` is set.
#[derive(Debug, Default)]
struct Counting {
    limit: usize,
    calls: AtomicU64,
    transfers: AtomicU64,
    most_at_once: AtomicU64,
    fail_reads: std::sync::atomic::AtomicBool,
}

impl Counting {
    fn one(&self, t: &Transfer<'_>) -> io::Result<u64> {
        self.transfers.fetch_add(1, Ordering::Relaxed);
        if t.direction() == Direction::Read && self.fail_reads.load(Ordering::Relaxed) {
            return Err(io::Error::other("the test path refuses reads"));
        }
        host_transfer(t)
    }
}

/// A transfer of host memory by `pwrite`/`pread`, stopping at a short one: what a data path
/// for host memory does (the test paths share it).
pub(crate) fn host_transfer(t: &Transfer<'_>) -> io::Result<u64> {
    let mut at = t.offset();
    let mut done = 0;
    for (addr, len) in t.segments() {
        // SAFETY: the file layer's promise: the segment lies in registered, pinned host
        // memory reserved for this transfer; the descriptor is open.
        let n = unsafe {
            match t.direction() {
                Direction::Write => {
                    libc::pwrite(t.file().as_raw_fd(), addr as *const _, len, at as i64)
                }
                Direction::Read => {
                    libc::pread(t.file().as_raw_fd(), addr as *mut _, len, at as i64)
                }
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        done += n as u64;
        at += n as u64;
        if (n as usize) < len {
            break;
        }
    }
    Ok(done)
}

impl DataPath for Counting {
    fn accepts(&self, kind: MemKind) -> bool {
        kind == MemKind::Host
    }
    fn register(&self, _: &MemoryRegion) -> Result<()> {
        Ok(())
    }
    fn deregister(&self, _: &MemoryRegion) -> Result<()> {
        Ok(())
    }
    fn call(&self, direction: Direction) -> &'static str {
        match direction {
            Direction::Read => "test read",
            Direction::Write => "test write",
        }
    }
    fn transfer(&self, t: &Transfer<'_>) -> io::Result<u64> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.most_at_once.fetch_max(1, Ordering::Relaxed);
        self.one(t)
    }
    fn batch_limit(&self) -> usize {
        self.limit
    }
    fn transfer_batch(&self, batch: &[Transfer<'_>]) -> Vec<io::Result<u64>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.most_at_once
            .fetch_max(batch.len() as u64, Ordering::Relaxed);
        batch.iter().map(|t| self.one(t)).collect()
    }
    fn describe(&self) -> String {
        "a counting test path".into()
    }
}

fn config(dir: &std::path::Path, engine: EngineChoice) -> PosixConfig {
    PosixConfig {
        dirs: vec![dir.to_path_buf()],
        direct_io: true,
        engine,
        threads: 2,
        queue_depth: 64,
        sync: SyncMode::None,
        spare_bytes: 1 << 20,
        cleaner: None,
        file_mode: 0o600,
        dir_mode: 0o700,
    }
}

const N: u64 = 20;

async fn round_trip(b: &PosixBackend, tag: &str) -> Vec<hicache_core::Result<ReadOutcome>> {
    let memory =
        MemoryRegion::from_aligned(AlignedBuf::zeroed(2 * N as usize * 4096, 4096).unwrap());
    let id = b.register(memory.clone()).unwrap();
    let keys: Vec<ObjectKey> = (0..N)
        .map(|i| ObjectKey::new(format!("{tag}-{i}")).unwrap())
        .collect();
    // Two segments per object, so a transfer carries a list.
    let segs: Vec<[Slice; 2]> = (0..N)
        .map(|i| {
            [
                Slice::new(id, i * 8192, 4096),
                Slice::new(id, i * 8192 + 4096, 4096),
            ]
        })
        .collect();
    for i in 0..N {
        let mut t = memory.target(i * 8192, 8192, "test").unwrap();
        t.copy_from(0, &vec![i as u8 + 1; 8192]).unwrap();
    }
    let items: Vec<WriteItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, s)| WriteItem { key, segments: s })
        .collect();
    assert!(b.write(&items).await.iter().all(|r| r.is_ok()));
    for i in 0..N {
        let mut t = memory.target(i * 8192, 8192, "test").unwrap();
        t.copy_from(0, &[0; 8192]).unwrap();
    }
    let reads: Vec<ReadItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, s)| ReadItem { key, segments: s })
        .collect();
    let got = b.read(&reads).await;
    for (i, r) in got.iter().enumerate() {
        if matches!(r, Ok(ReadOutcome::Hit)) {
            let s = memory.source(i as u64 * 8192, 8192, "test").unwrap();
            assert_eq!(s.host_bytes().unwrap(), &[i as u8 + 1; 8192][..]);
        }
    }
    drop(items);
    drop(reads);
    b.deregister(id).unwrap();
    got
}

#[tokio::test]
async fn every_object_moves_through_the_path_one_transfer_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = Arc::new(Counting {
        limit: 1,
        ..Default::default()
    });
    let b = PosixBackend::with_data_path(
        "COUNTED",
        &config(dir.path(), EngineChoice::Threads),
        path.clone(),
    )
    .unwrap();
    assert!(b.engine_description().contains("a counting test path"));
    let got = round_trip(&b, "one").await;
    assert!(
        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "{got:?}"
    );
    assert_eq!(path.transfers.load(Ordering::Relaxed), 2 * N);
    assert_eq!(path.most_at_once.load(Ordering::Relaxed), 1);
    assert_eq!(b.info().name, "COUNTED");
}

#[test]
fn a_data_path_keeps_sixteen_threads_by_default_on_block_filesystems() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = PosixConfig {
        threads: 0,
        ..config(dir.path(), EngineChoice::Threads)
    };
    let b = PosixBackend::with_data_path("COUNTED", &cfg, Arc::new(Counting::default())).unwrap();
    let expected = if crate::plugin::on_memory_fs(dir.path()) {
        std::thread::available_parallelism().unwrap().get()
    } else {
        16
    };
    assert_eq!(
        b.engine_description(),
        format!("threads ({expected}) over a counting test path")
    );
}

#[tokio::test]
async fn a_batching_path_gets_several_objects_per_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = Arc::new(Counting {
        limit: 8,
        ..Default::default()
    });
    let b = PosixBackend::with_data_path(
        "BATCHED",
        &config(dir.path(), EngineChoice::Auto),
        path.clone(),
    )
    .unwrap();
    let got = round_trip(&b, "batch").await;
    assert!(
        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "{got:?}"
    );
    assert_eq!(path.transfers.load(Ordering::Relaxed), 2 * N);
    // 20 objects, 8 at a time: 3 calls per direction.
    assert_eq!(path.calls.load(Ordering::Relaxed), 6);
    assert_eq!(path.most_at_once.load(Ordering::Relaxed), 8);
}

#[tokio::test]
async fn what_the_path_fails_or_refuses_is_reported_under_the_plugins_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = Arc::new(Counting {
        limit: 4,
        ..Default::default()
    });
    let e = PosixBackend::with_data_path(
        "REFUSING",
        &config(dir.path(), EngineChoice::Uring),
        path.clone(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("io_uring"), "{e}");
    let b = PosixBackend::with_data_path(
        "REFUSING",
        &config(dir.path(), EngineChoice::Threads),
        path.clone(),
    )
    .unwrap();
    let mut host = AlignedBuf::zeroed(4096, 4096).unwrap();
    let addr = host.as_mut_ptr();
    // SAFETY: the region owns the buffer; registration must fail before any transfer.
    let device = unsafe {
        MemoryRegion::with_owner(addr, 4096, MemKind::Device { device: 0 }, Arc::new(host))
    };
    match b.register(device) {
        Err(e @ Error::Unsupported { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("REFUSING") && text.contains("a counting test path"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    path.fail_reads.store(true, Ordering::Relaxed);
    let got = round_trip(&b, "fail").await;
    for r in got {
        match r {
            Err(
                e @ Error::Io {
                    op: "test read", ..
                },
            ) => {
                let text = e.to_string();
                assert!(
                    text.contains("REFUSING") && text.contains("refuses reads"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
