//! The benchmark through a connector: fill, write, read back, verify, with progress.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hicache::{
    Error, HiCache, HostSlots, MmapPool, PageKey, PoolGeometry, ReadOutcome, Result, gather_page,
    scatter_page,
};
use indicatif::ProgressBar;

use super::report::{BenchReport, median, stats};
use super::{alloc, page_pattern};
use crate::progress;

/// How long the exists phase asks again and again (as NIXL's `query_memory` timing does).
const EXISTS_TIME: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Page geometry (its `pages` is ignored: the pool holds `2 × pages`).
    pub geometry: PoolGeometry,
    /// Pages written and read per round.
    pub pages: u64,
    /// Pages per `batch_set` / `batch_get` call.
    pub batch: usize,
    /// Calls in flight at once.
    pub streams: usize,
    /// Rounds (write + read each); GB/s figures are medians over rounds.
    pub rounds: usize,
    /// Run the write phase.
    pub write: bool,
    /// Run the read phase (needs the pages written).
    pub read: bool,
    /// Run the exists phase.
    pub exists: bool,
    /// Keep the pages afterwards.
    pub keep: bool,
    /// Show progress on stderr when it is a terminal.
    pub progress: bool,
    /// Allocate the host pool in a shared-memory file (`MmapPool::shared`).
    pub shared_pool: bool,
    /// The storage is on a memory filesystem ([`memory_fs`](super::memory_fs)): the pool
    /// then keeps base pages even under direct I/O ([`pool_pages`](super::pool_pages)).
    pub memory_fs: bool,
}

/// Runs `calls` batches with `streams` in flight; returns per-batch latencies and failures.
async fn phase<F, Fut>(
    streams: usize,
    calls: usize,
    progress: &ProgressBar,
    op: F,
) -> Result<(Duration, Vec<Duration>, u64)>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u64>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    // More streams than calls would only idle (and a hostile count would exhaust memory).
    for _ in 0..streams.clamp(1, calls.max(1)) {
        let (op, next) = (op.clone(), next.clone());
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failed = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= calls {
                    return Ok::<_, Error>((lat, failed));
                }
                let t = Instant::now();
                failed += op(i).await?;
                lat.push(t.elapsed());
                progress.inc(1);
            }
        }));
    }
    let mut lat = Vec::new();
    let mut failed = 0;
    let mut pending = tasks;
    while !pending.is_empty() {
        let t = pending.remove(0);
        let (l, f) = t
            .await
            .map_err(|e| Error::backend(hicache::Component::Tool("bench"), e.to_string()))??;
        lat.extend(l);
        failed += f;
    }
    progress.finish_and_clear();
    let elapsed = started.elapsed();
    lat.sort();
    Ok((elapsed, lat, failed))
}

/// The first failure of each kind seen in a phase, shared by its streams.
#[derive(Clone, Default)]
struct FirstErrors(Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>);

impl FirstErrors {
    /// Records a failure unless one of its kind was recorded already.
    fn note(&self, kind: &dyn std::fmt::Debug, message: &dyn std::fmt::Display) {
        // The variant name: `Io { .. }` → `Io`, `ChecksumMismatch` → `ChecksumMismatch`.
        let kind = format!("{kind:?}");
        let kind = kind
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or("error")
            .to_string();
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_insert_with(|| message.to_string());
    }

    /// `<kind>: <message>` per kind, emptying the record for the next phase.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .map(|(kind, message)| format!("{kind}: {message}"))
            .collect()
    }
}

