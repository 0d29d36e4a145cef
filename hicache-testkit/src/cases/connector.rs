//! Cases through the connector (`HiCache`) over the plugin: layouts, modes, naming,
//! existence semantics, isolation, integrity and concurrency: the behaviours SGLang's
//! storage backends show its controller.

use std::sync::Arc;

use hicache_core::raw::{ObjectKey, ReadItem, WriteItem};
use hicache_core::{
    AnchorPool, AttentionKind, Dtype, Error, HiCache, HiCacheOptions, HostSlots, Layout,
    MissReason, MmapPool, NamingScheme, PageKey, PoolGeometry, ReadOutcome, SetOutcome,
    StorageIdentity, TransferMode,
};

use crate::cases::backend::{block, buffer};
use crate::check::{CaseError, CaseResult, only, per_item, skip};
use crate::fixtures::{fill_page, keys, mha, mla, page_bytes, page_unchanged, pool, snapshot};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

const PAGES: u64 = 12;

fn all_hits(r: &[hicache_core::Result<ReadOutcome>]) -> bool {
    r.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit)))
}

fn all_written(r: &[hicache_core::Result<SetOutcome>]) -> bool {
    r.iter().all(|r| matches!(r, Ok(SetOutcome::Written)))
}

/// Writes pages 0..4, reads them into 6, 8, 9, 11 and checks bytes and the guard pages
/// 4, 5, 7, 10 around them.
async fn round_trip(cache: &HiCache, geometry: PoolGeometry) -> Result<TransferMode, CaseError> {
    let pool = pool(geometry);
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
            round_trip(&cache, $geometry).await.map(drop)
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

fn unaligned_geometry(layout: Layout) -> PoolGeometry {
    crate::fixtures::unaligned_mha(layout, PAGES)
}

fn needs_alignment(env: &TrialEnv) -> CaseResult {
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
        let mode = round_trip(&forced, mha(layout, 16, PAGES)).await?;
        ensure_eq!(mode, TransferMode::Bounce, "forced, {layout}");
    }
    if needs_alignment(env).is_ok() {
        let cache = env.default_connector()?;
        for layout in [Layout::PageFirst, Layout::LayerFirst] {
            let mode = round_trip(&cache, unaligned_geometry(layout)).await?;
            ensure_eq!(mode, TransferMode::Bounce, "unaligned, {layout}");
        }
    }
    Ok(())
}

