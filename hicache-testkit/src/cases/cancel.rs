//! Cancellation: batch futures dropped at any point (timeouts, `select!`) never let a later
//! call see or reuse memory that an abandoned transfer still uses, and never let a
//! deregistration release memory under a transfer.
//!
//! The rule every plugin follows: once a dropped `read`/`write` future has finished
//! dropping, no byte of its target memory changes any more, and an abandoned write either
//! published a whole object or nothing. Memory an abandoned write still *reads* (an HTTP
//! body being sent) stays pinned, so it cannot be overwritten or freed under the transfer.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hicache_core::raw::{Access, ObjectKey, ReadItem, Slice, WriteItem};
use hicache_core::{
    Error, HiCache, HiCacheOptions, HostPool, HostSlots, Layout, MmapPool, PoolGeometry,
    ReadOutcome, SetOutcome, StorageIdentity, TransferMode, gather_page, scatter_page,
};

use crate::cases::backend::{Buf, block, buffer, key};
use crate::check::{CaseError, CaseResult};
use crate::fixtures::{keys, mha, pattern};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

/// Keys the random workload writes and reads.
const KEYS: usize = 8;
/// Host pages: 0..8 sources (key i writes from page i), 8..16 guards, 16..40 read targets,
/// 40..48 guards.
const POOL_PAGES: u64 = 48;
const TARGETS: std::ops::Range<u64> = 16..40;
const GUARDS: [std::ops::Range<u64>; 2] = [8..16, 40..48];

/// A small deterministic generator (xorshift64*): runs repeat for a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// How a call is abandoned.
#[derive(Clone, Copy, Debug)]
enum Cancel {
    /// Runs to the end.
    No,
    /// `tokio::time::timeout` of this many microseconds.
    Timeout(u64),
    /// `select!` against a branch that yields this many times.
    Select(u64),
}

/// Runs `fut` under `how`; `None` when it was dropped before finishing.
async fn run<F: Future>(fut: F, how: Cancel) -> Option<F::Output> {
    match how {
        Cancel::No => Some(fut.await),
        Cancel::Timeout(us) => tokio::time::timeout(Duration::from_micros(us), fut)
            .await
            .ok(),
        Cancel::Select(yields) => {
            // The canceller is polled first: with 0 yields the call is dropped before it ever
            // runs, with more it runs between the yields.
            tokio::select! {
                biased;
                _ = async { for _ in 0..yields { tokio::task::yield_now().await } } => None,
                out = fut => Some(out),
            }
        }
    }
}

/// Fills a host page, waiting for a transfer that still reads it (an abandoned write whose
/// body is in flight) rather than overwriting bytes under it.
async fn fill(pool: &MmapPool, page: u64, bytes: &[u8]) -> Result<(), CaseError> {
    let geometry = *pool.geometry();
    let memory = pool
        .memory()
        .ok_or_else(|| CaseError::Failed("an mmap pool without memory".into()))?;
    loop {
        match scatter_page(pool, page, bytes) {
            Err(Error::MemoryBusy { .. }) => {
                for span in geometry.page_spans(page)? {
                    memory
                        .wait_available(span.offset, span.len, Access::Write)
                        .await;
                }
            }
            other => return other.map_err(Into::into),
        }
    }
}

/// A host page's bytes; a page still pinned by a transfer after every call returned is a
/// failure (the transfer outlived its call).
fn page_of(pool: &MmapPool, page: u64) -> Result<Vec<u8>, CaseError> {
    let mut out = vec![0; pool.geometry().page_bytes() as usize];
    gather_page(pool, page, &mut out).map_err(|e| {
        CaseError::Failed(format!(
            "host page {page} is unreadable after its calls returned: {e}"
        ))
    })?;
    Ok(out)
}

