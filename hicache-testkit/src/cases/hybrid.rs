//! Hybrid models (SGLang's v2 interface): sidecar pools beside the KV pool, moved and
//! checked together.
//!
//! The sidecars here are shaped like SGLang's: a Mamba-like pool of two buffers (a
//! page-major temporal state and a conv state with two strided spans per page), a
//! sliding-window pool with K and V spans, and an indexer-like pool of 1000-byte pages that
//! no direct-I/O alignment divides (moved through bounce slots where alignment is needed).

use std::sync::Arc;

use hicache_core::{
    AnchorPool, AttentionKind, BufferLayout, Dtype, Error, ExistsV2, HiCache, HitPolicy, HostPool,
    HostSlots, Layout, MissReason, MmapPool, PageKey, PoolGeometry, PoolId, PoolName, PoolQuery,
    PoolTransfer, ReadOutcome, SetOutcome, SidecarGeometry, SidecarPool, Span, StorageIdentity,
    TransferMode,
};

use crate::check::{CaseError, CaseResult};
use crate::fixtures::{fill_page, keys, mha, page_bytes, pattern};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::connector::{PAGES, all_written};

/// A sidecar pool with host memory the case can fill and read.
struct Side {
    pool: SidecarPool,
    /// One host buffer per sidecar buffer (the pool's memory is theirs).
    backing: Vec<Arc<MmapPool>>,
}

impl Side {
    fn name(&self) -> &PoolName {
        self.pool.name()
    }

    /// Writes `pattern(page_bytes, seed)` over `page`'s spans; returns the flat bytes.
    fn fill(&self, page: u64, seed: u32) -> Vec<u8> {
        let flat = pattern(self.pool.geometry().page_bytes() as usize, seed);
        let mut at = 0;
        for (b, layout) in self.pool.geometry().buffers().iter().enumerate() {
            for s in layout.spans() {
                let off = s.offset + page * layout.page_stride();
                let n = s.len as usize;
                self.backing[b]
                    .write_bytes(off, &flat[at..at + n])
                    .expect("span in buffer");
                at += n;
            }
        }
        flat
    }

    /// The flat bytes of `page`.
    fn page(&self, page: u64) -> Vec<u8> {
        let mut flat = Vec::new();
        for (b, layout) in self.pool.geometry().buffers().iter().enumerate() {
            for s in layout.spans() {
                let mut buf = vec![0; s.len as usize];
                self.backing[b]
                    .read_bytes(s.offset + page * layout.page_stride(), &mut buf)
                    .expect("span in buffer");
                flat.extend(buf);
            }
        }
        flat
    }

    fn transfer<'a>(&'a self, keys: &'a [PageKey], pages: &'a [u64]) -> PoolTransfer<'a> {
        PoolTransfer {
            pool: PoolId::Sidecar(self.name()),
            keys,
            slots: HostSlots::Pages(pages),
        }
    }
}

/// A host buffer of `bytes` from the variant's memory (a one-byte-per-token MLA pool whose
/// region serves as raw bytes).
fn buffer(env: &TrialEnv, bytes: u64) -> Result<Arc<MmapPool>, CaseError> {
    let g = PoolGeometry::new(
        AttentionKind::Mla { kv_cache_dim: 1 },
        1,
        Dtype::Int8,
        1,
        Layout::PageFirst,
        bytes,
    )?;
    env.pool(g).map_err(CaseError::from)
}

fn side(
    env: &TrialEnv,
    name: &str,
    pages: u64,
    layouts: Vec<BufferLayout>,
    replicated: bool,
    format: &str,
) -> Result<Side, CaseError> {
    let g = SidecarGeometry::new(16, pages, layouts, replicated, format)?;
    let backing = (0..g.buffers().len())
        .map(|i| buffer(env, g.buffer_bytes(i).unwrap_or(0)))
        .collect::<Result<Vec<_>, _>>()?;
    let memory = backing
        .iter()
        .map(|b| b.memory().expect("a buffer pool has memory"))
        .collect();
    Ok(Side {
        pool: SidecarPool::new(PoolName::new(name)?, g, memory)?,
        backing,
    })
}

