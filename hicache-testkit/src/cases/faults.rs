//! Fault cases: the plugin wrapped in a `FaultyBackend`. The connector must report per-page
//! errors or misses, never hand out wrong bytes, and never panic.

use std::sync::Arc;
use std::time::Duration;

use hicache_core::{
    HiCache, HiCacheOptions, HostSlots, Layout, MissReason, MmapPool, PageKey, ReadOutcome,
    StorageIdentity,
};

use crate::check::{CaseError, CaseResult};
use crate::fault::{FaultPlan, FaultyBackend};
use crate::fixtures::{fill_page, keys, mha, page_bytes};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

struct Faulty {
    cache: HiCache,
    faults: Arc<crate::fault::Injected>,
    pool: Arc<MmapPool>,
    keys: Vec<PageKey>,
    data: Vec<Vec<u8>>,
}

/// A connector over the faulty plugin with 32 pages filled; `clean` first stores them through
/// a fault-free connector over the same storage.
async fn faulty(env: &TrialEnv, plan: FaultPlan, clean: bool) -> Result<Faulty, CaseError> {
    let geometry = mha(Layout::PageFirst, 4, 64);
    let pool = env.pool(geometry)?;
    let ks = keys("ft", 32);
    let data: Vec<Vec<u8>> = (0..32)
        .map(|p| fill_page(&pool, p, 700 + p as u32))
        .collect();
    if clean {
        let c = env.default_connector()?;
        c.register_pool(pool.clone())?;
        let pages: Vec<u64> = (0..32).collect();
        let r = c.batch_set(&ks, HostSlots::Pages(&pages)).await?;
        ensure!(r.iter().all(|r| r.is_ok()), "clean writes failed");
    }
    let backend = Arc::new(FaultyBackend::new(env.backend()?, plan));
    let faults = backend.injected.clone();
    let cache = HiCache::with_backend(
        backend,
        env.config().load()?,
        HiCacheOptions::new(StorageIdentity::single("m")),
    )?;
    cache.register_pool(pool.clone())?;
    Ok(Faulty {
        cache,
        faults,
        pool,
        keys: ks,
        data,
    })
}

fn src() -> Vec<u64> {
    (0..32).collect()
}

fn dst() -> Vec<u64> {
    (32..64).collect()
}

/// Checks every hit holds the right bytes; returns the number of hits.
fn verify_hits(f: &Faulty, got: &[hicache_core::Result<ReadOutcome>]) -> Result<usize, CaseError> {
    let mut hits = 0;
    for (i, r) in got.iter().enumerate() {
        if matches!(r, Ok(ReadOutcome::Hit)) {
            hits += 1;
            ensure_eq!(
                page_bytes(&f.pool, 32 + i as u64),
                f.data[i],
                "page {i} is a hit with wrong bytes"
            );
        }
    }
    Ok(hits)
}

/// EIO and ENOSPC on writes come back as errors of exactly those pages.
pub async fn faults_write_errors_are_per_page(env: &TrialEnv) -> CaseResult {
    let plan = FaultPlan {
        seed: 11,
        eio: 0.25,
        enospc: 0.1,
        ..FaultPlan::default()
    };
    let f = faulty(env, plan, false).await?;
    let set = f.cache.batch_set(&f.keys, HostSlots::Pages(&src())).await?;
    let failed = set.iter().filter(|r| r.is_err()).count() as u64;
    ensure!(failed > 0, "no fault was injected; the case proves nothing");
    ensure_eq!(failed, f.faults.total());
    // Check what is stored through a fault-free connector over the same storage.
    let clean = env.default_connector()?;
    clean.register_pool(f.pool.clone())?;
    let got = clean.batch_get(&f.keys, HostSlots::Pages(&dst())).await?;
    for (i, (s, g)) in set.iter().zip(&got).enumerate() {
        match (s, g) {
            (Ok(_), Ok(ReadOutcome::Hit)) => {}
            (Err(_), Ok(ReadOutcome::Miss(MissReason::NotFound))) => {}
            other => return Err(CaseError::Failed(format!("page {i}: set/get {other:?}"))),
        }
    }
    verify_hits(&f, &got).map(drop)
}

/// Torn reads reported as hits by a lying plugin are caught: misses, never wrong bytes.
pub async fn faults_torn_reads_never_return_wrong_bytes(env: &TrialEnv) -> CaseResult {
    let plan = FaultPlan {
        seed: 12,
        short_read: 0.4,
        ..FaultPlan::default()
    };
    let f = faulty(env, plan, true).await?;
    let got = f.cache.batch_get(&f.keys, HostSlots::Pages(&dst())).await?;
    let torn = f
        .faults
        .short_reads
        .load(std::sync::atomic::Ordering::Relaxed);
    ensure!(torn > 0, "no fault was injected; the case proves nothing");
    let hits = verify_hits(&f, &got)?;
    ensure_eq!(hits as u64 + torn, 32, "every torn page must be a miss");
    ensure!(
        got.iter().all(|r| matches!(
            r,
            Ok(ReadOutcome::Hit) | Ok(ReadOutcome::Miss(MissReason::ChecksumMismatch))
        )),
        "{got:?}"
    );
    Ok(())
}

