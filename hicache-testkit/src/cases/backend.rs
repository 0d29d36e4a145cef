//! Cases against the `StorageBackend` trait itself.

use std::sync::Arc;

use hicache_core::raw::{AlignedBuf, DynBackend, ObjectKey, ReadItem, RegionId, Slice, WriteItem};
use hicache_core::{Error, MemKind, MemoryRegion, MissReason, ReadOutcome};

use crate::check::{CaseError, CaseResult, only, per_item, skip};
use crate::fixtures::pattern;
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

/// A registered aligned buffer with helpers to fill and read it.
pub(crate) struct Buf {
    pub(crate) memory: MemoryRegion,
    pub(crate) id: RegionId,
}

/// The block size transfers use: the backend's alignment, at least 4096.
pub(crate) fn block(env: &TrialEnv) -> u64 {
    env.capability().io_alignment.max(4096)
}

pub(crate) fn buffer(backend: &DynBackend, len: u64) -> Result<Buf, Error> {
    let memory = MemoryRegion::from_aligned(AlignedBuf::zeroed(len as usize, 4096)?);
    let id = backend.register(memory.clone())?;
    Ok(Buf { memory, id })
}

impl Buf {
    /// Fills the buffer at `offset`. A failure means a transfer still holds these bytes
    /// after its call returned: a broken plugin, reported as a failed case.
    pub(crate) fn fill(&self, offset: u64, bytes: &[u8]) -> Result<(), CaseError> {
        self.memory
            .target(offset, bytes.len() as u64, "test buffer")
            .and_then(|mut t| t.copy_from(0, bytes))
            .map_err(|e| CaseError::Failed(format!("cannot fill the test buffer: {e}")))
    }

    /// The buffer's bytes at `offset`; fails like [`Buf::fill`].
    pub(crate) fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, CaseError> {
        self.memory
            .source(offset, len, "test buffer")
            .and_then(|s| s.host_bytes().map(<[u8]>::to_vec))
            .map_err(|e| CaseError::Failed(format!("cannot read the test buffer: {e}")))
    }

    pub(crate) fn slice(&self, offset: u64, len: u64) -> Slice {
        Slice::new(self.id, offset, len)
    }
}

pub(crate) fn key(env: &TrialEnv, name: &str) -> ObjectKey {
    ObjectKey::new(format!("{}-{name}", env.namespace())).expect("valid object key")
}

async fn put(b: &DynBackend, k: &ObjectKey, segs: &[Slice]) -> CaseResult {
    let r = b
        .write(&[WriteItem {
            key: k,
            segments: segs,
        }])
        .await;
    match &only("write", r)? {
        Ok(()) => Ok(()),
        Err(e) => Err(crate::CaseError::Failed(format!(
            "write of {k} failed: {e}"
        ))),
    }
}

async fn get(
    b: &DynBackend,
    k: &ObjectKey,
    segs: &[Slice],
) -> Result<ReadOutcome, crate::CaseError> {
    let r = b
        .read(&[ReadItem {
            key: k,
            segments: segs,
        }])
        .await;
    only("read", r)?.map_err(|e| crate::CaseError::Failed(format!("read of {k} failed: {e}")))
}

/// Writes then reads one object made of `segs`; both results, for rejection checks.
async fn write_then_read(
    b: &DynBackend,
    k: &ObjectKey,
    segs: &[Slice],
) -> Result<(hicache_core::Result<()>, hicache_core::Result<ReadOutcome>), CaseError> {
    let w = b
        .write(&[WriteItem {
            key: k,
            segments: segs,
        }])
        .await;
    let r = b
        .read(&[ReadItem {
            key: k,
            segments: segs,
        }])
        .await;
    Ok((only("write", w)?, only("read", r)?))
}

/// `info()` is self-consistent.
pub async fn backend_info_is_consistent(env: &TrialEnv) -> CaseResult {
    let info = env.backend()?.info();
    ensure!(!info.name.is_empty(), "empty name");
    ensure!(!info.version.is_empty(), "empty version");
    let c = info.capability;
    ensure!(c.host_memory || c.device_memory, "accepts no memory kind");
    ensure!(c.max_segments >= 1, "max_segments is 0");
    if c.direct_io {
        ensure!(
            c.io_alignment.is_power_of_two() && c.io_alignment >= 512,
            "direct I/O alignment {} is not a power of two ≥ 512",
            c.io_alignment
        );
    }
    Ok(())
}