/// Mamba-like: a 4 KiB temporal state per page, and a conv state of two 4 KiB spans per
/// page laid out layer-first (span 1 is `pages` strides after span 0).
fn mamba(env: &TrialEnv, pages: u64, format: &str) -> Result<Side, CaseError> {
    let span = |offset, len| Span { offset, len };
    side(
        env,
        "mamba",
        pages,
        vec![
            BufferLayout::page_major(4096)?,
            BufferLayout::new(4096, vec![span(0, 4096), span(pages * 4096, 4096)])?,
        ],
        false,
        format,
    )
}

/// Sliding-window KV: K and V spans of 8 KiB per page.
fn swa(env: &TrialEnv, pages: u64) -> Result<Side, CaseError> {
    let span = |offset, len| Span { offset, len };
    side(
        env,
        "swa",
        pages,
        vec![BufferLayout::new(
            8192,
            vec![span(0, 8192), span(pages * 8192, 8192)],
        )?],
        false,
        "swa bf16 [2][16][2][128]",
    )
}

/// Indexer-like: 1000-byte pages, replicated across TP ranks.
fn indexer(env: &TrialEnv, pages: u64) -> Result<Side, CaseError> {
    side(
        env,
        "indexer",
        pages,
        vec![BufferLayout::page_major(1000)?],
        true,
        "indexer u8 [1000]",
    )
}

fn kv<'a>(keys: &'a [PageKey], pages: &'a [u64]) -> PoolTransfer<'a> {
    PoolTransfer {
        pool: PoolId::Kv,
        keys,
        slots: HostSlots::Pages(pages),
    }
}

fn hit(r: &Option<hicache_core::Result<ReadOutcome>>) -> bool {
    matches!(r, Some(Ok(ReadOutcome::Hit)))
}

fn hits(row: &[Option<hicache_core::Result<ReadOutcome>>]) -> Vec<bool> {
    row.iter().map(hit).collect()
}

fn all(policy: HitPolicy, pool: &PoolName) -> PoolQuery<'_> {
    PoolQuery { pool, policy }
}

/// KV and three sidecars of different shapes written together and read back byte for byte
/// into other host pages; then a sidecar beside a logical anchor KV pool (markers only), as
/// DeepSeek-V4 keeps them.
pub async fn hybrid_round_trip_every_sidecar_shape(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let sides = [
        mamba(env, PAGES, "mamba f32")?,
        swa(env, PAGES)?,
        indexer(env, PAGES)?,
    ];
    for s in &sides {
        let report = cache.register_sidecar(s.pool.clone())?;
        ensure_eq!(report.page_bytes, s.pool.geometry().page_bytes());
        ensure!(report.writer, "a single rank writes every pool");
    }
    let ks = keys("hy", 4);
    let src: Vec<u64> = (0..4).collect();
    let dst: Vec<u64> = (6..10).collect();
    let kv_bytes: Vec<Vec<u8>> = src.iter().map(|&p| fill_page(&pool, p, p as u32)).collect();
    let side_bytes: Vec<Vec<Vec<u8>>> = sides
        .iter()
        .enumerate()
        .map(|(i, s)| {
            src.iter()
                .map(|&p| s.fill(p, 100 * (i as u32 + 1) + p as u32))
                .collect()
        })
        .collect();
    let mut transfers = vec![kv(&ks, &src)];
    transfers.extend(sides.iter().map(|s| s.transfer(&ks, &src)));
    let written = cache.batch_set_v2(&transfers).await?;
    ensure_eq!(written.len(), 4);
    for row in &written {
        ensure!(all_written(row), "{row:?}");
    }
    let mut reads = vec![kv(&ks, &dst)];
    reads.extend(sides.iter().map(|s| s.transfer(&ks, &dst)));
    let got = cache.batch_get_v2(&reads).await?;
    for (i, row) in got.iter().enumerate() {
        ensure_eq!(hits(row), vec![true; 4], "transfer {i}: {row:?}");
    }
    for (j, &p) in dst.iter().enumerate() {
        ensure_eq!(page_bytes(&pool, p), kv_bytes[j], "KV page {j}");
        for (i, s) in sides.iter().enumerate() {
            ensure_eq!(s.page(p), side_bytes[i][j], "{} page {j}", s.name());
        }
    }
    // DeepSeek-V4's form: a logical anchor KV pool (markers only) with the bytes in sidecars.
    let anchored = env.connector(StorageIdentity::single("anchored"), &[])?;
    let report = anchored.register_pool(Arc::new(AnchorPool::new(mha(
        Layout::PageFirst,
        16,
        PAGES,
    ))?))?;
    ensure_eq!(report.mode, TransferMode::Anchor);
    let m = &sides[0];
    anchored.register_sidecar(m.pool.clone())?;
    let want: Vec<Vec<u8>> = src.iter().map(|&p| m.fill(p, 500 + p as u32)).collect();
    let set = anchored
        .batch_set_v2(&[kv(&ks, &src), m.transfer(&ks, &src)])
        .await?;
    ensure!(set.iter().all(|r| all_written(r)), "{set:?}");
    let found = anchored
        .batch_exists_v2(&ks, &[all(HitPolicy::AllPages, m.name())])
        .await?;
    ensure_eq!((found.kv_hit, found.hit), (4, 4));
    let got = anchored
        .batch_get_v2(&[kv(&ks, &dst), m.transfer(&ks, &dst)])
        .await?;
    ensure_eq!(
        (hits(&got[0]), hits(&got[1])),
        (vec![true; 4], vec![true; 4])
    );
    for (j, &p) in dst.iter().enumerate() {
        ensure_eq!(m.page(p), want[j], "anchored mamba page {j}");
    }
    Ok(())
}

