//! Batch calls: per-page results, empty and ragged batches, chunking past 128 pages,
//! overwrite, removal, re-registration and small staging chunks.

use hicache_core::{
    Error, HiCache, HiCacheOptions, HostSlots, Layout, MissReason, PoolGeometry, ReadOutcome,
    StorageIdentity, TransferMode,
};

use crate::check::CaseResult;
use crate::fixtures::{fill_page, keys, mha, page_bytes, page_unchanged, snapshot};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::exists::exists_fixture;
use super::layouts::{needs_alignment, round_trip, unaligned_geometry};
use super::{PAGES, all_hits, all_written};

/// B11/B14: one result per page; misses inside a batch are per page.
pub async fn connector_misses_are_per_page(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let ks = keys("pp", 5);
    let d0 = fill_page(&pool, 0, 1);
    let d2 = fill_page(&pool, 2, 2);
    cache
        .batch_set(&[ks[0].clone(), ks[2].clone()], HostSlots::Pages(&[0, 2]))
        .await?;
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[5, 6, 7, 8, 9]))
        .await?;
    ensure_eq!(got.len(), 5);
    let outcome: Vec<bool> = got
        .iter()
        .map(|r| matches!(r, Ok(ReadOutcome::Hit)))
        .collect();
    ensure_eq!(outcome, vec![true, false, true, false, false]);
    ensure!(
        got.iter()
            .enumerate()
            .filter(|(i, _)| !outcome[*i])
            .all(|(_, r)| matches!(r, Ok(ReadOutcome::Miss(MissReason::NotFound))))
    );
    ensure_eq!(page_bytes(&pool, 5), d0);
    ensure_eq!(page_bytes(&pool, 7), d2);
    Ok(())
}

/// B12: empty set and get return empty results.
pub async fn connector_empty_set_and_get(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
    ensure!(
        cache
            .batch_set(&[], HostSlots::Pages(&[]))
            .await?
            .is_empty()
    );
    ensure!(
        cache
            .batch_get(&[], HostSlots::Tokens(&[]))
            .await?
            .is_empty()
    );
    Ok(())
}

/// B13 (fixed): ragged, misaligned or out-of-pool host indices are rejected before I/O.
pub async fn connector_ragged_host_indices_rejected(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(env.pool(mha(Layout::PageFirst, 4, PAGES))?)?;
    let ks = keys("rg", 2);
    let ragged: Vec<u64> = (0..7).collect();
    let shifted: Vec<u64> = (1..9).collect();
    let gap = vec![0, 1, 2, 3, 4, 5, 6, 8];
    let outside: Vec<u64> = (PAGES * 4..PAGES * 4 + 8).collect();
    for t in [&ragged, &shifted, &gap, &outside] {
        ensure!(
            matches!(
                cache.batch_set(&ks, HostSlots::Tokens(t)).await,
                Err(Error::InvalidBatch { .. })
            ),
            "{t:?} accepted"
        );
        ensure!(
            matches!(
                cache.batch_get(&ks, HostSlots::Tokens(t)).await,
                Err(Error::InvalidBatch { .. })
            ),
            "{t:?} accepted"
        );
    }
    ensure!(cache.batch_set(&ks, HostSlots::Pages(&[0])).await.is_err());
    ensure_eq!(
        cache.batch_exists(&ks).await?,
        0,
        "a rejected batch wrote something"
    );
    let ok: Vec<u64> = (8..16).collect();
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Tokens(&ok)).await?
    ));
    Ok(())
}

/// B15: in bounce mode a failed get leaves host pages untouched (bounce forced by config on
/// every backend, and chosen by an unaligned geometry under direct I/O).
pub async fn connector_bounce_miss_leaves_host_untouched(env: &TrialEnv) -> CaseResult {
    let forced = env.connector(StorageIdentity::single("m"), &[("transfer_mode", "bounce")])?;
    bounce_miss(env, &forced, mha(Layout::PageFirst, 16, PAGES), "bu-forced").await?;
    if needs_alignment(env).is_ok() {
        let cache = env.default_connector()?;
        bounce_miss(env, &cache, unaligned_geometry(Layout::PageFirst), "bu").await?;
    }
    Ok(())
}

async fn bounce_miss(
    env: &TrialEnv,
    cache: &HiCache,
    geometry: PoolGeometry,
    prefix: &str,
) -> CaseResult {
    let pool = env.pool(geometry)?;
    ensure_eq!(
        cache.register_pool(pool.clone())?.mode,
        TransferMode::Bounce
    );
    let ks = keys(prefix, 3);
    fill_page(&pool, 0, 3);
    cache.batch_set(&ks[..1], HostSlots::Pages(&[0])).await?;
    for p in 4..PAGES {
        fill_page(&pool, p, 9);
    }
    let before = snapshot(&pool);
    let got = cache.batch_get(&ks, HostSlots::Pages(&[4, 5, 6])).await?;
    ensure!(matches!(got[0], Ok(ReadOutcome::Hit)) && !matches!(got[1], Ok(ReadOutcome::Hit)));
    let after = snapshot(&pool);
    ensure!(
        page_unchanged(&geometry, 5, &before, &after)
            && page_unchanged(&geometry, 6, &before, &after),
        "missed pages were written"
    );
    Ok(())
}