/// The whole pool; failing (not panicking) while a transfer still pins part of it.
fn whole(pool: &MmapPool) -> Result<Vec<u8>, CaseError> {
    let mut out = vec![0; pool.geometry().pool_bytes() as usize];
    pool.read_bytes(0, &mut out).map_err(|e| {
        CaseError::Failed(format!(
            "the pool is unreadable after every call returned: {e}"
        ))
    })?;
    Ok(out)
}

/// What a key may hold: the last completed write and the abandoned ones after it.
#[derive(Clone, Debug, Default)]
struct KeyState {
    last: Option<u32>,
    maybe: HashSet<u32>,
}

impl KeyState {
    fn accepts(&self, bytes: &[u8], page_bytes: usize) -> bool {
        self.last
            .iter()
            .chain(self.maybe.iter())
            .any(|seed| pattern(page_bytes, *seed) == bytes)
    }
}

/// The random workload: writes and reads of a few keys, half of them under a timeout or
/// `select!` that drops them at a random point if still pending, then checks that every hit holds bytes some write of that key really wrote
/// (the last completed one, or an abandoned one after it), that completed writes are never
/// lost, that pages no call touched are intact, and that no call ever failed (two transfers
/// on the same staging or host bytes would be a `MemoryBusy` error, not a silent race).
async fn workload(
    env: &TrialEnv,
    format: &str,
    geometry: PoolGeometry,
    naming: &str,
) -> CaseResult {
    let config = env
        .config()
        .set("page_format", format)
        .set("naming", naming)
        .load()?;
    // Few slots per staging chunk: batches span several chunks and backend calls, so drops
    // land between chunks as well as inside them.
    let options =
        HiCacheOptions::new(StorageIdentity::single("cancel")).with_max_slots_per_chunk(2);
    let cache = Arc::new(HiCache::with_backend(env.backend()?, config, options)?);
    let pool = env.pool(geometry)?;
    let report = cache.register_pool(pool.clone())?;
    let page_bytes = geometry.page_bytes() as usize;
    let ks = keys("cx", KEYS);
    let mut state = vec![KeyState::default(); KEYS];
    let mut guard_seed = 90_000;
    for range in GUARDS {
        for p in range {
            guard_seed += 1;
            fill(&pool, p, &pattern(page_bytes, guard_seed)).await?;
        }
    }
    let guards_before = whole(&pool)?;
    let seed = 0x9e37_79b9_7f4a_7c15 ^ (format.len() as u64) ^ (page_bytes as u64);
    let mut rng = Rng(seed);
    let mut next_seed = 1u32;
    let (mut abandoned, mut finished) = (0u64, 0u64);
    // At least `ops` calls, and more (up to 4×) until a quarter of `ops` were dropped while
    // pending, so fast plugins see their share of drops too. A plugin that finishes most calls
    // within their first poll (fewer than 1 in 10 dropped) can only be dropped before it
    // starts; more calls would add nothing.
    let ops = env.cancel_ops();
    let mut op = 0u64;
    while op < ops || (abandoned < ops / 4 && op < 4 * ops && abandoned * 10 >= op) {
        op += 1;
        let how = match rng.below(4) {
            0 | 1 => Cancel::No,
            2 => Cancel::Timeout(rng.below(400)),
            _ => Cancel::Select(rng.below(6)),
        };
        let n = 1 + rng.below(4) as usize;
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < n {
            let k = rng.below(KEYS as u64) as usize;
            if !picked.contains(&k) {
                picked.push(k);
            }
        }
        let batch: Vec<_> = picked.iter().map(|&k| ks[k].clone()).collect();
        if rng.below(2) == 0 {
            // Write: each key from its own source page, with a fresh pattern.
            let mut seeds = Vec::new();
            for &k in &picked {
                let s = next_seed;
                next_seed += 1;
                fill(&pool, k as u64, &pattern(page_bytes, s)).await?;
                seeds.push(s);
            }
            let pages: Vec<u64> = picked.iter().map(|&k| k as u64).collect();
            match run(cache.batch_set(&batch, HostSlots::Pages(&pages)), how).await {
                Some(results) => {
                    finished += 1;
                    for ((&k, s), r) in picked.iter().zip(&seeds).zip(results?) {
                        ensure!(
                            matches!(r, Ok(SetOutcome::Written)),
                            "op {op} (seed {seed:#x}): set of key {k} failed: {r:?}"
                        );
                        state[k] = KeyState {
                            last: Some(*s),
                            maybe: HashSet::new(),
                        };
                    }
                }
                None => {
                    abandoned += 1;
                    for (&k, s) in picked.iter().zip(&seeds) {
                        state[k].maybe.insert(*s);
                    }
                }
            }
        } else {
            let mut targets: Vec<u64> = Vec::new();
            while targets.len() < n {
                let t = TARGETS.start + rng.below(TARGETS.end - TARGETS.start);
                if !targets.contains(&t) {
                    targets.push(t);
                }
            }
            match run(cache.batch_get(&batch, HostSlots::Pages(&targets)), how).await {
                Some(results) => {
                    finished += 1;
                    for ((&k, &t), r) in picked.iter().zip(&targets).zip(results?) {
                        let st = &state[k];
                        match r {
                            Ok(ReadOutcome::Hit) => ensure!(
                                st.accepts(&page_of(&pool, t)?, page_bytes),
                                "op {op} (seed {seed:#x}): key {k} read into page {t} holds bytes no write of it wrote ({st:?})"
                            ),
                            Ok(ReadOutcome::Miss(reason)) => ensure!(
                                st.last.is_none() && !reason.is_invalid_object(),
                                "op {op} (seed {seed:#x}): key {k} missed ({reason}) after a completed write ({st:?})"
                            ),
                            Err(e) => {
                                return Err(CaseError::Failed(format!(
                                    "op {op} (seed {seed:#x}): get of key {k} failed: {e}"
                                )));
                            }
                        }
                    }
                }
                None => {
                    abandoned += 1;
                    // Once the dropped call has returned, nothing may write its pages.
                    let before = targets
                        .iter()
                        .map(|&t| page_of(&pool, t))
                        .collect::<Result<Vec<_>, _>>()?;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    for (t, b) in targets.iter().zip(before) {
                        ensure!(
                            page_of(&pool, *t)? == b,
                            "op {op} (seed {seed:#x}): host page {t} changed after its get was dropped"
                        );
                    }
                }
            }
        }
    }
    // Every key, read once more without cancellation; existence never counts what a read
    // would reject.
    for (k, st) in state.iter().enumerate() {
        let one = std::slice::from_ref(&ks[k]);
        let exists = cache.batch_exists(one).await? == 1;
        let got = cache
            .batch_get(one, HostSlots::Pages(&[TARGETS.start]))
            .await?;
        match &got[0] {
            Ok(ReadOutcome::Hit) => ensure!(
                st.accepts(&page_of(&pool, TARGETS.start)?, page_bytes),
                "final read of key {k} holds bytes no write of it wrote ({st:?})"
            ),
            Ok(ReadOutcome::Miss(reason)) => {
                ensure!(
                    st.last.is_none(),
                    "final read of key {k}: miss ({reason}) after a completed write"
                );
                ensure!(
                    !exists,
                    "key {k} is counted by exists but reads as a miss ({reason})"
                );
            }
            Err(e) => return Err(CaseError::Failed(format!("final read of key {k}: {e}"))),
        }
    }
    let after = whole(&pool)?;
    for range in GUARDS {
        for p in range {
            ensure!(
                crate::fixtures::page_unchanged(&geometry, p, &guards_before, &after),
                "guard page {p} changed ({} mode)",
                report.mode
            );
        }
    }
    ensure!(
        abandoned > 0 && finished > 0,
        "the workload abandoned {abandoned} and finished {finished} calls; both must happen"
    );
    eprintln!(
        "cancel workload ({} {format}, {} mode): {finished} calls finished, {abandoned} dropped before they finished",
        env.plugin(),
        report.mode
    );
    cache.unregister_pool().await;
    ensure_eq!(
        pool.memory().map_or(0, |m| m.in_flight()),
        0,
        "pins left on the pool after unregister_pool"
    );
    Ok(())
}