/// A sidecar moves in place exactly when every buffer base, page stride, span offset and
/// span length is a multiple of the backend's direct-I/O alignment (1 without direct I/O);
/// otherwise through bounce slots. Pages come back
/// byte for byte either way, addressed by token indices.
pub async fn hybrid_aligned_sidecars_move_in_place(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    cache.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
    let span = |offset, len| Span { offset, len };
    // (name, stride, span): aligned; a stride of 4608; an offset of 512; a length of 4000.
    let shapes = [
        ("aligned", 8192, span(0, 4096)),
        ("stride_4608", 4608, span(0, 4096)),
        ("offset_512", 8192, span(512, 4096)),
        ("length_4000", 8192, span(0, 4000)),
    ];
    let ks = keys("al", 3);
    let tokens: Vec<u64> = (0..3 * 16).collect();
    let back: Vec<u64> = (5 * 16..8 * 16).collect();
    for (name, stride, sp) in shapes {
        let side = side(
            env,
            name,
            PAGES,
            vec![BufferLayout::new(stride, vec![sp])?],
            false,
            name,
        )?;
        let report = cache.register_sidecar(side.pool.clone())?;
        let align = report.io_alignment.max(1);
        let base = side.pool.memory()[0].addr() as u64;
        // One span and the header: two segments, which every backend takes.
        let fits = [base, stride, sp.offset, sp.len]
            .iter()
            .all(|v| v.is_multiple_of(align));
        let want = if fits {
            TransferMode::ZeroCopy
        } else {
            TransferMode::Bounce
        };
        ensure_eq!(
            report.mode,
            want,
            "{name} at alignment {align}: {}",
            report.reason
        );
        let flat: Vec<Vec<u8>> = (0..3).map(|p| side.fill(p, 7 * p as u32 + 1)).collect();
        let put = PoolTransfer {
            pool: PoolId::Sidecar(side.name()),
            keys: &ks,
            slots: HostSlots::Tokens(&tokens),
        };
        let set = cache.batch_set_v2(&[put]).await?;
        ensure!(all_written(&set[0]), "{name}: {:?}", set[0]);
        let get = PoolTransfer {
            slots: HostSlots::Tokens(&back),
            ..put
        };
        let got = cache.batch_get_v2(&[get]).await?;
        ensure_eq!(hits(&got[0]), vec![true; 3], "{name}");
        for p in 0..3 {
            ensure_eq!(side.page(5 + p), flat[p as usize], "{name} page {p}");
        }
    }
    Ok(())
}