/// An aligned page-first pool moves zero-copy.
pub async fn connector_aligned_pool_is_zero_copy(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let report = cache.register_pool(pool(mha(Layout::PageFirst, 16, PAGES)))?;
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

/// B1: `batch_exists([])` is 0.
pub async fn connector_exists_empty_is_zero(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(pool(mha(Layout::PageFirst, 16, PAGES)))?;
    ensure_eq!(cache.batch_exists(&[]).await?, 0);
    Ok(())
}

async fn exists_fixture(
    env: &TrialEnv,
    stored: &[usize],
) -> Result<(HiCache, Vec<PageKey>), CaseError> {
    let cache = env.default_connector()?;
    cache.register_pool(pool(mha(Layout::PageFirst, 16, PAGES)))?;
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

/// B11/B14: one result per page; misses inside a batch are per page.
pub async fn connector_misses_are_per_page(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let pool = pool(mha(Layout::PageFirst, 16, PAGES));
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
    cache.register_pool(pool(mha(Layout::PageFirst, 16, PAGES)))?;
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
    cache.register_pool(pool(mha(Layout::PageFirst, 4, PAGES)))?;
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
    bounce_miss(&forced, mha(Layout::PageFirst, 16, PAGES), "bu-forced").await?;
    if needs_alignment(env).is_ok() {
        let cache = env.default_connector()?;
        bounce_miss(&cache, unaligned_geometry(Layout::PageFirst), "bu").await?;
    }
    Ok(())
}

async fn bounce_miss(cache: &HiCache, geometry: PoolGeometry, prefix: &str) -> CaseResult {
    let pool = pool(geometry);
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

/// B17: an MLA rank other than the writer skips writes and says so; nothing is stored.
pub async fn connector_mla_non_writer_skips(env: &TrialEnv) -> CaseResult {
    let identity = StorageIdentity {
        tp_rank: 2,
        tp_size: 4,
        ..StorageIdentity::single("ds")
    };
    let cache = env.connector(identity, &[])?;
    let report = cache.register_pool(pool(mla(Layout::PageFirst, 16, PAGES)))?;
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
    let wpool = pool(mla(Layout::PageFirst, 16, PAGES));
    writer.register_pool(wpool.clone())?;
    let ks = keys("ms", 1);
    let data = fill_page(&wpool, 0, 5);
    ensure!(all_written(
        &writer.batch_set(&ks, HostSlots::Pages(&[0])).await?
    ));
    for (r, s) in [(2, 4), (0, 8)] {
        let reader = env.connector(id(r, s), &[])?;
        let rpool = pool(mla(Layout::PageFirst, 16, PAGES));
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
    let wpool = pool(writer.1);
    w.register_pool(wpool.clone())?;
    let ks = keys("iso", 1);
    fill_page(&wpool, 0, 6);
    ensure!(all_written(
        &w.batch_set(&ks, HostSlots::Pages(&[0])).await?
    ));
    let r = env.connector(reader.0, &[])?;
    r.register_pool(pool(reader.1))?;
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

/// B21 (fixed): far more than 128 pages in one call are chunked, not failed.
pub async fn connector_batches_above_128_pages(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let geometry = mha(Layout::PageFirst, 4, 400);
    let pool = pool(geometry);
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
    let pool = pool(mha(Layout::PageFirst, 16, PAGES));
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

/// B25/B26: prefetch (get), backup (set) and existence threads at once, 10k operations,
/// overlapping keys; every hit has the right bytes.
pub async fn connector_three_threads_10k_ops(env: &TrialEnv) -> CaseResult {
    let cache = Arc::new(env.default_connector()?);
    let geometry = mha(Layout::PageFirst, 2, 64);
    let pool = pool(geometry);
    cache.register_pool(pool.clone())?;
    let ks = keys("cc", 16);
    // A key's content depends only on the key, so concurrent writers of one key agree.
    let expected: Vec<Vec<u8>> = (0..16)
        .map(|i| fill_page(&pool, i, 500 + i as u32))
        .collect();
    let ops: u64 = std::env::var("HICACHE_TEST_CONCURRENCY_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
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
    let pool = pool(mha(Layout::PageFirst, 16, 32));
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

/// Reads an object's raw bytes through the backend (used to corrupt it portably).
async fn raw_object(
    cache: &HiCache,
    env: &TrialEnv,
    name: &ObjectKey,
    len: u64,
) -> Result<Vec<u8>, CaseError> {
    let b = cache.backend();
    let buf = buffer(b, len.max(block(env)))?;
    let segs = [buf.slice(0, len)];
    let r = b
        .read(&[ReadItem {
            key: name,
            segments: &segs,
        }])
        .await;
    let r = only("read", r)?;
    ensure!(
        matches!(r, Ok(ReadOutcome::Hit)),
        "raw read of {name}: {r:?}"
    );
    buf.read(0, len)
}

async fn put_raw(cache: &HiCache, env: &TrialEnv, name: &ObjectKey, bytes: &[u8]) -> CaseResult {
    let b = cache.backend();
    let buf = buffer(b, (bytes.len() as u64).max(block(env)))?;
    buf.fill(0, bytes)?;
    let segs = [buf.slice(0, bytes.len() as u64)];
    let r = b
        .write(&[WriteItem {
            key: name,
            segments: &segs,
        }])
        .await;
    let r = only("write", r)?;
    ensure!(r.is_ok(), "raw write of {name}: {r:?}");
    Ok(())
}

/// Stored object size of a page under the default (envelope) format.
fn stored_len(cache: &HiCache) -> u64 {
    cache
        .pool_report()
        .map(|r| r.stored_bytes_per_page / r.objects_per_page)
        .unwrap_or(0)
}

async fn corruption_fixture(
    env: &TrialEnv,
) -> Result<(HiCache, Arc<MmapPool>, Vec<PageKey>), CaseError> {
    let cache = env.default_connector()?;
    let pool = pool(mha(Layout::PageFirst, 16, PAGES));
    cache.register_pool(pool.clone())?;
    let ks = keys("cr", 2);
    fill_page(&pool, 0, 11);
    fill_page(&pool, 1, 12);
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&[0, 1])).await?
    ));
    Ok((cache, pool, ks))
}

/// A bit flipped in a stored payload reads as a checksum miss, never as data.
pub async fn connector_bit_flip_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let name = cache.object_names(&ks[0])?.remove(0);
    let len = stored_len(&cache);
    let mut bytes = raw_object(&cache, env, &name, len).await?;
    let at = bytes.len() - 777;
    bytes[at] ^= 0x20;
    put_raw(&cache, env, &name, &bytes).await?;
    let got = cache.batch_get(&ks, HostSlots::Pages(&[4, 5])).await?;
    ensure_eq!(
        got[0].as_ref().ok(),
        Some(&ReadOutcome::Miss(MissReason::ChecksumMismatch))
    );
    ensure!(matches!(got[1], Ok(ReadOutcome::Hit)));
    ensure_eq!(cache.stats().pages_invalid, 1);
    Ok(())
}

/// A truncated object reads as a size miss.
pub async fn connector_truncated_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let name = cache.object_names(&ks[0])?.remove(0);
    let len = stored_len(&cache);
    let bytes = raw_object(&cache, env, &name, len).await?;
    let cut = len - block(env);
    put_raw(&cache, env, &name, &bytes[..cut as usize]).await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure!(
        matches!(
            got[0],
            Ok(ReadOutcome::Miss(MissReason::SizeMismatch { .. }))
        ),
        "{got:?}"
    );
    Ok(())
}

/// Another key's object under this key's name is caught by the header.
pub async fn connector_misplaced_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let (n0, n1) = (
        cache.object_names(&ks[0])?.remove(0),
        cache.object_names(&ks[1])?.remove(0),
    );
    let len = stored_len(&cache);
    let other = raw_object(&cache, env, &n1, len).await?;
    put_raw(&cache, env, &n0, &other).await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure_eq!(
        got[0].as_ref().ok(),
        Some(&ReadOutcome::Miss(MissReason::KeyMismatch))
    );
    Ok(())
}

/// An object written by another namespace, copied under this namespace's name, is caught.
pub async fn connector_foreign_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let other = env.connector(StorageIdentity::single("another-model"), &[])?;
    let opool = pool(mha(Layout::PageFirst, 16, PAGES));
    other.register_pool(opool.clone())?;
    fill_page(&opool, 0, 99);
    ensure!(all_written(
        &other.batch_set(&ks[..1], HostSlots::Pages(&[0])).await?
    ));
    let foreign = raw_object(
        &other,
        env,
        &other.object_names(&ks[0])?.remove(0),
        stored_len(&other),
    )
    .await?;
    put_raw(
        &cache,
        env,
        &cache.object_names(&ks[0])?.remove(0),
        &foreign,
    )
    .await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure_eq!(
        got[0].as_ref().ok(),
        Some(&ReadOutcome::Miss(MissReason::ForeignNamespace))
    );
    Ok(())
}

