//! The baselines hicache is compared with: the raw O_DIRECT loop (in place, or publishing
//! each page by name) and the bare `object_store` client.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use hicache::raw::MemoryRegion;
use hicache::{Error, Result};

use super::page_pattern;
use super::report::{BenchReport, PhaseStats, stats};

/// How the raw loop reaches each page's file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawLoop {
    /// The disk's limit: every page's file is opened before the clock starts, and the timed
    /// rounds only `pwrite` and `pread` it.
    InPlace,
    /// The least that a store of named, atomically published pages does per page, and
    /// nothing more: a write opens the page's spare file, writes it, closes it and renames it
    /// onto the page's name (`RENAME_NOREPLACE`); a read opens the name, reads it and closes
    /// it. Between rounds, untimed, each name is renamed back to its spare, as hicache's
    /// remove recycles a page's file. No envelope, no checksum, no buckets, one directory.
    Publish,
}

impl RawLoop {
    fn label(self) -> &'static str {
        match self {
            RawLoop::InPlace => "RAW",
            RawLoop::Publish => "RAW-PUBLISH",
        }
    }
}

/// The raw baseline: one file per page, all created empty before the clock starts, then per
/// round `qd` threads write every page and read it back (O_DIRECT unless `direct` is false),
/// reaching each file as `how` says. The first round allocates, later rounds overwrite in
/// place, as NIXL's benchmark does. No envelope and no checksums.
pub fn raw_baseline(
    dir: &Path,
    page_bytes: u64,
    pages: u64,
    qd: usize,
    direct: bool,
    rounds: usize,
    how: RawLoop,
) -> Result<BenchReport> {
    use nix::fcntl::{OFlag, RenameFlags, openat, renameat2};
    use nix::sys::stat::Mode;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    let pages = pages.max(1);
    let buf_bytes = pages
        .checked_mul(page_bytes)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::InvalidPool {
            reason: format!("{pages} pages of {page_bytes} bytes overflow the address space"),
        })?;
    // One thread per page at most: more would only idle.
    let qd = qd.clamp(1, usize::try_from(pages).unwrap_or(usize::MAX));
    let tool = || hicache::Component::Tool("raw baseline");
    let dir: PathBuf = dir.join(format!("raw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(tool(), "create dir", Some(dir.clone()), e))?;
    let dir_fd = std::fs::File::open(&dir)
        .map_err(|e| Error::io(tool(), "open dir", Some(dir.clone()), e))?;
    let direct_flag = if direct {
        OFlag::O_DIRECT
    } else {
        OFlag::empty()
    };
    // In place: the page's file, opened for the whole run. Publish: the page's spare, and
    // the name it is published under.
    let spare_names: Vec<String> = (0..pages).map(|i| format!("page{i:06}")).collect();
    let published_names: Vec<String> = match how {
        RawLoop::InPlace => Vec::new(),
        RawLoop::Publish => (0..pages).map(|i| format!("published{i:06}")).collect(),
    };
    let files: Vec<std::fs::File> = spare_names
        .iter()
        .map(|name| {
            let p = dir.join(name);
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .custom_flags(direct_flag.bits())
                .open(&p)
                .map_err(|e| Error::io(tool(), "open", Some(p), e))
        })
        .collect::<Result<_>>()?;
    let files = match how {
        RawLoop::InPlace => files,
        // The files stay on disk under their spare names; only their names are used.
        RawLoop::Publish => Vec::new(),
    };
    // The memory `hicache bench` gives its pool for the same transfers (`pool_pages`), so
    // the loop and hicache move the same kind of memory: the page size alone took this
    // loop's O_DIRECT writes of 8 MiB pages from 2.34 to 4.55 GB/s on a virtio disk.
    let region_bytes = buf_bytes as u64;
    let pages_kind = super::pool_pages(direct, super::memory_fs(&dir));
    let src = MemoryRegion::anonymous_host(region_bytes, pages_kind)?;
    let dst = MemoryRegion::anonymous_host(region_bytes, pages_kind)?;
    {
        let mut fill = src.target(0, region_bytes, "raw loop fill")?;
        for p in 0..pages {
            fill.copy_from((p * page_bytes) as usize, &page_pattern(page_bytes, p))?;
        }
    }
    // Pinned for the timed rounds: threads read `src_pin` and write disjoint pages of
    // `dst_pin` through these addresses, and nothing else touches either until they join.
    let src_pin = src.source(0, region_bytes, "raw loop writes")?;
    let mut dst_pin = dst.target(0, region_bytes, "raw loop reads")?;
    let src_addr = src_pin.as_ptr() as usize;
    let dst_addr = dst_pin.as_mut_ptr() as usize;
    // One page's write or read; false if any step failed or moved fewer bytes.
    let page_io = |i: usize, write: bool| -> bool {
        let off = i * page_bytes as usize;
        let opened = match how {
            RawLoop::InPlace => None,
            RawLoop::Publish => {
                let (name, flags) = if write {
                    (&spare_names[i], OFlag::O_WRONLY)
                } else {
                    (&published_names[i], OFlag::O_RDONLY)
                };
                let flags = flags | direct_flag | OFlag::O_CLOEXEC;
                match openat(dir_fd.as_fd(), name.as_str(), flags, Mode::empty()) {
                    Ok(fd) => Some(fd),
                    Err(_) => return false,
                }
            }
        };
        let fd = opened
            .as_ref()
            .map_or_else(|| files[i].as_raw_fd(), |f| f.as_raw_fd());
        // SAFETY: both ranges are pinned (`src_pin` for reading, `dst_pin` for writing)
        // until the threads have joined; each page of dst is written by one thread only.
        let n = unsafe {
            if write {
                libc::pwrite(
                    fd,
                    (src_addr as *const u8).add(off).cast(),
                    page_bytes as usize,
                    0,
                )
            } else {
                libc::pread(
                    fd,
                    (dst_addr as *mut u8).add(off).cast(),
                    page_bytes as usize,
                    0,
                )
            }
        };
        let mut ok = n == page_bytes as isize;
        // Closed before the rename, as a writer publishes a complete file.
        drop(opened);
        if how == RawLoop::Publish && write {
            ok &= renameat2(
                dir_fd.as_fd(),
                spare_names[i].as_str(),
                dir_fd.as_fd(),
                published_names[i].as_str(),
                RenameFlags::RENAME_NOREPLACE,
            )
            .is_ok();
        }
        ok
    };
    let timed = |write: bool| -> PhaseStats {
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        let errors = std::thread::scope(|s| {
            let handles: Vec<_> = (0..qd)
                .map(|_| {
                    s.spawn(|| {
                        let mut errors = 0u64;
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= pages as usize {
                                return errors;
                            }
                            errors += u64::from(!page_io(i, write));
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(1))
                .sum::<u64>()
        });
        stats(started.elapsed(), &[], errors, pages, page_bytes)
    };
    let mut write_rounds = Vec::new();
    let mut read_rounds = Vec::new();
    for _ in 0..rounds.max(1) {
        write_rounds.push(timed(true));
        read_rounds.push(timed(false));
        if how == RawLoop::Publish {
            // Untimed: give each page its file back as a spare for the next round.
            for (published, spare) in published_names.iter().zip(&spare_names) {
                nix::fcntl::renameat(
                    dir_fd.as_fd(),
                    published.as_str(),
                    dir_fd.as_fd(),
                    spare.as_str(),
                )
                .map_err(|e| Error::io(tool(), "rename", Some(dir.join(published)), e.into()))?;
            }
        }
    }
    drop(files);
    drop(dst_pin);
    let written = src_pin.host_bytes()?;
    let read = dst.source(0, region_bytes, "raw loop check")?;
    let verified = written == read.host_bytes()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(BenchReport::baseline(
        how.label(),
        dir.display().to_string(),
        direct,
        (page_bytes, pages, qd),
        write_rounds,
        read_rounds,
        verified,
    ))
}

/// The OBJ baseline: the same `object_store` client the plugin uses, putting and getting each
/// page as one object with `concurrency` requests in flight — no envelope, no naming, no
/// registration. hicache OBJ is compared against it on the same server.
#[cfg(feature = "obj")]
pub async fn raw_object_store(
    cfg: hicache::obj::ObjConfig,
    page_bytes: u64,
    pages: u64,
    concurrency: usize,
    rounds: usize,
) -> Result<BenchReport> {
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    let backend = hicache::obj::ObjBackend::new(cfg)?;
    let store = backend.store().clone();
    let prefix = format!("raw-baseline-{}", std::process::id());
    let paths: Vec<object_store::path::Path> = (0..pages)
        .map(|i| object_store::path::Path::from(format!("{prefix}/page{i}")))
        .collect();
    let data: Vec<bytes::Bytes> = (0..pages)
        .map(|p| bytes::Bytes::from(page_pattern(page_bytes, p)))
        .collect();
    let err = |e: object_store::Error| {
        Error::backend(
            hicache::Component::Tool("raw object_store baseline"),
            e.to_string(),
        )
    };
    let mut write_rounds = Vec::new();
    let mut read_rounds = Vec::new();
    let mut verified = true;
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        let puts: Vec<_> = paths
            .iter()
            .zip(&data)
            .map(|(p, d)| store.put(p, d.clone().into()))
            .collect();
        let results: Vec<_> = futures::stream::iter(puts)
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        let failed = results.iter().filter(|r| r.is_err()).count() as u64;
        write_rounds.push(stats(started.elapsed(), &[], failed, pages, page_bytes));
        let started = Instant::now();
        let gets: Vec<_> = paths
            .iter()
            .map(|p| {
                let store = store.clone();
                async move { store.get(p).await?.bytes().await }
            })
            .collect();
        let got: Vec<_> = futures::stream::iter(gets)
            .buffered(concurrency.max(1))
            .collect()
            .await;
        let failed = got.iter().filter(|r| r.is_err()).count() as u64;
        read_rounds.push(stats(started.elapsed(), &[], failed, pages, page_bytes));
        for (g, d) in got.iter().zip(&data) {
            verified &= g.as_ref().is_ok_and(|b| b == d);
        }
    }
    for p in &paths {
        store.delete(p).await.map_err(err)?;
    }
    Ok(BenchReport::baseline(
        "RAW-OBJ",
        backend.config().location(),
        false,
        (page_bytes, pages, concurrency),
        write_rounds,
        read_rounds,
        verified,
    ))
}
