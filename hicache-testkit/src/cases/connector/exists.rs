//! `batch_exists`: the longest stored prefix, and that asking creates nothing.

use hicache_core::raw::ObjectKey;
use hicache_core::{HiCache, HostSlots, Layout, PageKey};

use crate::check::{CaseError, CaseResult, per_item};
use crate::fixtures::{keys, mha};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{PAGES, all_hits, all_written};

/// B1: `batch_exists([])` is 0.
pub async fn connector_exists_empty_is_zero(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
    ensure_eq!(cache.batch_exists(&[]).await?, 0);
    Ok(())
}

pub(super) async fn exists_fixture(
    env: &TrialEnv,
    stored: &[usize],
) -> Result<(HiCache, Vec<PageKey>), CaseError> {
    let cache = env.default_connector()?;
    cache.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
    let ks = keys("ex", 3);
    for &i in stored {
        ensure!(all_written(
            &cache
                .batch_set(&ks[i..i + 1], HostSlots::Pages(&[i as u64]))
                .await?
        ));
    }
    Ok((cache, ks))
}

/// B2: with a and c stored, `[a, b, c]` gives 1.
pub async fn connector_exists_stops_at_a_hole(env: &TrialEnv) -> CaseResult {
    let (cache, ks) = exists_fixture(env, &[0, 2]).await?;
    ensure_eq!(cache.batch_exists(&ks).await?, 1);
    Ok(())
}

/// B3: with only b and c stored, the prefix is 0.
pub async fn connector_exists_missing_first_is_zero(env: &TrialEnv) -> CaseResult {
    let (cache, ks) = exists_fixture(env, &[1, 2]).await?;
    ensure_eq!(cache.batch_exists(&ks).await?, 0);
    Ok(())
}

/// B4: all stored gives 3.
pub async fn connector_exists_all(env: &TrialEnv) -> CaseResult {
    let (cache, ks) = exists_fixture(env, &[0, 1, 2]).await?;
    ensure_eq!(cache.batch_exists(&ks).await?, 3);
    Ok(())
}

/// B5: `batch_exists(keys[..n]) == min(n, p)` where `p` is the length of the stored
/// prefix, and the `p` pages it counts read back as hits.
pub async fn connector_exists_prefix_monotonic(env: &TrialEnv) -> CaseResult {
    for stored in [&[0usize, 1][..], &[0, 2], &[1], &[0, 1, 2]] {
        let (cache, ks) = exists_fixture(env, stored).await?;
        let prefix = (0..ks.len()).take_while(|i| stored.contains(i)).count();
        for n in 0..=ks.len() {
            ensure_eq!(
                cache.batch_exists(&ks[..n]).await?,
                n.min(prefix),
                "stored {stored:?} n {n}"
            );
        }
        let targets: Vec<u64> = (0..prefix as u64).map(|p| 6 + p).collect();
        let got = cache
            .batch_get(&ks[..prefix], HostSlots::Pages(&targets))
            .await?;
        ensure!(
            all_hits(&got),
            "stored {stored:?}: counted pages miss: {got:?}"
        );
        for r in cache.batch_remove(&ks).await? {
            r?;
        }
    }
    Ok(())
}

/// B6: `exists(k) == (batch_exists([k]) > 0)`.
pub async fn connector_exists_single_matches_batch(env: &TrialEnv) -> CaseResult {
    let (cache, ks) = exists_fixture(env, &[0, 2]).await?;
    for k in &ks {
        ensure_eq!(
            cache.exists(k).await?,
            cache.batch_exists(std::slice::from_ref(k)).await? > 0
        );
    }
    Ok(())
}

/// B7: existence checks create nothing.
pub async fn connector_exists_creates_nothing(env: &TrialEnv) -> CaseResult {
    let (cache, ks) = exists_fixture(env, &[]).await?;
    for _ in 0..3 {
        ensure_eq!(cache.batch_exists(&ks).await?, 0);
    }
    let names: Vec<ObjectKey> = ks
        .iter()
        .flat_map(|k| cache.object_names(k).expect("names"))
        .collect();
    let found = per_item("exists", names.len(), cache.backend().exists(&names).await)?;
    ensure!(found.iter().all(|r| matches!(r, Ok(false))), "{found:?}");
    Ok(())
}