/// Empty batches return empty vectors.
pub async fn backend_empty_batches(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    ensure!(b.write(&[]).await.is_empty());
    ensure!(b.read(&[]).await.is_empty());
    ensure!(b.exists(&[]).await.is_empty());
    ensure!(b.remove(&[]).await.is_empty());
    Ok(())
}

/// One segment written, read back byte for byte.
pub async fn backend_round_trip(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 2 * n)?;
    let data = pattern(n as usize, 1);
    buf.fill(0, &data)?;
    let k = key(env, "rt");
    put(&b, &k, &[buf.slice(0, n)]).await?;
    ensure_eq!(get(&b, &k, &[buf.slice(n, n)]).await?, ReadOutcome::Hit);
    ensure_eq!(buf.read(n, n)?, data);
    Ok(())
}

/// Several segments gather into one object and scatter back in order.
pub async fn backend_multi_segment_gather_scatter(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    if env.capability().max_segments < 3 {
        return skip(format!("max_segments is {}", env.capability().max_segments));
    }
    let n = block(env);
    let buf = buffer(&b, 8 * n)?;
    let data = pattern(3 * n as usize, 2);
    buf.fill(0, &data[..n as usize])?;
    buf.fill(2 * n, &data[n as usize..2 * n as usize])?;
    buf.fill(4 * n, &data[2 * n as usize..])?;
    let k = key(env, "gs");
    put(
        &b,
        &k,
        &[buf.slice(0, n), buf.slice(2 * n, n), buf.slice(4 * n, n)],
    )
    .await?;
    // Read back with a different split: 2 blocks then 1.
    ensure_eq!(
        get(&b, &k, &[buf.slice(5 * n, 2 * n), buf.slice(7 * n, n)]).await?,
        ReadOutcome::Hit
    );
    ensure_eq!(buf.read(5 * n, 3 * n)?, data);
    Ok(())
}

/// A missing object is a miss, not an error.
pub async fn backend_read_missing_is_not_found(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, n)?;
    ensure_eq!(
        get(&b, &key(env, "missing"), &[buf.slice(0, n)]).await?,
        ReadOutcome::Miss(MissReason::NotFound)
    );
    Ok(())
}

/// Reading with the wrong total length is a size-mismatch miss.
pub async fn backend_size_mismatch_is_a_miss(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 4 * n)?;
    buf.fill(0, &pattern(2 * n as usize, 3))?;
    let k = key(env, "size");
    put(&b, &k, &[buf.slice(0, 2 * n)]).await?;
    for want in [n, 3 * n] {
        match get(&b, &k, &[buf.slice(0, want)]).await? {
            ReadOutcome::Miss(MissReason::SizeMismatch { expected, found }) => {
                ensure_eq!(expected, want);
                ensure_eq!(found, 2 * n);
            }
            other => {
                return Err(crate::CaseError::Failed(format!(
                    "read of {want} bytes from a {} byte object gave {other:?}",
                    2 * n
                )));
            }
        }
    }
    Ok(())
}

/// `exists` sees written objects only, in order.
pub async fn backend_exists_reports_written_only(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, n)?;
    let ks: Vec<ObjectKey> = (0..5).map(|i| key(env, &format!("ex{i}"))).collect();
    for i in [0, 3] {
        put(&b, &ks[i], &[buf.slice(0, n)]).await?;
    }
    let got: Vec<bool> = b.exists(&ks).await.into_iter().collect::<Result<_, _>>()?;
    ensure_eq!(got, vec![true, false, false, true, false]);
    Ok(())
}

/// `exists` creates nothing.
pub async fn backend_exists_creates_nothing(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, n)?;
    let k = key(env, "ghost");
    for _ in 0..3 {
        ensure_eq!(
            only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
            Some(false)
        );
    }
    ensure_eq!(
        get(&b, &k, &[buf.slice(0, n)]).await?,
        ReadOutcome::Miss(MissReason::NotFound)
    );
    Ok(())
}