/// Short writes reported as success are caught when the page is read.
pub async fn faults_short_writes_are_caught_on_read(env: &TrialEnv) -> CaseResult {
    let plan = FaultPlan {
        seed: 13,
        short_write: 0.4,
        ..FaultPlan::default()
    };
    let f = faulty(env, plan, false).await?;
    let set = f.cache.batch_set(&f.keys, HostSlots::Pages(&src())).await?;
    ensure!(
        set.iter().all(|r| r.is_ok()),
        "short writes are reported as success by design"
    );
    let short = f
        .faults
        .short_writes
        .load(std::sync::atomic::Ordering::Relaxed);
    ensure!(short > 0, "no fault was injected; the case proves nothing");
    let got = f.cache.batch_get(&f.keys, HostSlots::Pages(&dst())).await?;
    let hits = verify_hits(&f, &got)?;
    ensure_eq!(hits as u64 + short, 32);
    ensure!(
        got.iter().all(|r| matches!(
            r,
            Ok(ReadOutcome::Hit) | Ok(ReadOutcome::Miss(MissReason::SizeMismatch { .. }))
        )),
        "{got:?}"
    );
    Ok(())
}

/// A batch cut part-way: the items before the cut succeed, the rest fail, each reported.
pub async fn faults_batch_cut_is_reported_per_page(env: &TrialEnv) -> CaseResult {
    let plan = FaultPlan {
        seed: 21,
        batch_cut: 1.0,
        ..FaultPlan::default()
    };
    let f = faulty(env, plan, false).await?;
    let set = f.cache.batch_set(&f.keys, HostSlots::Pages(&src())).await?;
    ensure!(
        f.faults.total() > 0,
        "no fault was injected; the case proves nothing"
    );
    let first_err = set.iter().position(|r| r.is_err()).unwrap_or(set.len());
    ensure!(
        set[first_err..].iter().all(|r| r.is_err()),
        "errors are not a suffix of a chunk: {set:?}"
    );
    ensure_eq!(
        set.iter().filter(|r| r.is_err()).count() as u64,
        f.faults
            .cut_items
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    // Through a fault-free connector: what the set called written is there, the rest is not.
    let clean = env.default_connector()?;
    clean.register_pool(f.pool.clone())?;
    let got = clean.batch_get(&f.keys, HostSlots::Pages(&dst())).await?;
    for (i, (s, g)) in set.iter().zip(&got).enumerate() {
        match (s, g) {
            (Ok(_), Ok(ReadOutcome::Hit))
            | (Err(_), Ok(ReadOutcome::Miss(MissReason::NotFound))) => {}
            other => return Err(CaseError::Failed(format!("page {i}: set/get {other:?}"))),
        }
    }
    ensure!(
        set.iter().any(|r| r.is_ok()),
        "every page was cut; the case proves nothing about the pages before a cut"
    );
    verify_hits(&f, &got)?;
    // And through the faulty one: a cut read is an error, never a hit with wrong bytes.
    let got = f.cache.batch_get(&f.keys, HostSlots::Pages(&dst())).await?;
    verify_hits(&f, &got).map(drop)
}

/// Latency and errors under concurrent batches: results stay exact.
pub async fn faults_latency_and_errors_under_concurrency(env: &TrialEnv) -> CaseResult {
    let plan = FaultPlan {
        seed: 15,
        eio: 0.1,
        short_read: 0.1,
        latency: Some(Duration::from_millis(1)),
        ..FaultPlan::default()
    };
    let f = Arc::new(faulty(env, plan, true).await?);
    let mut tasks = Vec::new();
    for t in 0..3u64 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let mut hits = 0u32;
            for round in 0..5u64 {
                let ks: Vec<PageKey> = (0..8)
                    .map(|i| f.keys[((t * 8 + i + round) % 32) as usize].clone())
                    .collect();
                let idx: Vec<usize> = (0..8)
                    .map(|i| ((t * 8 + i + round) % 32) as usize)
                    .collect();
                let targets: Vec<u64> = (0..8).map(|i| 32 + t * 8 + i).collect();
                let got = f
                    .cache
                    .batch_get(&ks, HostSlots::Pages(&targets))
                    .await
                    .map_err(|e| e.to_string())?;
                if got.len() != ks.len() {
                    return Err(format!("task {t}: {} results for 8 pages", got.len()));
                }
                for (j, r) in got.iter().enumerate() {
                    match r {
                        Ok(ReadOutcome::Hit) => {
                            if page_bytes(&f.pool, targets[j]) != f.data[idx[j]] {
                                return Err(format!("task {t}: wrong bytes for page {}", idx[j]));
                            }
                            hits += 1;
                        }
                        // Injected: EIO, or a torn read the envelope catches.
                        Err(_) | Ok(ReadOutcome::Miss(MissReason::ChecksumMismatch)) => {}
                        Ok(other) => return Err(format!("task {t}: page {}: {other:?}", idx[j])),
                    }
                }
            }
            Ok::<u32, String>(hits)
        }));
    }
    let mut hits = 0;
    for task in tasks {
        let r = task.await.map_err(|e| CaseError::Failed(e.to_string()))?;
        match r {
            Ok(h) => hits += h,
            Err(e) => return Err(CaseError::Failed(e)),
        }
    }
    ensure!(
        f.faults.total() > 0,
        "no fault was injected; the case proves nothing"
    );
    // 120 reads at a 10 % error and 10 % tear rate: most must still hit.
    ensure!(hits >= 60, "only {hits} of 120 reads hit");
    Ok(())
}

/// An existence error ends the prefix there instead of claiming pages.
pub async fn faults_exists_errors_end_the_prefix(env: &TrialEnv) -> CaseResult {
    let plan = FaultPlan {
        seed: 16,
        eio: 0.2,
        ..FaultPlan::default()
    };
    let f = faulty(env, plan, true).await?;
    let n = f.cache.batch_exists(&f.keys).await?;
    ensure!(
        f.faults.eio.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no fault was injected; the case proves nothing"
    );
    ensure!(n < 32, "an erroring existence check was counted as present");
    Ok(())
}