/// B21 (fixed): far more than 128 pages in one call are chunked, not failed.
pub async fn connector_batches_above_128_pages(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let geometry = mha(Layout::PageFirst, 4, 400);
    let pool = env.pool(geometry)?;
    cache.register_pool(pool.clone())?;
    let ks = keys("big", 200);
    let src: Vec<u64> = (0..200).collect();
    let dst: Vec<u64> = (200..400).collect();
    let data: Vec<Vec<u8>> = src
        .iter()
        .map(|p| fill_page(&pool, *p, *p as u32))
        .collect();
    let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await?;
    ensure_eq!(set.len(), 200);
    ensure!(all_written(&set));
    ensure_eq!(cache.batch_exists(&ks).await?, 200);
    let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await?;
    ensure!(all_hits(&got));
    for (i, p) in dst.iter().enumerate() {
        ensure_eq!(page_bytes(&pool, *p), data[i], "page {i}");
    }
    Ok(())
}

/// B22: I/O before `register_pool` is a typed error.
pub async fn connector_io_before_register_is_an_error(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let ks = keys("nr", 1);
    ensure!(matches!(
        cache.batch_get(&ks, HostSlots::Pages(&[0])).await,
        Err(Error::PoolNotRegistered)
    ));
    ensure!(matches!(
        cache.batch_set(&ks, HostSlots::Pages(&[0])).await,
        Err(Error::PoolNotRegistered)
    ));
    ensure!(matches!(
        cache.batch_exists(&ks).await,
        Err(Error::PoolNotRegistered)
    ));
    Ok(())
}

/// B23: setting a key again succeeds and the page stays readable (new content wins).
pub async fn connector_set_twice(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let ks = keys("tw", 1);
    fill_page(&pool, 0, 1);
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&[0])).await?
    ));
    let second = fill_page(&pool, 0, 2);
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&[0])).await?
    ));
    ensure!(all_hits(
        &cache.batch_get(&ks, HostSlots::Pages(&[1])).await?
    ));
    ensure_eq!(page_bytes(&pool, 1), second);
    Ok(())
}

/// Removing pages makes them miss, and only them.
pub async fn connector_remove_pages(env: &TrialEnv) -> CaseResult {
    let (cache, ks) = exists_fixture(env, &[0, 1, 2]).await?;
    for r in cache.batch_remove(&ks[1..2]).await? {
        r?;
    }
    ensure_eq!(cache.batch_exists(&ks).await?, 1);
    ensure!(cache.exists(&ks[2]).await?, "removing page 1 took page 2");
    let got = cache.batch_get(&ks, HostSlots::Pages(&[6, 7, 8])).await?;
    ensure!(
        matches!(
            got[..],
            [
                Ok(ReadOutcome::Hit),
                Ok(ReadOutcome::Miss(MissReason::NotFound)),
                Ok(ReadOutcome::Hit)
            ]
        ),
        "{got:?}"
    );
    for r in cache.batch_remove(&ks).await? {
        r?;
    }
    ensure_eq!(cache.batch_exists(&ks).await?, 0);
    Ok(())
}

/// A pool registered twice replaces the first registration.
pub async fn connector_reregister_pool(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
    let mode = round_trip(env, &cache, mha(Layout::PageFirstDirect, 16, PAGES)).await?;
    ensure!(matches!(
        mode,
        TransferMode::ZeroCopy | TransferMode::Bounce
    ));
    cache.close();
    cache.close();
    ensure!(matches!(
        cache.batch_exists(&keys("x", 1)).await,
        Err(Error::PoolNotRegistered)
    ));
    Ok(())
}

/// Small staging chunks (many backend calls per batch) still give exact results.
pub async fn connector_small_staging_chunks(env: &TrialEnv) -> CaseResult {
    let options = HiCacheOptions::new(StorageIdentity::single("m")).with_max_slots_per_chunk(3);
    let cache = env.connector_with_options(options)?;
    let geometry = mha(Layout::PageFirst, 16, 40);
    let pool = env.pool(geometry)?;
    cache.register_pool(pool.clone())?;
    let ks = keys("sc", 17);
    let src: Vec<u64> = (0..17).collect();
    let dst: Vec<u64> = (20..37).collect();
    let data: Vec<Vec<u8>> = src
        .iter()
        .map(|p| fill_page(&pool, *p, 300 + *p as u32))
        .collect();
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&src)).await?
    ));
    ensure!(all_hits(
        &cache.batch_get(&ks, HostSlots::Pages(&dst)).await?
    ));
    for (i, p) in dst.iter().enumerate() {
        ensure_eq!(page_bytes(&pool, *p), data[i]);
    }
    Ok(())
}