/// Removed objects are gone, their neighbours stay; removing a missing one is fine.
pub async fn backend_remove(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, n)?;
    // Names that sort next to each other, so a remove that takes a neighbour is seen.
    let ks: Vec<ObjectKey> = ["rm-a", "rm-b", "rm-c"]
        .iter()
        .map(|s| key(env, s))
        .collect();
    for k in &ks {
        put(&b, k, &[buf.slice(0, n)]).await?;
    }
    let k = &ks[1];
    ensure!(only("remove", b.remove(std::slice::from_ref(k)).await)?.is_ok());
    ensure!(
        only("remove", b.remove(std::slice::from_ref(k)).await)?.is_ok(),
        "second remove failed"
    );
    let found: Vec<bool> = per_item("exists", 3, b.exists(&ks).await)?
        .into_iter()
        .collect::<Result<_, _>>()?;
    ensure_eq!(
        found,
        vec![true, false, true],
        "after removing the middle key"
    );
    ensure_eq!(
        get(&b, k, &[buf.slice(0, n)]).await?,
        ReadOutcome::Miss(MissReason::NotFound)
    );
    Ok(())
}

/// Writing an existing key replaces it entirely (also with another length).
pub async fn backend_overwrite_replaces(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 6 * n)?;
    let k = key(env, "ow");
    buf.fill(0, &pattern(2 * n as usize, 4))?;
    put(&b, &k, &[buf.slice(0, 2 * n)]).await?;
    let second = pattern(n as usize, 5);
    buf.fill(2 * n, &second)?;
    put(&b, &k, &[buf.slice(2 * n, n)]).await?;
    ensure_eq!(get(&b, &k, &[buf.slice(4 * n, n)]).await?, ReadOutcome::Hit);
    ensure_eq!(buf.read(4 * n, n)?, second);
    Ok(())
}

/// A batch mixing hits and misses reports each item.
pub async fn backend_per_item_results(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 8 * n)?;
    let ks: Vec<ObjectKey> = (0..4).map(|i| key(env, &format!("pi{i}"))).collect();
    for (i, k) in ks.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        buf.fill(i as u64 * n, &pattern(n as usize, 10 + i as u32))?;
        put(&b, k, &[buf.slice(i as u64 * n, n)]).await?;
    }
    let segs: Vec<[Slice; 1]> = (0..4).map(|i| [buf.slice((4 + i) * n, n)]).collect();
    let items: Vec<ReadItem<'_>> = ks
        .iter()
        .zip(&segs)
        .map(|(k, s)| ReadItem {
            key: k,
            segments: s,
        })
        .collect();
    let r = b.read(&items).await;
    ensure_eq!(r.len(), 4);
    for (i, r) in r.iter().enumerate() {
        let want = if i % 2 == 0 {
            ReadOutcome::Hit
        } else {
            ReadOutcome::Miss(MissReason::NotFound)
        };
        ensure_eq!(r.as_ref().ok(), Some(&want), "item {i}");
    }
    ensure_eq!(buf.read(4 * n, n)?, pattern(n as usize, 10));
    ensure_eq!(buf.read(6 * n, n)?, pattern(n as usize, 12));
    Ok(())
}

/// A slice of an unknown region is a typed error naming it.
pub async fn backend_unregistered_region_rejected(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let k = key(env, "unreg");
    let segs = [Slice::new(RegionId(u64::MAX - 7), 0, n)];
    let r = b
        .write(&[WriteItem {
            key: &k,
            segments: &segs,
        }])
        .await;
    let r = only("the call", r)?;
    ensure!(
        matches!(r, Err(Error::UnregisteredRegion { .. })),
        "got {r:?}"
    );
    let r = b
        .read(&[ReadItem {
            key: &k,
            segments: &segs,
        }])
        .await;
    let r = only("the call", r)?;
    ensure!(
        matches!(r, Err(Error::UnregisteredRegion { .. })),
        "got {r:?}"
    );
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
        Some(false)
    );
    Ok(())
}

