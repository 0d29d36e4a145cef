//! SGLang's own object naming (`_k`/`_v` raw pages) and the raw page format.

use hicache_core::{HostSlots, Layout, NamingScheme, PageKey, StorageIdentity, TransferMode};

use crate::check::{CaseResult, skip};
use crate::fixtures::{fill_page, keys, mha, page_bytes};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::integrity::raw_object;
use super::layouts::round_trip;
use super::{PAGES, all_hits, all_written};

/// SGLang naming with raw pages: `_k`/`_v` objects holding exactly the K and V bytes.
pub async fn connector_sglang_naming_raw_pages(env: &TrialEnv) -> CaseResult {
    let identity = StorageIdentity {
        tp_rank: 0,
        tp_size: 2,
        ..StorageIdentity::single("Qwen/Qwen3-8B")
    };
    let cache = env.connector(identity, &[("naming", "sglang"), ("page_format", "raw")])?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    let report = cache.register_pool(pool.clone())?;
    ensure_eq!(report.naming, NamingScheme::Sglang);
    let key = PageKey::new(format!("{:064x}", 0xabcdefu64))?;
    let flat = fill_page(&pool, 0, 21);
    ensure!(all_written(
        &cache
            .batch_set(std::slice::from_ref(&key), HostSlots::Pages(&[0]))
            .await?
    ));
    let names = cache.object_names(&key)?;
    if report.mode == TransferMode::ZeroCopy {
        let want: Vec<String> = ["_k", "_v"]
            .iter()
            .map(|s| format!("{key}_Qwen-Qwen3-8B_0_2{s}"))
            .collect();
        ensure_eq!(
            names
                .iter()
                .map(|n| n.as_str().to_string())
                .collect::<Vec<_>>(),
            want
        );
        let half = flat.len() as u64 / 2;
        ensure_eq!(
            raw_object(&cache, env, &names[0], half).await?,
            flat[..half as usize].to_vec()
        );
        ensure_eq!(
            raw_object(&cache, env, &names[1], half).await?,
            flat[half as usize..].to_vec()
        );
    } else {
        ensure_eq!(names[0].as_str(), format!("{key}_Qwen-Qwen3-8B_0_2"));
    }
    ensure!(all_hits(
        &cache
            .batch_get(std::slice::from_ref(&key), HostSlots::Pages(&[5]))
            .await?
    ));
    ensure_eq!(page_bytes(&pool, 5), flat);
    Ok(())
}

/// B8: under SGLang zero-copy naming, a page whose `_v` is missing does not exist.
pub async fn connector_sglang_missing_v_ends_the_prefix(env: &TrialEnv) -> CaseResult {
    let cache = env.connector(
        StorageIdentity::single("m"),
        &[("naming", "sglang"), ("page_format", "raw")],
    )?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    let report = cache.register_pool(pool.clone())?;
    if report.mode != TransferMode::ZeroCopy {
        return skip(format!(
            "the pool moves {} here, so pages are single objects",
            report.mode
        ));
    }
    let ks = keys("sv", 3);
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&[0, 1, 2])).await?
    ));
    let v1 = cache.object_names(&ks[1])?.remove(1);
    ensure!(v1.as_str().ends_with("_v"));
    for r in cache.backend().remove(std::slice::from_ref(&v1)).await {
        r?;
    }
    ensure_eq!(cache.batch_exists(&ks).await?, 1);
    Ok(())
}

/// Raw pages (no envelope) round-trip.
pub async fn connector_raw_format_round_trip(env: &TrialEnv) -> CaseResult {
    let cache = env.connector(StorageIdentity::single("m"), &[("page_format", "raw")])?;
    round_trip(env, &cache, mha(Layout::PageFirst, 16, PAGES))
        .await
        .map(drop)
}
