//! Prefetch, backup and existence threads at once, and setters racing on the same keys.

use std::sync::Arc;

use hicache_core::{Error, HostSlots, Layout, MissReason, ReadOutcome, SetOutcome};

use crate::check::{CaseError, CaseResult};
use crate::fixtures::{fill_page, keys, mha, page_bytes};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::all_hits;

/// B25/B26: prefetch (get), backup (set) and existence threads at once, 10k operations
/// (fewer where the variant or the environment says: [`TrialEnv::concurrency_ops`]),
/// overlapping keys; every hit has the right bytes.
pub async fn connector_three_threads_10k_ops(env: &TrialEnv) -> CaseResult {
    let cache = Arc::new(env.default_connector()?);
    let geometry = mha(Layout::PageFirst, 2, 64);
    let pool = env.pool(geometry)?;
    cache.register_pool(pool.clone())?;
    let ks = keys("cc", 16);
    // A key's content depends only on the key, so concurrent writers of one key agree.
    let expected: Vec<Vec<u8>> = (0..16)
        .map(|i| fill_page(&pool, i, 500 + i as u32))
        .collect();
    let ops = env.concurrency_ops();
    let per_thread = ops / 3;
    let handle = tokio::runtime::Handle::current();
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (cache, ks, pool, expected, handle) = (
                cache.clone(),
                ks.clone(),
                pool.clone(),
                expected.clone(),
                handle.clone(),
            );
            std::thread::spawn(move || -> Result<(), String> {
                for op in 0..per_thread {
                    let i = ((op * 7 + t * 5) % 16) as usize;
                    match t {
                        0 => {
                            let r = handle
                                .block_on(
                                    cache.batch_set(&ks[i..i + 1], HostSlots::Pages(&[i as u64])),
                                )
                                .map_err(|e| e.to_string())?;
                            if !matches!(r[0], Ok(SetOutcome::Written)) {
                                return Err(format!("set {i}: {:?}", r[0]));
                            }
                        }
                        1 => {
                            let target = 16 + (op % 48);
                            let r = handle
                                .block_on(
                                    cache.batch_get(&ks[i..i + 1], HostSlots::Pages(&[target])),
                                )
                                .map_err(|e| e.to_string())?;
                            match &r[0] {
                                Ok(ReadOutcome::Hit) => {
                                    if page_bytes(&pool, target) != expected[i] {
                                        return Err(format!("get {i}: wrong bytes"));
                                    }
                                }
                                Ok(ReadOutcome::Miss(MissReason::NotFound)) => {}
                                other => return Err(format!("get {i}: {other:?}")),
                            }
                        }
                        _ => {
                            let n = handle
                                .block_on(cache.batch_exists(&ks))
                                .map_err(|e| e.to_string())?;
                            if n > 16 {
                                return Err(format!("exists returned {n}"));
                            }
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    let results = tokio::task::spawn_blocking(move || {
        threads.into_iter().map(|t| t.join()).collect::<Vec<_>>()
    })
    .await
    .map_err(|e| CaseError::Failed(e.to_string()))?;
    for r in results {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => return Err(CaseError::Failed(msg)),
            Err(_) => return Err(CaseError::Failed("a thread panicked".into())),
        }
    }
    Ok(())
}

/// B26: two setters and two getters of the same keys at once stay correct.
pub async fn connector_concurrent_setters_same_keys(env: &TrialEnv) -> CaseResult {
    let cache = Arc::new(env.default_connector()?);
    let pool = env.pool(mha(Layout::PageFirst, 16, 32))?;
    cache.register_pool(pool.clone())?;
    let ks = keys("cs", 4);
    let expected: Vec<Vec<u8>> = (0..4)
        .map(|i| fill_page(&pool, i, 900 + i as u32))
        .collect();
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (cache, ks) = (cache.clone(), ks.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25u64 {
                if t < 2 {
                    cache
                        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
                        .await?;
                } else {
                    let base = 8 + (t - 2) * 8 + (round % 2) * 4;
                    cache
                        .batch_get(&ks, HostSlots::Pages(&[base, base + 1, base + 2, base + 3]))
                        .await?;
                }
            }
            Ok::<(), Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| CaseError::Failed(e.to_string()))??;
    }
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[28, 29, 30, 31]))
        .await?;
    ensure!(all_hits(&got));
    for i in 0..4 {
        ensure_eq!(page_bytes(&pool, 28 + i), expected[i as usize]);
    }
    Ok(())
}