/// Existence checks name a sidecar's objects exactly as its transfers do (SGLang's NIXL
/// backend derives them two ways, so conv-only Mamba, layer-first and K/V pools are written
/// but never found): under hicache and SGLang naming, multi-span pools are found once
/// written and lost when any one of their objects is removed.
pub async fn hybrid_exists_finds_what_transfers_wrote(env: &TrialEnv) -> CaseResult {
    for (naming, format) in [("hicache", "envelope"), ("sglang", "raw")] {
        let cache = env.connector(
            StorageIdentity::single("m"),
            &[("naming", naming), ("page_format", format)],
        )?;
        let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
        cache.register_pool(pool.clone())?;
        let m = mamba(env, PAGES, "mamba f32")?;
        let w = swa(env, PAGES)?;
        let mode = cache.register_sidecar(m.pool.clone())?.mode;
        let swa_mode = cache.register_sidecar(w.pool.clone())?.mode;
        let ks = keys(&format!("ex{naming}"), 5);
        let src = [0, 1, 2];
        for p in src {
            fill_page(&pool, p, p as u32);
            m.fill(p, 7 + p as u32);
            w.fill(p, 17 + p as u32);
        }
        let written = cache
            .batch_set_v2(&[
                kv(&ks[..3], &src),
                m.transfer(&ks[..3], &src),
                w.transfer(&ks[..3], &src),
            ])
            .await?;
        ensure!(
            written.iter().all(|r| all_written(r)),
            "{naming}: {written:?}"
        );
        let names = cache.sidecar_object_names(m.name(), &ks[1])?;
        if naming == "sglang" {
            let text = |pool: &PoolName| -> Result<Vec<String>, CaseError> {
                Ok(cache
                    .sidecar_object_names(pool, &ks[1])?
                    .iter()
                    .map(|n| n.as_str().to_string())
                    .collect())
            };
            let named = |tags: &[&str], pool: &str| -> Vec<String> {
                tags.iter()
                    .map(|t| format!("{}_m_0_1_{pool}{t}", ks[1]))
                    .collect()
            };
            // SGLang names a page per span in zero-copy and as one object otherwise.
            let tags = |mode, zero_copy: &'static [&'static str]| match mode {
                TransferMode::ZeroCopy => zero_copy,
                _ => &[""],
            };
            let mamba_tags = tags(mode, &["_temporal", "_conv_0", "_conv_1"]);
            let swa_tags = tags(swa_mode, &["_k", "_v"]);
            ensure_eq!(text(m.name())?, named(mamba_tags, "mamba"), "Mamba's names");
            ensure_eq!(text(w.name())?, named(swa_tags, "swa"), "SWA's names");
            // One span a page: one object, the pool's name alone (replicated: no TP rank).
            let ix = indexer(env, PAGES)?;
            cache.register_sidecar(ix.pool.clone())?;
            ensure_eq!(text(ix.name())?, vec![format!("{}_m_indexer", ks[1])]);
        }
        let queries = [
            all(HitPolicy::AllPages, m.name()),
            all(HitPolicy::AllPages, w.name()),
        ];
        let found = cache.batch_exists_v2(&ks, &queries).await?;
        ensure_eq!(
            found,
            ExistsV2 {
                kv_hit: 3,
                pool_hits: vec![(m.name().clone(), 3), (w.name().clone(), 3)],
                restorable: vec![1, 2, 3],
                hit: 3,
            },
            "{naming}"
        );
        // Losing the last object of page 1's Mamba state loses the page.
        let last = names.last().expect("a page has objects").clone();
        let removed = cache.backend().remove(std::slice::from_ref(&last)).await;
        ensure!(removed.iter().all(|r| r.is_ok()), "{removed:?}");
        let found = cache.batch_exists_v2(&ks, &queries).await?;
        ensure_eq!(
            (found.pool_hits[0].1, found.hit, found.restorable),
            (1, 1, vec![1]),
            "{naming}: after removing {last}"
        );
    }
    Ok(())
}