/// Runs the benchmark through a connector (the pool is registered here). Each round writes
/// new pages and first removes the previous round's, untimed.
pub async fn run(cache: Arc<HiCache>, opts: &BenchOptions) -> Result<BenchReport> {
    let pages = opts.pages.max(1);
    let pool_pages = pages.checked_mul(2).ok_or_else(|| Error::InvalidPool {
        reason: format!("{pages} pages (twice over, for the read-back region) overflow 64 bits"),
    })?;
    let geometry = opts.geometry.with_pages(pool_pages)?;
    let pages_kind = super::pool_pages(cache.backend_info().capability.direct_io, opts.memory_fs);
    let pool = Arc::new(if opts.shared_pool {
        MmapPool::shared(geometry)?
    } else {
        MmapPool::with_pages(geometry, pages_kind)?
    });
    let report = cache.register_pool(pool.clone())?;
    let page_bytes = geometry.page_bytes();
    let run_id = run_id();
    // Every round writes new pages and evicts the previous round's (untimed), as a full
    // cache does: new keys are the common case for content-addressed pages.
    let round_keys = |round: usize| -> Result<Arc<Vec<PageKey>>> {
        Ok(Arc::new(
            (0..pages)
                .map(|i| PageKey::new(format!("{run_id:016x}{round:08x}{:040x}", i)))
                .collect::<Result<_>>()?,
        ))
    };
    let mut keys = round_keys(0)?;
    let fill = progress::bar(opts.progress, "fill", pages);
    for p in 0..pages {
        scatter_page(pool.as_ref(), p, &page_pattern(page_bytes, p))?;
        fill.inc(1);
    }
    fill.finish_and_clear();
    let batch = opts.batch.max(1);
    let calls = (pages as usize).div_ceil(batch);
    let mut write_rounds = Vec::new();
    let mut read_rounds = Vec::new();
    let mut verified = true;
    for round in 0..opts.rounds.max(1) {
        if round > 0 && opts.write {
            let evict = progress::bar(opts.progress, "evict", 1);
            cache.batch_remove(&keys).await?;
            evict.finish_and_clear();
            keys = round_keys(round)?;
        }
        if opts.write {
            let (c, k, errs) = (cache.clone(), keys.clone(), FirstErrors::default());
            let progress = progress::bar(opts.progress, "write", calls as u64);
            let e = errs.clone();
            let allocated = alloc::allocations();
            let (el, lat, failed) = phase(opts.streams, calls, &progress, move |i| {
                let (c, k, e) = (c.clone(), k.clone(), e.clone());
                async move {
                    let lo = i * batch;
                    let hi = (lo + batch).min(k.len());
                    let idx: Vec<u64> = (lo as u64..hi as u64).collect();
                    let r = c.batch_set(&k[lo..hi], HostSlots::Pages(&idx)).await?;
                    let mut failed = 0;
                    for err in r.iter().filter_map(|r| r.as_ref().err()) {
                        e.note(err, err);
                        failed += 1;
                    }
                    Ok(failed)
                }
            })
            .await?;
            let mut st = stats(el, &lat, failed, pages, page_bytes);
            st.first_errors = errs.take();
            st.allocations_per_page = per_unit(allocated, pages);
            st.allocations_per_call = per_unit(allocated, calls as u64);
            write_rounds.push(st);
        }
        if opts.read {
            for p in pages..2 * pages {
                scatter_page(pool.as_ref(), p, &vec![0u8; page_bytes as usize])?;
            }
            let (c, k, errs) = (cache.clone(), keys.clone(), FirstErrors::default());
            let progress = progress::bar(opts.progress, "read", calls as u64);
            let e = errs.clone();
            let allocated = alloc::allocations();
            let (el, lat, failed) = phase(opts.streams, calls, &progress, move |i| {
                let (c, k, e) = (c.clone(), k.clone(), e.clone());
                async move {
                    let lo = i * batch;
                    let hi = (lo + batch).min(k.len());
                    let n = k.len() as u64;
                    let idx: Vec<u64> = (lo as u64 + n..hi as u64 + n).collect();
                    let r = c.batch_get(&k[lo..hi], HostSlots::Pages(&idx)).await?;
                    let mut failed = 0;
                    for r in &r {
                        match r {
                            Ok(ReadOutcome::Hit) => continue,
                            Ok(ReadOutcome::Miss(reason)) => e.note(reason, reason),
                            Err(err) => e.note(err, err),
                        }
                        failed += 1;
                    }
                    Ok(failed)
                }
            })
            .await?;
            let mut st = stats(el, &lat, failed, pages, page_bytes);
            st.first_errors = errs.take();
            st.allocations_per_page = per_unit(allocated, pages);
            st.allocations_per_call = per_unit(allocated, calls as u64);
            read_rounds.push(st);
            let mut buf = vec![0u8; page_bytes as usize];
            let check = progress::bar(opts.progress, "verify", pages);
            for p in 0..pages {
                gather_page(pool.as_ref(), pages + p, &mut buf)?;
                if buf != page_pattern(page_bytes, p) {
                    verified = false;
                }
                check.inc(1);
            }
            check.finish_and_clear();
            if failed > 0 {
                verified = false;
            }
        }
    }
    let mut exists_keys_per_s = 0.0;
    if opts.exists {
        // Passes over every key, a batch per call, until EXISTS_TIME has gone by: one pass
        // over a thousand keys takes milliseconds, too short to time.
        let progress = progress::bar(opts.progress, "exists", EXISTS_TIME.as_secs());
        let started = Instant::now();
        let mut asked = 0usize;
        loop {
            let mut found = 0;
            for chunk in keys.chunks(batch) {
                found += cache.batch_exists(chunk).await?;
            }
            asked += keys.len();
            if opts.write && found != keys.len() {
                verified = false;
            }
            progress.set_position(started.elapsed().as_secs());
            if started.elapsed() >= EXISTS_TIME {
                break;
            }
        }
        progress.finish_and_clear();
        exists_keys_per_s = asked as f64 / started.elapsed().as_secs_f64().max(1e-9);
    }
    if !opts.keep {
        cache.batch_remove(&keys).await?;
    }
    let info = cache.backend_info();
    Ok(BenchReport {
        plugin: info.name.clone(),
        plugin_facts: cache.plugin_facts().to_vec(),
        location: info.location.clone(),
        transfer_mode: report.mode.to_string(),
        direct_io: info.capability.direct_io,
        page_bytes,
        pages,
        batch,
        streams: opts.streams,
        rounds: opts.rounds.max(1),
        write_gbps: median(write_rounds.iter().map(|r| r.gbps).collect()),
        read_gbps: median(read_rounds.iter().map(|r| r.gbps).collect()),
        exists_keys_per_s,
        read_back: !read_rounds.is_empty(),
        verified: verified && !read_rounds.is_empty(),
        write_rounds,
        read_rounds,
        stored_bytes_per_page: report.stored_bytes_per_page,
        objects_per_page: report.objects_per_page,
        pool_bytes: geometry.pool_bytes(),
        shared_pool: opts.shared_pool,
        // Shown now: a copy's count is live.
        pool_path: report.pool_path.as_ref().map(ToString::to_string),
        peak_rss_bytes: alloc::peak_rss(),
    })
}

/// A run's key prefix, random per call: two benches on one root (in containers where both
/// are PID 1) must never share keys, or one's eviction removes the other's pages. (The PID
/// and a few nanoseconds of a fresh clock collided in about one pair of runs in ten.)
fn run_id() -> u64 {
    std::hash::BuildHasher::hash_one(
        &std::collections::hash_map::RandomState::new(),
        (std::process::id(), std::time::SystemTime::now()),
    )
}

/// Allocations since `before` (a count from [`alloc::allocations`]) per page.
fn per_unit(before: Option<u64>, units: u64) -> Option<f64> {
    let (before, now) = before.zip(alloc::allocations())?;
    Some(now.saturating_sub(before) as f64 / units.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_differ_even_within_one_process() {
        let ids: std::collections::HashSet<u64> = (0..1000).map(|_| run_id()).collect();
        assert_eq!(ids.len(), 1000);
    }
}