/// Dropped calls over a zero-copy pool with enveloped pages.
pub async fn cancel_dropped_calls_envelope_zero_copy(env: &TrialEnv) -> CaseResult {
    workload(
        env,
        "envelope",
        mha(Layout::PageFirst, 16, POOL_PAGES),
        "hicache",
    )
    .await
}

/// Dropped calls over a zero-copy pool with raw pages (no checksum to hide a wrong byte).
pub async fn cancel_dropped_calls_raw_zero_copy(env: &TrialEnv) -> CaseResult {
    workload(
        env,
        "raw",
        mha(Layout::PageFirst, 16, POOL_PAGES),
        "hicache",
    )
    .await
}

/// Dropped calls over a bounce pool (SGLang naming of a `layer_first` pool stages every
/// page) with enveloped pages.
pub async fn cancel_dropped_calls_envelope_bounce(env: &TrialEnv) -> CaseResult {
    bounce(env, "envelope").await
}

/// Dropped calls over a bounce pool with raw pages.
pub async fn cancel_dropped_calls_raw_bounce(env: &TrialEnv) -> CaseResult {
    bounce(env, "raw").await
}

async fn bounce(env: &TrialEnv, format: &str) -> CaseResult {
    let geometry = mha(Layout::LayerFirst, 16, POOL_PAGES);
    // Checked, not assumed: the pool must really bounce.
    let probe = HiCache::with_backend(
        env.backend()?,
        env.config().set("naming", "sglang").load()?,
        HiCacheOptions::new(StorageIdentity::single("probe")),
    )?;
    let mode = probe.register_pool(env.pool(geometry)?)?.mode;
    ensure_eq!(mode, TransferMode::Bounce);
    probe.close();
    workload(env, format, geometry, "sglang").await
}