/// A sidecar stored for fewer pages than the KV pool: the hit stops where the sidecar
/// does, reads report per page, and a sidecar page is read only within the KV prefix the
/// same call restored.
pub async fn hybrid_partial_sidecar_hits(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let w = swa(env, PAGES)?;
    cache.register_sidecar(w.pool.clone())?;
    let ks = keys("ph", 6);
    let src: Vec<u64> = (0..6).collect();
    for &p in &src {
        fill_page(&pool, p, p as u32);
        w.fill(p, 50 + p as u32);
    }
    let set = cache
        .batch_set_v2(&[kv(&ks, &src), w.transfer(&ks[..3], &src[..3])])
        .await?;
    ensure!(set.iter().all(|r| all_written(r)), "{set:?}");
    let found = cache
        .batch_exists_v2(&ks, &[all(HitPolicy::AllPages, w.name())])
        .await?;
    ensure_eq!(
        (
            found.kv_hit,
            found.pool_hits[0].1,
            found.hit,
            found.restorable
        ),
        (6, 3, 3, vec![1, 2, 3])
    );
    let dst: Vec<u64> = (6..12).collect();
    let got = cache
        .batch_get_v2(&[kv(&ks, &dst), w.transfer(&ks, &dst)])
        .await?;
    ensure_eq!(hits(&got[0]), vec![true; 6]);
    ensure_eq!(hits(&got[1]), vec![true, true, true, false, false, false]);
    ensure!(
        got[1][3..]
            .iter()
            .all(|r| matches!(r, Some(Ok(ReadOutcome::Miss(MissReason::NotFound))))),
        "pages past the sidecar's are misses: {:?}",
        &got[1][3..]
    );
    // KV page 1 gone: the sidecar is read for page 0 only, and its other host pages stay.
    cache.batch_remove(&ks[1..2]).await?;
    let before: Vec<Vec<u8>> = (0..6).map(|p| w.page(p)).collect();
    let got = cache
        .batch_get_v2(&[w.transfer(&ks, &src), kv(&ks, &dst)])
        .await?;
    ensure_eq!(hits(&got[1]), vec![true, false, true, true, true, true]);
    ensure_eq!(hits(&got[0]), vec![true, false, false, false, false, false]);
    ensure!(
        got[0][1..].iter().all(Option::is_none),
        "sidecar pages past the restored KV prefix are not read: {:?}",
        got[0]
    );
    for p in 1..6 {
        ensure_eq!(
            w.page(p),
            before[p as usize],
            "sidecar host page {p} untouched"
        );
    }
    let found = cache
        .batch_exists_v2(&ks, &[all(HitPolicy::AllPages, w.name())])
        .await?;
    ensure_eq!((found.kv_hit, found.hit), (1, 1));
    Ok(())
}

/// A trailing-pages pool restores a prefix when the last `window` pages of it are stored;
/// the restorable set is exactly the prefixes a read restores in full (never one it cannot:
/// SGLang's min-fold claims such prefixes), checked by reading every prefix.
pub async fn hybrid_trailing_pages_restorable_prefix(env: &TrialEnv) -> CaseResult {
    let cache = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let m = mamba(env, PAGES, "mamba f32")?;
    let w = swa(env, PAGES)?;
    cache.register_sidecar(m.pool.clone())?;
    cache.register_sidecar(w.pool.clone())?;
    let ks = keys("tp", 6);
    let src: Vec<u64> = (0..6).collect();
    for &p in &src {
        fill_page(&pool, p, p as u32);
        m.fill(p, 30 + p as u32);
        w.fill(p, 60 + p as u32);
    }
    // KV for all six pages, Mamba state for pages 1, 3 and 4, SWA for pages 0..4.
    let mamba_at = [1u64, 3, 4];
    let mamba_keys: Vec<PageKey> = mamba_at.iter().map(|&p| ks[p as usize].clone()).collect();
    let set = cache
        .batch_set_v2(&[
            kv(&ks, &src),
            m.transfer(&mamba_keys, &mamba_at),
            w.transfer(&ks[..4], &src[..4]),
        ])
        .await?;
    ensure!(set.iter().all(|r| all_written(r)), "{set:?}");
    let trailing = |window| all(HitPolicy::TrailingPages { window }, m.name());
    let cases: [(usize, bool, Vec<usize>); 4] = [
        (1, false, vec![2, 4, 5]),
        (2, false, vec![5]),
        (1, true, vec![2, 4]),
        (2, true, vec![]),
    ];
    for (window, with_swa, want) in cases {
        let mut queries = vec![trailing(window)];
        if with_swa {
            queries.push(all(HitPolicy::AllPages, w.name()));
        }
        let found = cache.batch_exists_v2(&ks, &queries).await?;
        ensure_eq!(found.kv_hit, 6);
        ensure_eq!(found.restorable, want, "window {window}, swa {with_swa}");
        ensure_eq!(found.hit, want.last().copied().unwrap_or(0));
        // Every prefix: the read restores it in full exactly when it is claimed.
        for l in 1..=6usize {
            let window_keys = &ks[l.saturating_sub(window)..l];
            let window_pages: Vec<u64> = (0..window_keys.len() as u64).map(|i| 6 + i).collect();
            let kv_pages: Vec<u64> = (0..l as u64).map(|i| 6 + i).collect();
            let mut reads = vec![
                kv(&ks[..l], &kv_pages),
                m.transfer(window_keys, &window_pages),
            ];
            if with_swa {
                reads.push(w.transfer(&ks[..l], &kv_pages));
            }
            let got = cache.batch_get_v2(&reads).await?;
            let restored = got.iter().all(|row| row.iter().all(hit));
            ensure_eq!(
                restored,
                want.contains(&l),
                "prefix {l}, window {window}, swa {with_swa}: {got:?}"
            );
        }
    }
    Ok(())
}

