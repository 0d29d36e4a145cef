//! What keeps one model's, rank's or shape's pages apart, and what lets MLA ranks share.

use hicache_core::{
    AttentionKind, Dtype, HostSlots, Layout, PoolGeometry, ReadOutcome, SetOutcome, StorageIdentity,
};

use crate::check::CaseResult;
use crate::fixtures::{fill_page, keys, mha, mla, page_bytes};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{PAGES, all_hits, all_written};

/// B17: an MLA rank other than the writer skips writes and says so; nothing is stored.
pub async fn connector_mla_non_writer_skips(env: &TrialEnv) -> CaseResult {
    let identity = StorageIdentity {
        tp_rank: 2,
        tp_size: 4,
        ..StorageIdentity::single("ds")
    };
    let cache = env.connector(identity, &[])?;
    let report = cache.register_pool(env.pool(mla(Layout::PageFirst, 16, PAGES))?)?;
    ensure!(!report.writer);
    let ks = keys("mw", 2);
    let r = cache.batch_set(&ks, HostSlots::Pages(&[0, 1])).await?;
    ensure!(
        r.iter()
            .all(|r| matches!(r, Ok(SetOutcome::SkippedNotWriter))),
        "{r:?}"
    );
    ensure_eq!(cache.batch_exists(&ks).await?, 0);
    Ok(())
}

/// B18: MLA pages written at TP 0/4 read at 2/4 and 0/8.
pub async fn connector_mla_pages_are_shared_across_tp(env: &TrialEnv) -> CaseResult {
    let id = |r, s| StorageIdentity {
        tp_rank: r,
        tp_size: s,
        ..StorageIdentity::single("ds")
    };
    let writer = env.connector(id(0, 4), &[])?;
    let wpool = env.pool(mla(Layout::PageFirst, 16, PAGES))?;
    writer.register_pool(wpool.clone())?;
    let ks = keys("ms", 1);
    let data = fill_page(&wpool, 0, 5);
    ensure!(all_written(
        &writer.batch_set(&ks, HostSlots::Pages(&[0])).await?
    ));
    for (r, s) in [(2, 4), (0, 8)] {
        let reader = env.connector(id(r, s), &[])?;
        let rpool = env.pool(mla(Layout::PageFirst, 16, PAGES))?;
        reader.register_pool(rpool.clone())?;
        let got = reader.batch_get(&ks, HostSlots::Pages(&[3])).await?;
        ensure!(all_hits(&got), "tp {r}/{s}: {got:?}");
        ensure_eq!(page_bytes(&rpool, 3), data);
    }
    Ok(())
}

async fn isolated(
    env: &TrialEnv,
    writer: (StorageIdentity, PoolGeometry),
    reader: (StorageIdentity, PoolGeometry),
) -> CaseResult {
    let w = env.connector(writer.0, &[])?;
    let wpool = env.pool(writer.1)?;
    w.register_pool(wpool.clone())?;
    let ks = keys("iso", 1);
    fill_page(&wpool, 0, 6);
    ensure!(all_written(
        &w.batch_set(&ks, HostSlots::Pages(&[0])).await?
    ));
    let r = env.connector(reader.0, &[])?;
    r.register_pool(env.pool(reader.1)?)?;
    ensure_eq!(
        r.batch_exists(&ks).await?,
        0,
        "the page is visible to another namespace"
    );
    let got = r.batch_get(&ks, HostSlots::Pages(&[1])).await?;
    ensure!(matches!(got[0], Ok(ReadOutcome::Miss(_))), "{got:?}");
    Ok(())
}

/// B19: MHA pages are rank-specific.
pub async fn connector_mha_pages_are_rank_specific(env: &TrialEnv) -> CaseResult {
    let id = |r, s| StorageIdentity {
        tp_rank: r,
        tp_size: s,
        ..StorageIdentity::single("m")
    };
    let g = mha(Layout::PageFirst, 16, PAGES);
    isolated(env, (id(0, 2), g), (id(1, 2), g)).await?;
    isolated(env, (id(0, 2), g), (id(0, 4), g)).await
}

/// B20: another model misses.
pub async fn connector_other_model_misses(env: &TrialEnv) -> CaseResult {
    let g = mha(Layout::PageFirst, 16, PAGES);
    isolated(
        env,
        (StorageIdentity::single("org/model-a"), g),
        (StorageIdentity::single("org/model-b"), g),
    )
    .await
}

/// Pipeline stages with the same TP rank do not share pages (SGLang NIXL's collision).
pub async fn connector_pp_stages_are_isolated(env: &TrialEnv) -> CaseResult {
    let id = |pp| StorageIdentity {
        pp_rank: pp,
        pp_size: 2,
        ..StorageIdentity::single("m")
    };
    let g = mha(Layout::PageFirst, 16, PAGES);
    isolated(env, (id(0), g), (id(1), g)).await
}

/// B60: another layout (byte order) misses.
pub async fn connector_other_layout_misses(env: &TrialEnv) -> CaseResult {
    let id = StorageIdentity::single("m");
    isolated(
        env,
        (id.clone(), mha(Layout::PageFirst, 16, PAGES)),
        (id, mha(Layout::PageFirstDirect, 16, PAGES)),
    )
    .await
}

/// B60: another dtype or page size misses.
pub async fn connector_other_dtype_or_page_size_misses(env: &TrialEnv) -> CaseResult {
    let id = StorageIdentity::single("m");
    let g = mha(Layout::PageFirst, 16, PAGES);
    let fp8 = g.with_dtype(Dtype::Fp8E4m3)?;
    isolated(env, (id.clone(), g), (id.clone(), fp8)).await?;
    let ps8 = g.with_page_tokens(8)?;
    isolated(env, (id.clone(), g), (id, ps8)).await
}

/// Pools with the same page size but another shape miss: 2 heads of 64 against 1 of 128
/// and 4 of 32, 4 layers against 2 of twice the tokens, MLA latent 128 against 2 heads of
/// 64 (each pair's pages have equal byte counts, so only the namespace can tell them apart).
pub async fn connector_other_shape_same_page_size_misses(env: &TrialEnv) -> CaseResult {
    let id = StorageIdentity::single("m");
    let shape = |attention, layers, tokens| {
        PoolGeometry::new(
            attention,
            layers,
            Dtype::Bf16,
            tokens,
            Layout::PageFirst,
            PAGES,
        )
    };
    let mha = |kv_heads, head_dim| AttentionKind::Mha { kv_heads, head_dim };
    let base = shape(mha(2, 64), 4, 16)?;
    for other in [
        shape(mha(1, 128), 4, 16)?,
        shape(mha(4, 32), 4, 16)?,
        shape(mha(2, 64), 2, 32)?,
    ] {
        ensure_eq!(other.page_bytes(), base.page_bytes());
        isolated(env, (id.clone(), base), (id.clone(), other)).await?;
    }
    let latent = shape(AttentionKind::Mla { kv_cache_dim: 256 }, 4, 16)?;
    ensure_eq!(latent.page_bytes(), base.page_bytes());
    isolated(env, (id.clone(), base), (id, latent)).await
}