/// `unregister_pool` racing calls in flight returns only once no transfer uses the pool;
/// afterwards the memory is the caller's: nothing writes it.
pub async fn cancel_unregister_waits_for_in_flight(env: &TrialEnv) -> CaseResult {
    let cache = Arc::new(env.default_connector()?);
    let geometry = mha(Layout::PageFirst, 16, 64);
    let pool = env.pool(geometry)?;
    cache.register_pool(pool.clone())?;
    let ks = keys("ur", 32);
    let src: Vec<u64> = (0..32).collect();
    let dst: Vec<u64> = (32..64).collect();
    for p in 0..32 {
        fill(
            &pool,
            p,
            &pattern(geometry.page_bytes() as usize, 7000 + p as u32),
        )
        .await?;
    }
    let set = cache.batch_set(&ks, HostSlots::Pages(&src)).await?;
    ensure!(set.iter().all(|r| r.is_ok()), "{set:?}");
    for round in 0..20u64 {
        cache.register_pool(pool.clone())?;
        let reader = {
            let (cache, ks, dst) = (cache.clone(), ks.clone(), dst.clone());
            tokio::spawn(async move { cache.batch_get(&ks, HostSlots::Pages(&dst)).await })
        };
        for _ in 0..round % 4 {
            tokio::task::yield_now().await;
        }
        cache.unregister_pool().await;
        let memory = pool
            .memory()
            .ok_or_else(|| CaseError::Failed("an mmap pool without memory".into()))?;
        ensure_eq!(
            memory.in_flight(),
            0,
            "round {round}: pins after unregister_pool"
        );
        let before = whole(&pool)?;
        tokio::time::sleep(Duration::from_millis(3)).await;
        ensure!(
            whole(&pool)? == before,
            "round {round}: the pool changed after unregister_pool returned"
        );
        match reader.await {
            Ok(Ok(results)) => ensure!(
                results.iter().all(|r| r.is_ok()),
                "round {round}: a get that ran before unregistering failed: {results:?}"
            ),
            Ok(Err(Error::PoolNotRegistered)) => {}
            Ok(Err(e)) => return Err(CaseError::Failed(format!("round {round}: {e}"))),
            Err(e) => return Err(CaseError::Failed(format!("round {round}: task: {e}"))),
        }
    }
    Ok(())
}

