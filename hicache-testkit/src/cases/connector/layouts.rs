//! Round trips for every layout and transfer mode, with guard pages that must stay
//! untouched, the zero-copy decision and anchor pools.

use std::sync::Arc;

use hicache_core::{
    AnchorPool, HiCache, HostSlots, Layout, MissReason, PoolGeometry, ReadOutcome, StorageIdentity,
    TransferMode,
};

use crate::check::{CaseError, CaseResult, skip};
use crate::fixtures::{fill_page, keys, mha, mla, page_bytes, page_unchanged, snapshot};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{PAGES, all_hits, all_written};

/// Writes pages 0..4, reads them into 6, 8, 9, 11 and checks bytes and the guard pages
/// 4, 5, 7, 10 around them.
pub(super) async fn round_trip(
    env: &TrialEnv,
    cache: &HiCache,
    geometry: PoolGeometry,
) -> Result<TransferMode, CaseError> {
    let pool = env.pool(geometry)?;
    let report = cache.register_pool(pool.clone())?;
    let ks = keys("rt", 4);
    let data: Vec<Vec<u8>> = (0..4)
        .map(|p| fill_page(&pool, p, 100 + p as u32))
        .collect();
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
        .await?;
    ensure!(
        all_written(&set),
        "{} {}: set {set:?}",
        geometry.layout(),
        report.mode
    );
    for p in 4..geometry.pages() {
        fill_page(&pool, p, 7);
    }
    let before = snapshot(&pool);
    let targets = [6u64, 8, 9, 11];
    let got = cache.batch_get(&ks, HostSlots::Pages(&targets)).await?;
    ensure!(
        all_hits(&got),
        "{} {}: get {got:?}",
        geometry.layout(),
        report.mode
    );
    for (i, t) in targets.iter().enumerate() {
        ensure_eq!(
            page_bytes(&pool, *t),
            data[i],
            "{} {}: page {t}",
            geometry.layout(),
            report.mode
        );
    }
    let after = snapshot(&pool);
    for guard in [4u64, 5, 7, 10] {
        ensure!(
            page_unchanged(&geometry, guard, &before, &after),
            "{} {}: guard page {guard} changed",
            geometry.layout(),
            report.mode
        );
    }
    Ok(report.mode)
}

macro_rules! layout_case {
    ($(#[$doc:meta])* $name:ident, $geometry:expr) => {
        $(#[$doc])*
        pub async fn $name(env: &TrialEnv) -> CaseResult {
            let cache = env.default_connector()?;
            round_trip(env, &cache, $geometry).await.map(drop)
        }
    };
}

layout_case!(
    /// MHA `layer_first` round trip with guards.
    connector_round_trip_mha_layer_first,
    mha(Layout::LayerFirst, 16, PAGES)
);
layout_case!(
    /// MHA `page_first` round trip with guards.
    connector_round_trip_mha_page_first,
    mha(Layout::PageFirst, 16, PAGES)
);
layout_case!(
    /// MHA `page_first_direct` round trip with guards.
    connector_round_trip_mha_page_first_direct,
    mha(Layout::PageFirstDirect, 16, PAGES)
);
layout_case!(
    /// MHA `page_head` round trip with guards.
    connector_round_trip_mha_page_head,
    mha(Layout::PageHead, 16, PAGES)
);
layout_case!(
    /// MLA `layer_first` round trip with guards.
    connector_round_trip_mla_layer_first,
    mla(Layout::LayerFirst, 16, PAGES)
);
layout_case!(
    /// MLA `page_first` round trip with guards.
    connector_round_trip_mla_page_first,
    mla(Layout::PageFirst, 16, PAGES)
);
layout_case!(
    /// MLA `page_first_direct` round trip with guards.
    connector_round_trip_mla_page_first_direct,
    mla(Layout::PageFirstDirect, 16, PAGES)
);

pub(super) fn unaligned_geometry(layout: Layout) -> PoolGeometry {
    crate::fixtures::unaligned_mha(layout, PAGES)
}

pub(super) fn needs_alignment(env: &TrialEnv) -> CaseResult {
    let c = env.capability();
    if !c.direct_io || c.io_alignment <= 1 {
        return skip("the backend has no direct-I/O alignment, so every pool moves zero-copy");
    }
    Ok(())
}

/// Bounce slots move pages correctly on every backend: forced by `transfer_mode = bounce`
/// for an aligned pool, and, under direct I/O, chosen for pages whose spans no alignment
/// divides.
pub async fn connector_round_trip_bounce(env: &TrialEnv) -> CaseResult {
    let forced = env.connector(StorageIdentity::single("m"), &[("transfer_mode", "bounce")])?;
    for layout in [Layout::PageFirst, Layout::LayerFirst] {
        let mode = round_trip(env, &forced, mha(layout, 16, PAGES)).await?;
        ensure_eq!(mode, TransferMode::Bounce, "forced, {layout}");
    }
    if needs_alignment(env).is_ok() {
        let cache = env.default_connector()?;
        for layout in [Layout::PageFirst, Layout::LayerFirst] {
            let mode = round_trip(env, &cache, unaligned_geometry(layout)).await?;
            ensure_eq!(mode, TransferMode::Bounce, "unaligned, {layout}");
        }
    }
    Ok(())
}

/// An aligned page-first pool moves zero-copy.
pub async fn connector_aligned_pool_is_zero_copy(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let report = cache.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
    ensure_eq!(report.mode, TransferMode::ZeroCopy, "{}", report.reason);
    Ok(())
}

/// Anchor pools write markers; existence works; get returns hits without host bytes.
pub async fn connector_anchor_pool(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let report = cache.register_pool(Arc::new(AnchorPool::new(mha(
        Layout::PageFirst,
        16,
        PAGES,
    ))?))?;
    ensure_eq!(report.mode, TransferMode::Anchor);
    let ks = keys("an", 3);
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&[0, 1, 2])).await?
    ));
    ensure_eq!(cache.batch_exists(&ks).await?, 3);
    let got = cache.batch_get(&ks, HostSlots::Pages(&[3, 4, 5])).await?;
    ensure!(all_hits(&got), "{got:?}");
    let missing = keys("an-missing", 1);
    let got = cache.batch_get(&missing, HostSlots::Pages(&[0])).await?;
    ensure!(
        matches!(got[0], Ok(ReadOutcome::Miss(MissReason::NotFound))),
        "{got:?}"
    );
    Ok(())
}