/// A slice past the end of its region is a typed error with offset and length.
pub async fn backend_out_of_range_slice_rejected(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 2 * n)?;
    let k = key(env, "oor");
    for s in [
        buf.slice(n, 2 * n),
        buf.slice(3 * n, n),
        buf.slice(u64::MAX - n + 1, n),
    ] {
        let (w, r) = write_then_read(&b, &k, &[s]).await?;
        ensure!(
            matches!(w, Err(Error::SliceOutOfRange { .. })),
            "write {s:?} gave {w:?}"
        );
        ensure!(
            matches!(r, Err(Error::SliceOutOfRange { .. })),
            "read {s:?} gave {r:?}"
        );
    }
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
        Some(false)
    );
    Ok(())
}

/// After `deregister`, the region is unknown.
pub async fn backend_deregistered_region_rejected(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, n)?;
    b.deregister(buf.id)?;
    ensure!(b.deregister(buf.id).is_err(), "second deregister succeeded");
    let k = key(env, "dereg");
    let segs = [buf.slice(0, n)];
    let r = b
        .write(&[WriteItem {
            key: &k,
            segments: &segs,
        }])
        .await;
    let r = only("the call", r)?;
    ensure!(
        matches!(r, Err(Error::UnregisteredRegion { .. })),
        "got {r:?}"
    );
    Ok(())
}

/// Under direct I/O, misaligned addresses and lengths fail before I/O.
pub async fn backend_misaligned_slice_rejected(env: &TrialEnv) -> CaseResult {
    let cap = *env.capability();
    if !cap.direct_io || cap.io_alignment <= 1 {
        return skip("the backend does not use direct I/O, so any alignment is valid");
    }
    let b = env.backend()?;
    let a = cap.io_alignment;
    let buf = buffer(&b, 4 * a.max(4096))?;
    let k = key(env, "misaligned");
    for s in [buf.slice(1, a), buf.slice(0, a + 1), buf.slice(a / 2, a)] {
        let (w, r) = write_then_read(&b, &k, &[s]).await?;
        ensure!(
            matches!(w, Err(Error::Misaligned { .. })),
            "write {s:?} gave {w:?}"
        );
        ensure!(
            matches!(r, Err(Error::Misaligned { .. })),
            "read {s:?} gave {r:?}"
        );
    }
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
        Some(false),
        "a rejected write left an object"
    );
    Ok(())
}

/// A bad item does not fail the good items of its batch.
pub async fn backend_bad_item_does_not_fail_others(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 2 * n)?;
    buf.fill(0, &pattern(n as usize, 20))?;
    let (k1, k2, k3) = (key(env, "good1"), key(env, "bad"), key(env, "good2"));
    let good = [buf.slice(0, n)];
    let bad = [buf.slice(n, 2 * n)];
    let r = b
        .write(&[
            WriteItem {
                key: &k1,
                segments: &good,
            },
            WriteItem {
                key: &k2,
                segments: &bad,
            },
            WriteItem {
                key: &k3,
                segments: &good,
            },
        ])
        .await;
    let r = per_item("write", 3, r)?;
    ensure!(r[0].is_ok() && r[1].is_err() && r[2].is_ok(), "got {r:?}");
    let e: Vec<bool> = b
        .exists(&[k1, k2, k3])
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    ensure_eq!(e, vec![true, false, true]);
    Ok(())
}

/// 256 items in one batch.
pub async fn backend_large_batch(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let count = 256u64;
    let src = buffer(&b, count * n)?;
    let dst = buffer(&b, count * n)?;
    for i in 0..count {
        src.fill(i * n, &pattern(n as usize, 1000 + i as u32))?;
    }
    let ks: Vec<ObjectKey> = (0..count).map(|i| key(env, &format!("lb{i}"))).collect();
    let segs: Vec<[Slice; 1]> = (0..count).map(|i| [src.slice(i * n, n)]).collect();
    let items: Vec<WriteItem<'_>> = ks
        .iter()
        .zip(&segs)
        .map(|(k, s)| WriteItem {
            key: k,
            segments: s,
        })
        .collect();
    let w = b.write(&items).await;
    ensure!(
        w.iter().all(|r| r.is_ok()),
        "writes failed: {:?}",
        w.iter().filter(|r| r.is_err()).take(3).collect::<Vec<_>>()
    );
    let dsegs: Vec<[Slice; 1]> = (0..count).map(|i| [dst.slice(i * n, n)]).collect();
    let items: Vec<ReadItem<'_>> = ks
        .iter()
        .zip(&dsegs)
        .map(|(k, s)| ReadItem {
            key: k,
            segments: s,
        })
        .collect();
    let r = b.read(&items).await;
    ensure_eq!(r.len(), count as usize);
    ensure!(
        r.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "not all hits"
    );
    ensure_eq!(dst.read(0, count * n)?, src.read(0, count * n)?);
    Ok(())
}