/// A region that a transfer in flight uses cannot be deregistered: `RegionBusy` until the
/// transfer ends, then deregistration succeeds.
pub async fn cancel_deregister_in_flight_is_busy(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let items = 64u64;
    let buf = buffer(env, &b, n * items)?;
    let (names, segs) = blocks(env, &buf, "busy", items, n);
    let batch = write_items(&names, &segs);
    let mut write = Box::pin(b.write(&batch));
    // Poll once: the backend takes its pins and starts (or finishes) the I/O.
    let first = futures_poll_once(write.as_mut()).await;
    match first {
        Some(results) => {
            ensure!(results.iter().all(|r| r.is_ok()), "{results:?}");
        }
        None => {
            let busy = b.deregister(buf.id);
            ensure!(
                matches!(busy, Err(Error::RegionBusy { .. })),
                "deregistering a region under a write in flight gave {busy:?}"
            );
            let results = write.await;
            ensure!(results.iter().all(|r| r.is_ok()), "{results:?}");
        }
    }
    // Memory an abandoned write only reads may stay pinned briefly (a body being sent).
    buf.memory.wait_idle().await;
    b.deregister(buf.id)?;
    Ok(())
}

/// After a dropped read has finished dropping, its target memory is no longer pinned and
/// no byte of it changes.
pub async fn cancel_dropped_read_moves_no_byte_afterwards(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let items = 64u64;
    let src = buffer(env, &b, n * items)?;
    let (names, segs) = blocks(env, &src, "drop", items, n);
    for i in 0..items {
        src.fill(i * n, &pattern(n as usize, 300 + i as u32))?;
    }
    let writes = write_items(&names, &segs);
    let w = b.write(&writes).await;
    ensure!(w.iter().all(|r| r.is_ok()), "{w:?}");
    let dst = buffer(env, &b, n * items)?;
    let (_, dsegs) = blocks(env, &dst, "drop", items, n);
    let reads: Vec<ReadItem<'_>> = names
        .iter()
        .zip(&dsegs)
        .map(|(key, s)| ReadItem { key, segments: s })
        .collect();
    for yields in [0u64, 1, 3, 10] {
        {
            let read = b.read(&reads);
            let _ = run(read, Cancel::Select(yields)).await;
        }
        ensure_eq!(
            dst.memory.in_flight(),
            0,
            "a dropped read (after {yields} yields) still pins its target"
        );
        let before = dst.read(0, n * items)?;
        tokio::time::sleep(Duration::from_millis(3)).await;
        ensure!(
            dst.read(0, n * items)? == before,
            "target bytes changed after a dropped read (after {yields} yields) had returned"
        );
    }
    b.deregister(dst.id)?;
    Ok(())
}

/// `items` keys named `<prefix>-<i>` and, for each, one block of `n` bytes of `buf`.
fn blocks(
    env: &TrialEnv,
    buf: &Buf,
    prefix: &str,
    items: u64,
    n: u64,
) -> (Vec<ObjectKey>, Vec<[Slice; 1]>) {
    let names = (0..items)
        .map(|i| key(env, &format!("{prefix}-{i}")))
        .collect();
    let segs = (0..items).map(|i| [buf.slice(i * n, n)]).collect();
    (names, segs)
}

/// One write item per key, from its block.
fn write_items<'a>(names: &'a [ObjectKey], segs: &'a [[Slice; 1]]) -> Vec<WriteItem<'a>> {
    names
        .iter()
        .zip(segs)
        .map(|(key, s)| WriteItem { key, segments: s })
        .collect()
}

/// Polls a future once; `Some` when it finished on that poll.
async fn futures_poll_once<F: Future + Unpin>(mut fut: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut fut).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