/// Garbage of the right length (no header) is a bad-header miss.
pub async fn connector_garbage_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let name = cache.object_names(&ks[0])?.remove(0);
    let len = stored_len(&cache);
    put_raw(
        &cache,
        env,
        &name,
        &crate::fixtures::pattern(len as usize, 77),
    )
    .await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure!(
        matches!(got[0], Ok(ReadOutcome::Miss(MissReason::BadHeader { .. }))),
        "{got:?}"
    );
    Ok(())
}

/// SGLang naming with raw pages: `_k`/`_v` objects holding exactly the K and V bytes.
pub async fn connector_sglang_naming_raw_pages(env: &TrialEnv) -> CaseResult {
    let identity = StorageIdentity {
        tp_rank: 0,
        tp_size: 2,
        ..StorageIdentity::single("Qwen/Qwen3-8B")
    };
    let cache = env.connector(identity, &[("naming", "sglang"), ("page_format", "raw")])?;
    let pool = pool(mha(Layout::PageFirst, 16, PAGES));
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
    let pool = pool(mha(Layout::PageFirst, 16, PAGES));
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
    round_trip(&cache, mha(Layout::PageFirst, 16, PAGES))
        .await
        .map(drop)
}

/// A pool registered twice replaces the first registration.
pub async fn connector_reregister_pool(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(pool(mha(Layout::PageFirst, 16, PAGES)))?;
    let mode = round_trip(&cache, mha(Layout::PageFirstDirect, 16, PAGES)).await?;
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
    let pool = pool(geometry);
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