/// An object of exactly `max_segments` segments round-trips (read back through another
/// split); one of `max_segments + 1` is refused with a typed error, and nothing is stored.
pub async fn backend_segment_limit(env: &TrialEnv) -> CaseResult {
    let max = u64::from(env.capability().max_segments);
    if max > 4096 {
        return skip(format!(
            "max_segments is {max}; the case builds objects of at most 4097 segments"
        ));
    }
    let b = env.backend()?;
    let n = block(env);
    let src = buffer(&b, (max + 1) * n)?;
    let dst = buffer(&b, max * n)?;
    let data = pattern((max * n) as usize, 51);
    src.fill(0, &data)?;
    let segs: Vec<Slice> = (0..max).map(|i| src.slice(i * n, n)).collect();
    let k = key(env, "seg-max");
    put(&b, &k, &segs).await?;
    let half = max / 2 * n;
    let back = [dst.slice(0, half), dst.slice(half, max * n - half)];
    ensure_eq!(get(&b, &k, &back).await?, ReadOutcome::Hit);
    ensure!(dst.read(0, max * n)? == data, "the object's bytes differ");
    let over: Vec<Slice> = (0..=max).map(|i| src.slice(i * n, n)).collect();
    let k2 = key(env, "seg-over");
    let (w, r) = write_then_read(&b, &k2, &over).await?;
    ensure!(
        matches!(w, Err(Error::InvalidBatch { .. })),
        "a write of {} segments gave {w:?}",
        max + 1
    );
    ensure!(
        matches!(r, Err(Error::InvalidBatch { .. })),
        "a read of {} segments gave {r:?}",
        max + 1
    );
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k2)).await)?.ok(),
        Some(false),
        "a refused write left an object"
    );
    Ok(())
}

/// Two writers of one key at once, and a reader beside them: every read of a plugin that
/// declares atomic publish sees one complete version (never a mix, never a gap once the key
/// exists), and the last write leaves one complete version.
pub async fn backend_concurrent_writers_same_key(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 4 * n)?;
    let (va, vb) = (pattern(2 * n as usize, 31), pattern(2 * n as usize, 32));
    buf.fill(0, &va)?;
    buf.fill(2 * n, &vb)?;
    let k = key(env, "race");
    put(&b, &k, &[buf.slice(0, 2 * n)]).await?;
    let atomic = env.capability().atomic_publish;
    let done = std::sync::atomic::AtomicBool::new(false);
    let writers = async {
        for _ in 0..20 {
            let (sa, sb) = ([buf.slice(0, 2 * n)], [buf.slice(2 * n, 2 * n)]);
            let (ia, ib) = (
                [WriteItem {
                    key: &k,
                    segments: &sa,
                }],
                [WriteItem {
                    key: &k,
                    segments: &sb,
                }],
            );
            let (ra, rb) = tokio::join!(b.write(&ia), b.write(&ib));
            let (ra, rb) = (only("write", ra)?, only("write", rb)?);
            ensure!(ra.is_ok() && rb.is_ok(), "{ra:?} {rb:?}");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        Ok::<(), CaseError>(())
    };
    let reader = async {
        let out = buffer(&b, 2 * n)?;
        let mut reads = 0u32;
        while reads < 3 || !done.load(std::sync::atomic::Ordering::Acquire) {
            reads += 1;
            // A plugin whose reads finish without waiting would otherwise never let the
            // writers run again.
            tokio::task::yield_now().await;
            let got = get(&b, &k, &[out.slice(0, 2 * n)]).await?;
            if !atomic {
                continue;
            }
            ensure_eq!(got, ReadOutcome::Hit, "read {reads} during overwrites");
            let bytes = out.read(0, 2 * n)?;
            ensure!(
                bytes == va || bytes == vb,
                "read {reads} during overwrites mixes versions"
            );
        }
        Ok::<(), CaseError>(())
    };
    // The first failure on either side ends both (the reader waits for the writers' end).
    tokio::try_join!(writers, reader)?;
    let out = buffer(&b, 2 * n)?;
    ensure_eq!(get(&b, &k, &[out.slice(0, 2 * n)]).await?, ReadOutcome::Hit);
    let got = out.read(0, 2 * n)?;
    ensure!(got == va || got == vb, "the object mixes both writers");
    Ok(())
}