/// A sidecar registered with another page size, format or span layout never reads the
/// stored pages as its own: its existence finds nothing and its reads miss.
pub async fn hybrid_sidecar_geometry_mismatch_misses(env: &TrialEnv) -> CaseResult {
    let writer = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    writer.register_pool(pool.clone())?;
    let m = mamba(env, PAGES, "mamba f32")?;
    writer.register_sidecar(m.pool.clone())?;
    let ks = keys("gm", 3);
    let src = [0, 1, 2];
    for p in src {
        fill_page(&pool, p, p as u32);
        m.fill(p, 90 + p as u32);
    }
    let set = writer
        .batch_set_v2(&[kv(&ks, &src), m.transfer(&ks, &src)])
        .await?;
    ensure!(set.iter().all(|r| all_written(r)), "{set:?}");
    let span = |offset, len| Span { offset, len };
    let mut other_page_size = mamba(env, PAGES, "mamba f32")?;
    let g = other_page_size.pool.geometry();
    other_page_size.pool = SidecarPool::new(
        PoolName::new("mamba")?,
        SidecarGeometry::new(8, PAGES, g.buffers().to_vec(), false, "mamba f32")?,
        other_page_size.pool.memory().to_vec(),
    )?;
    let others = [
        other_page_size,
        mamba(env, PAGES, "mamba bf16")?,
        side(
            env,
            "mamba",
            PAGES,
            vec![
                BufferLayout::page_major(4096)?,
                BufferLayout::new(8192, vec![span(0, 8192)])?,
            ],
            false,
            "mamba f32",
        )?,
    ];
    for other in &others {
        let reader = env.default_connector()?;
        reader.register_pool(env.pool(mha(Layout::PageFirst, 16, PAGES))?)?;
        reader.register_sidecar(other.pool.clone())?;
        let found = reader
            .batch_exists_v2(&ks, &[all(HitPolicy::AllPages, other.name())])
            .await?;
        ensure_eq!(
            (found.kv_hit, found.pool_hits[0].1, found.hit),
            (3, 0, 0),
            "format {:?}",
            other.pool.geometry().format()
        );
        let got = reader.batch_get_v2(&[other.transfer(&ks, &src)]).await?;
        ensure!(
            !got[0].iter().any(hit),
            "a sidecar of another geometry read stored pages: {:?}",
            got[0]
        );
    }
    Ok(())
}

