//! Object semantics: round trips, misses, existence, removal, overwrite, per-item results,
//! large batches and the segment limit.

use hicache_core::raw::{ObjectKey, ReadItem, Slice, WriteItem};
use hicache_core::{Error, MissReason, ReadOutcome};

use crate::check::{CaseResult, only, per_item, skip};
use crate::fixtures::pattern;
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{block, buffer, get, key, put, write_then_read};

/// `info()` is self-consistent.
pub async fn backend_info_is_consistent(env: &TrialEnv) -> CaseResult {
    let info = env.backend()?.info();
    ensure!(!info.name.is_empty(), "empty name");
    ensure!(!info.version.is_empty(), "empty version");
    let problems = info.capability.problems();
    ensure!(
        problems.is_empty(),
        "info().capability is not valid:\n  {}\n(`Capability::default()` is valid; start there and set what the backend does)",
        problems.join("\n  ")
    );
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
    let buf = buffer(env, &b, 2 * n)?;
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
    let buf = buffer(env, &b, 8 * n)?;
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

/// `read_checked`, where the backend does it, runs the check on every object it reads whole,
/// with that object's bytes and index, and a failed check is that item's miss (the
/// connector's envelope verification depends on it).
pub async fn backend_read_checked_checks_every_hit(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, 7 * n)?;
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(n as usize, 40 + i)).collect();
    let keys: Vec<ObjectKey> = (0..4).map(|i| key(env, &format!("chk{i}"))).collect();
    for (i, d) in data.iter().enumerate() {
        buf.fill(i as u64 * n, d)?;
        put(&b, &keys[i], &[buf.slice(i as u64 * n, n)]).await?;
    }
    // Objects 0..3 exist, 3 does not; the check refuses object 1.
    let targets: Vec<[Slice; 1]> = (0..4).map(|i| [buf.slice((3 + i) * n, n)]).collect();
    let items: Vec<ReadItem<'_>> = keys
        .iter()
        .zip(&targets)
        .map(|(key, segments)| ReadItem { key, segments })
        .collect();
    let seen = std::sync::Mutex::new(Vec::new());
    let check = |i: usize, bytes: &[std::io::IoSlice<'_>]| {
        let whole: Vec<u8> = bytes.iter().flat_map(|s| s.iter().copied()).collect();
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((i, whole));
        if i == 1 {
            Err(MissReason::ChecksumMismatch)
        } else {
            Ok(())
        }
    };
    let Some(results) = b.read_checked(&items, &check).await else {
        return skip("the backend does not check where it reads (read_checked answers None)");
    };
    ensure_eq!(results.len(), 4, "one result per item");
    let outcomes: Vec<_> = results
        .into_iter()
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    ensure_eq!(
        outcomes,
        vec![
            Ok(ReadOutcome::Hit),
            Ok(ReadOutcome::Miss(MissReason::ChecksumMismatch)),
            Ok(ReadOutcome::Hit),
            Ok(ReadOutcome::Miss(MissReason::NotFound)),
        ]
    );
    let mut seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    seen.sort();
    let expected: Vec<(usize, Vec<u8>)> = data.into_iter().enumerate().collect();
    ensure!(
        seen == expected,
        "the check saw items {:?}; it must see each object read whole, once, with its bytes",
        seen.iter().map(|(i, b)| (*i, b.len())).collect::<Vec<_>>()
    );
    Ok(())
}