/// Batches from several tasks at once on disjoint keys stay correct.
pub async fn backend_concurrent_disjoint_batches(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let tasks: Vec<_> = (0..4u32)
        .map(|t| {
            let b = b.clone();
            let prefix = format!("{}-cd{t}", env.namespace());
            tokio::spawn(async move {
                let buf = buffer(&b, 16 * n).map_err(|e| e.to_string())?;
                for round in 0..5u32 {
                    let ks: Vec<ObjectKey> = (0..8)
                        .map(|i| ObjectKey::new(format!("{prefix}-{i}")).expect("key"))
                        .collect();
                    for i in 0..8 {
                        buf.fill(
                            i * n,
                            &pattern(n as usize, t * 1000 + round * 10 + i as u32),
                        )
                        .map_err(|e| e.to_string())?;
                    }
                    let segs: Vec<[Slice; 1]> = (0..8).map(|i| [buf.slice(i * n, n)]).collect();
                    let items: Vec<WriteItem<'_>> = ks
                        .iter()
                        .zip(&segs)
                        .map(|(k, s)| WriteItem {
                            key: k,
                            segments: s,
                        })
                        .collect();
                    if b.write(&items).await.iter().any(|r| r.is_err()) {
                        return Err("write failed".to_string());
                    }
                    let dsegs: Vec<[Slice; 1]> =
                        (0..8).map(|i| [buf.slice((8 + i) * n, n)]).collect();
                    let items: Vec<ReadItem<'_>> = ks
                        .iter()
                        .zip(&dsegs)
                        .map(|(k, s)| ReadItem {
                            key: k,
                            segments: s,
                        })
                        .collect();
                    if !b
                        .read(&items)
                        .await
                        .iter()
                        .all(|r| matches!(r, Ok(ReadOutcome::Hit)))
                    {
                        return Err("read missed".to_string());
                    }
                    let back = buf.read(8 * n, 8 * n).map_err(|e| e.to_string())?;
                    if back != buf.read(0, 8 * n).map_err(|e| e.to_string())? {
                        return Err(format!("task {t} round {round}: wrong bytes"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in tasks {
        let r = t
            .await
            .map_err(|e| crate::CaseError::Failed(format!("task panicked: {e}")))?;
        ensure!(r.is_ok(), "{r:?}");
    }
    Ok(())
}

/// `usage` tells the truth as far as it reports: the bytes used cover an object just
/// written, and used and available bytes fit in the total. A plugin that reports no figure
/// at all (object stores have no capacity) is skipped, not passed.
pub async fn backend_usage(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(&b, 4 * n)?;
    buf.fill(0, &pattern(4 * n as usize, 42))?;
    put(&b, &key(env, "usage"), &[buf.slice(0, 4 * n)]).await?;
    let u = b.usage().await?;
    if u.total_bytes.is_none() && u.used_bytes.is_none() && u.available_bytes.is_none() {
        return skip("the plugin reports no usage figures");
    }
    if let Some(used) = u.used_bytes {
        ensure!(
            used >= 4 * n,
            "{used} bytes used with a {}-byte object stored",
            4 * n
        );
    }
    if let Some(total) = u.total_bytes {
        let used = u.used_bytes.unwrap_or(0);
        let avail = u.available_bytes.unwrap_or(0);
        ensure!(
            used.checked_add(avail).is_some_and(|sum| sum <= total),
            "used {used} + available {avail} > total {total}"
        );
    }
    Ok(())
}

/// Device memory is refused by a plugin that cannot move it, with a typed error.
pub async fn backend_device_memory_rejected(env: &TrialEnv) -> CaseResult {
    if env.capability().device_memory {
        return skip("the plugin accepts device memory");
    }
    let b = env.backend()?;
    let mut host = AlignedBuf::zeroed(4096, 4096)?;
    let addr = host.as_mut_ptr();
    // SAFETY: the region owns the buffer (nothing else reaches its bytes) and is never used
    // for a transfer: registration must fail first.
    let region = unsafe {
        MemoryRegion::with_owner(addr, 4096, MemKind::Device { device: 0 }, Arc::new(host))
    };
    ensure!(
        b.register(region).is_err(),
        "device memory was accepted by a host-only plugin"
    );
    Ok(())
}

/// Objects survive a new backend instance over the same storage.
pub async fn backend_persists_across_instances(env: &TrialEnv) -> CaseResult {
    if !env.capability().persistent {
        return skip("the plugin does not persist data across instances");
    }
    let n = block(env);
    let k = key(env, "persist");
    let data = pattern(n as usize, 40);
    {
        let b = env.backend()?;
        let buf = buffer(&b, n)?;
        buf.fill(0, &data)?;
        put(&b, &k, &[buf.slice(0, n)]).await?;
    }
    let b2 = env.backend()?;
    let buf = buffer(&b2, n)?;
    ensure_eq!(get(&b2, &k, &[buf.slice(0, n)]).await?, ReadOutcome::Hit);
    ensure_eq!(buf.read(0, n)?, data);
    Ok(())
}

/// Names with every allowed kind of character, and the longest allowed names (two that
/// differ only in their last byte): each holds its own bytes, so a plugin that maps several
/// names onto one object (by hashing, truncating or dropping a part) fails.
pub async fn backend_unusual_but_valid_names(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let max = hicache_core::raw::MAX_OBJECT_KEY_LEN;
    let limit = env.name_limit().map_or(max, |l| l.min(max));
    let long = |last: char| {
        format!(
            "{}-{}{last}",
            env.namespace(),
            "L".repeat(limit - env.namespace().len() - 2)
        )
    };
    let names = [
        format!("{}-a_b-c:d=e+f@g", env.namespace()),
        format!("{}-ü€", env.namespace()),
        format!("{}-x.y.z", env.namespace()),
        long('a'),
        long('b'),
    ];
    let src = buffer(&b, names.len() as u64 * n)?;
    let dst = buffer(&b, names.len() as u64 * n)?;
    for (i, name) in names.iter().enumerate() {
        let at = i as u64 * n;
        src.fill(at, &pattern(n as usize, 41 + i as u32))?;
        put(&b, &ObjectKey::new(name.clone())?, &[src.slice(at, n)]).await?;
    }
    for (i, name) in names.iter().enumerate() {
        let at = i as u64 * n;
        let k = ObjectKey::new(name.clone())?;
        ensure_eq!(
            get(&b, &k, &[dst.slice(at, n)]).await?,
            ReadOutcome::Hit,
            "name {name:?}"
        );
        ensure!(
            dst.read(at, n)? == src.read(at, n)?,
            "name {name:?} holds another name's bytes"
        );
    }
    Ok(())
}

/// Names that would escape a storage root cannot even be formed.
pub async fn backend_path_escapes_are_unrepresentable(_env: &TrialEnv) -> CaseResult {
    for bad in [
        "../etc/passwd",
        "a/b",
        "..",
        ".",
        "/abs",
        "nul\0byte",
        "new\nline",
        "back\\slash",
        ".hidden",
    ] {
        ensure!(
            ObjectKey::new(bad).is_err(),
            "{bad:?} was accepted as an object name"
        );
        ensure!(
            hicache_core::PageKey::new(bad).is_err(),
            "{bad:?} was accepted as a page key"
        );
    }
    Ok(())
}