/// More than 128 pages in one v2 call, with staging smaller than the call: every pool is
/// chunked (SGLang's bounce path fails such calls).
pub async fn hybrid_batches_above_128_pages(env: &TrialEnv) -> CaseResult {
    const N: u64 = 300;
    let mut options = hicache_core::HiCacheOptions::new(StorageIdentity::single("m"));
    options.staging_chunk_bytes = 64 << 10;
    let cache = env.connector_with_options(options)?;
    let g = PoolGeometry::new(
        AttentionKind::Mla { kv_cache_dim: 64 },
        1,
        Dtype::Bf16,
        16,
        Layout::PageFirst,
        N,
    )?;
    let pool = env.pool(g)?;
    cache.register_pool(pool.clone())?;
    let ix = indexer(env, N)?;
    cache.register_sidecar(ix.pool.clone())?;
    let ks = keys("big", N as usize);
    let src: Vec<u64> = (0..N).collect();
    let mut want = Vec::new();
    for &p in &src {
        fill_page(&pool, p, p as u32);
        want.push(ix.fill(p, 1000 + p as u32));
    }
    let set = cache
        .batch_set_v2(&[kv(&ks, &src), ix.transfer(&ks, &src)])
        .await?;
    ensure!(set.iter().all(|r| all_written(r)), "write of {N} pages");
    for &p in &src {
        ix.fill(p, 0);
    }
    let found = cache
        .batch_exists_v2(&ks, &[all(HitPolicy::AllPages, ix.name())])
        .await?;
    ensure_eq!(found.hit, N as usize);
    let got = cache.batch_get_v2(&[ix.transfer(&ks, &src)]).await?;
    ensure_eq!(hits(&got[0]), vec![true; N as usize]);
    for &p in &src {
        ensure_eq!(ix.page(p), want[p as usize], "indexer page {p}");
    }
    Ok(())
}

/// Calls that cannot be served are refused whole, before any I/O: a pool never registered,
/// two KV transfers, a window of 0, host pages outside a sidecar; a rank that does not
/// write a replicated sidecar skips it while writing its own sharded one.
pub async fn hybrid_bad_calls_are_refused_before_io(env: &TrialEnv) -> CaseResult {
    let identity = StorageIdentity {
        tp_rank: 1,
        tp_size: 2,
        ..StorageIdentity::single("m")
    };
    let cache = env.connector(identity, &[])?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let ix = indexer(env, PAGES)?;
    let w = swa(env, PAGES)?;
    cache.register_sidecar(ix.pool.clone())?;
    let ks = keys("bad", 2);
    let src = [0, 1];
    let ghost = PoolName::new("ghost")?;
    let unregistered = PoolTransfer {
        pool: PoolId::Sidecar(&ghost),
        keys: &ks,
        slots: HostSlots::Pages(&src),
    };
    let outside = [0, PAGES];
    let refused = [
        cache
            .batch_set_v2(&[kv(&ks, &src), unregistered])
            .await
            .err(),
        cache
            .batch_set_v2(&[kv(&ks, &src), kv(&ks, &src)])
            .await
            .err(),
        cache
            .batch_set_v2(&[kv(&ks, &src), ix.transfer(&ks, &outside)])
            .await
            .err(),
        cache
            .batch_exists_v2(
                &ks,
                &[all(HitPolicy::TrailingPages { window: 0 }, ix.name())],
            )
            .await
            .err(),
        cache
            .batch_exists_v2(&ks, &[all(HitPolicy::AllPages, w.name())])
            .await
            .err(),
    ];
    for (i, e) in refused.iter().enumerate() {
        ensure!(
            matches!(e, Some(Error::InvalidBatch { .. })),
            "call {i} should be refused: {e:?}"
        );
    }
    ensure!(
        refused[0].as_ref().unwrap().to_string().contains("ghost"),
        "the error names the pool: {:?}",
        refused[0]
    );
    ensure!(
        refused[2]
            .as_ref()
            .unwrap()
            .to_string()
            .contains("pool indexer: host page"),
        "the error names the pool and the page: {:?}",
        refused[2]
    );
    ensure_eq!(
        cache.batch_exists(&ks).await?,
        0,
        "a refused call wrote nothing"
    );
    // TP rank 1 of 2: the replicated indexer is rank 0's to write, SWA is this rank's.
    cache.register_sidecar(w.pool.clone())?;
    let set = cache
        .batch_set_v2(&[ix.transfer(&ks, &src), w.transfer(&ks, &src)])
        .await?;
    ensure!(
        set[0]
            .iter()
            .all(|r| matches!(r, Ok(SetOutcome::SkippedNotWriter))),
        "{:?}",
        set[0]
    );
    ensure!(all_written(&set[1]), "{:?}", set[1]);
    ensure!(
        HiCache::sidecar_report(&cache, ix.name()).is_some_and(|r| !r.writer),
        "the report says this rank does not write the replicated pool"
    );
    Ok(())
}