/// `write_sealed`, where the backend does it, has each object's first segment completed by
/// the seal, once per item, from the bytes of the others, and stores the completed copy in
/// its place; an item the seal refuses is an error and is not stored (the connector's
/// envelope checksums depend on it).
pub async fn backend_write_sealed_seals_every_object(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    // Per item: a header block, then two payload blocks; then room to read one back.
    let buf = buffer(env, &b, 12 * n)?;
    buf.fill(0, &pattern(9 * n as usize, 50))?;
    let keys: Vec<ObjectKey> = (0..3).map(|i| key(env, &format!("seal{i}"))).collect();
    let segments: Vec<[Slice; 3]> = (0..3u64)
        .map(|i| {
            let at = 3 * i * n;
            [
                buf.slice(at, n),
                buf.slice(at + n, n),
                buf.slice(at + 2 * n, n),
            ]
        })
        .collect();
    let items: Vec<WriteItem<'_>> = keys
        .iter()
        .zip(&segments)
        .map(|(key, segments)| WriteItem { key, segments })
        .collect();
    let seen = std::sync::Mutex::new(Vec::new());
    let seal = |i: usize, payload: &[std::io::IoSlice<'_>], header: &mut [u8]| {
        let whole: Vec<u8> = payload.iter().flat_map(|s| s.iter().copied()).collect();
        let sum = whole.iter().map(|&x| u64::from(x)).sum::<u64>();
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((i, whole, header.len()));
        if i == 1 {
            return Err(Error::InvalidBatch {
                reason: "the seal refuses item 1".into(),
            });
        }
        if header.len() >= 16 {
            header[..8].copy_from_slice(&(i as u64 + 7).to_le_bytes());
            header[8..16].copy_from_slice(&sum.to_le_bytes());
        }
        Ok(())
    };
    let Some(results) = b.write_sealed(&items, &seal).await else {
        return skip("the backend does not seal its writes (write_sealed answers None)");
    };
    ensure_eq!(results.len(), 3, "one result per item");
    let oks: Vec<bool> = results.iter().map(Result::is_ok).collect();
    ensure_eq!(
        oks,
        vec![true, false, true],
        "item 1's seal refused it: {results:?}"
    );
    let mut seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    seen.sort();
    let source = buf.read(0, 9 * n)?;
    let expected: Vec<(usize, Vec<u8>, usize)> = (0..3)
        .map(|i| {
            let at = (3 * i + 1) * n as usize;
            (i, source[at..at + 2 * n as usize].to_vec(), n as usize)
        })
        .collect();
    ensure!(
        seen == expected,
        "the seal saw (item, payload bytes, header bytes) {:?}; it must see each item once, with the bytes of its segments after the first and a copy of the first",
        seen.iter()
            .map(|(i, p, h)| (*i, p.len(), *h))
            .collect::<Vec<_>>()
    );
    let exists: Vec<bool> = b
        .exists(&keys)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    ensure_eq!(
        exists,
        vec![true, false, true],
        "a refused item is not stored"
    );
    for i in [0usize, 2] {
        let at = 3 * i as u64 * n;
        ensure_eq!(
            get(&b, &keys[i], &[buf.slice(9 * n, 3 * n)]).await?,
            ReadOutcome::Hit
        );
        let stored = buf.read(9 * n, 3 * n)?;
        let mut want = buf.read(at, 3 * n)?;
        let sum = want[n as usize..]
            .iter()
            .map(|&x| u64::from(x))
            .sum::<u64>();
        want[..8].copy_from_slice(&(i as u64 + 7).to_le_bytes());
        want[8..16].copy_from_slice(&sum.to_le_bytes());
        ensure!(
            stored == want,
            "object {i} was not stored as sealed: its first segment must be the seal's completed copy and the rest as written"
        );
    }
    ensure_eq!(
        buf.read(0, 9 * n)?,
        source,
        "the first segments' own memory must only be read"
    );
    Ok(())
}

/// A missing object is a miss, not an error.
pub async fn backend_read_missing_is_not_found(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, n)?;
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
    let buf = buffer(env, &b, 4 * n)?;
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
    let buf = buffer(env, &b, n)?;
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
    let buf = buffer(env, &b, n)?;
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
    let buf = buffer(env, &b, n)?;
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
    let buf = buffer(env, &b, 6 * n)?;
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
    let buf = buffer(env, &b, 8 * n)?;
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

/// 256 items in one batch.
pub async fn backend_large_batch(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let count = 256u64;
    let src = buffer(env, &b, count * n)?;
    let dst = buffer(env, &b, count * n)?;
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
    let src = buffer(env, &b, (max + 1) * n)?;
    let dst = buffer(env, &b, max * n)?;
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
