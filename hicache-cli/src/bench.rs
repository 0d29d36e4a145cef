//! `hicache bench`: write, read back into another region, verify every byte, time each phase;
//! and the raw O_DIRECT loop it is compared with.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hicache::{
    AttentionKind, Dtype, Error, HiCache, HostSlots, Layout, MmapPool, PageKey, PoolGeometry,
    ReadOutcome, Result, gather_page, scatter_page,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// Which model's page shape to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelShape {
    /// Llama-3-8B: MHA, 32 layers, 8 KV heads × 128, bf16 (128 KiB per token).
    Llama3_8b,
    /// Qwen3-8B: MHA, 36 layers, 8 KV heads × 128, bf16 (144 KiB per token).
    Qwen3_8b,
    /// DeepSeek-V3: MLA, 61 layers, latent 576, bf16 (about 69 KiB per token).
    DeepseekV3,
    /// A synthetic MHA shape whose page is exactly `page_bytes` (a multiple of 512).
    Custom {
        /// Bytes per page.
        page_bytes: u64,
    },
}

impl ModelShape {
    /// Parses `llama3-8b`, `qwen3-8b`, `deepseek-v3`, `custom`.
    pub fn parse(name: &str, page_bytes: Option<u64>) -> Result<Self> {
        if page_bytes.is_some() && name != "custom" {
            return Err(Error::invalid_config(
                "--page-bytes",
                "the command line",
                format!(
                    "applies to --model custom only, not to {name} (whose page size follows from the model)"
                ),
            ));
        }
        Ok(match name {
            "llama3-8b" => ModelShape::Llama3_8b,
            "qwen3-8b" => ModelShape::Qwen3_8b,
            "deepseek-v3" => ModelShape::DeepseekV3,
            "custom" => ModelShape::Custom {
                page_bytes: page_bytes.unwrap_or(1 << 20),
            },
            other => {
                return Err(Error::invalid_config(
                    "model",
                    "command line",
                    format!("`{other}` is not one of llama3-8b, qwen3-8b, deepseek-v3, custom"),
                ));
            }
        })
    }

    /// The pool geometry for `pages` pages of `page_tokens` tokens in `layout`.
    pub fn geometry(&self, page_tokens: u64, layout: Layout, pages: u64) -> Result<PoolGeometry> {
        let (attention, layers, tokens) = match *self {
            ModelShape::Llama3_8b => (
                AttentionKind::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                32,
                page_tokens,
            ),
            ModelShape::Qwen3_8b => (
                AttentionKind::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                36,
                page_tokens,
            ),
            ModelShape::DeepseekV3 => (AttentionKind::Mla { kv_cache_dim: 576 }, 61, page_tokens),
            ModelShape::Custom { page_bytes } => {
                // 2 (K,V) × 8 layers × 16 tokens × 1 head × D × 2 bytes = 512·D bytes per page.
                if page_bytes == 0 || page_bytes % 512 != 0 {
                    return Err(Error::invalid_config(
                        "page-bytes",
                        "command line",
                        format!("{page_bytes} is not a positive multiple of 512"),
                    ));
                }
                (
                    AttentionKind::Mha {
                        kv_heads: 1,
                        head_dim: page_bytes / 512,
                    },
                    8,
                    16,
                )
            }
        };
        PoolGeometry::new(attention, layers, Dtype::Bf16, tokens, layout, pages)
    }
}

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
}

/// One phase's timing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseStats {
    /// GB/s (1e9 bytes per second) of payload.
    pub gbps: f64,
    /// Pages per second.
    pub pages_per_s: f64,
    /// Median batch latency, ms.
    pub p50_ms: f64,
    /// 99th percentile batch latency, ms.
    pub p99_ms: f64,
    /// Pages that failed or missed (not counted in GB/s and pages/s).
    pub failed_pages: u64,
    /// Payload bytes of the pages that succeeded.
    pub bytes: u64,
    /// Wall time of the phase, seconds.
    pub seconds: f64,
    /// The first failure of each kind (`<kind>: <message>`), so a failing run says why.
    pub first_errors: Vec<String>,
}

/// The result of `hicache bench`.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Plugin.
    pub plugin: String,
    /// Where it stored.
    pub location: String,
    /// Transfer mode of the pool.
    pub transfer_mode: String,
    /// Whether direct I/O was on.
    pub direct_io: bool,
    /// Bytes per page.
    pub page_bytes: u64,
    /// Pages per round.
    pub pages: u64,
    /// Pages per call.
    pub batch: usize,
    /// Calls in flight.
    pub streams: usize,
    /// Rounds.
    pub rounds: usize,
    /// Median write GB/s.
    pub write_gbps: f64,
    /// Median read GB/s.
    pub read_gbps: f64,
    /// Existence checks per second.
    pub exists_keys_per_s: f64,
    /// Whether pages were read back and compared (false for a write-only run).
    pub read_back: bool,
    /// Every page read back equals what was written (false when nothing was read back).
    pub verified: bool,
    /// Per-round write figures.
    pub write_rounds: Vec<PhaseStats>,
    /// Per-round read figures.
    pub read_rounds: Vec<PhaseStats>,
}

impl BenchReport {
    /// The report of a baseline run: `shape` is (page bytes, pages, requests in flight).
    fn baseline(
        name: &str,
        location: String,
        direct_io: bool,
        shape: (u64, u64, usize),
        write_rounds: Vec<PhaseStats>,
        read_rounds: Vec<PhaseStats>,
        verified: bool,
    ) -> Self {
        let (page_bytes, pages, in_flight) = shape;
        BenchReport {
            plugin: name.into(),
            location,
            transfer_mode: "raw".into(),
            direct_io,
            page_bytes,
            pages,
            batch: in_flight,
            streams: in_flight,
            rounds: write_rounds.len(),
            write_gbps: median(write_rounds.iter().map(|r| r.gbps).collect()),
            read_gbps: median(read_rounds.iter().map(|r| r.gbps).collect()),
            exists_keys_per_s: 0.0,
            read_back: !read_rounds.is_empty(),
            verified: verified && !read_rounds.is_empty(),
            write_rounds,
            read_rounds,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// A progress bar on stderr for a phase of `total` steps; hidden unless `enabled` and stderr
/// is a terminal (a pipe or a log file gets no control characters).
fn progress_bar(enabled: bool, label: &'static str, total: u64) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total).with_prefix(label);
    if let Ok(style) =
        ProgressStyle::with_template("{prefix:>7} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)")
    {
        bar.set_style(style.progress_chars("#>-"));
    }
    bar
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
            .map_err(|e| Error::backend("bench", e.to_string()))??;
        lat.extend(l);
        failed += f;
    }
    progress.finish_and_clear();
    let elapsed = started.elapsed();
    lat.sort();
    Ok((elapsed, lat, failed))
}

fn stats(
    elapsed: Duration,
    lat: &[Duration],
    failed: u64,
    pages: u64,
    page_bytes: u64,
) -> PhaseStats {
    let secs = elapsed.as_secs_f64().max(1e-9);
    // Only pages that succeeded count: a failing backend must not look fast.
    let done = pages.saturating_sub(failed);
    PhaseStats {
        gbps: (done * page_bytes) as f64 / secs / 1e9,
        pages_per_s: done as f64 / secs,
        p50_ms: percentile(lat, 0.5),
        p99_ms: percentile(lat, 0.99),
        failed_pages: failed,
        bytes: done * page_bytes,
        seconds: elapsed.as_secs_f64(),
        first_errors: Vec::new(),
    }
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
    let pool = Arc::new(MmapPool::new(geometry)?);
    let report = cache.register_pool(pool.clone())?;
    let page_bytes = geometry.page_bytes();
    let run_id = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64 ^ 0x5eed;
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
    let fill = progress_bar(opts.progress, "fill", pages);
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
            let evict = progress_bar(opts.progress, "evict", 1);
            cache.batch_remove(&keys).await?;
            evict.finish_and_clear();
            keys = round_keys(round)?;
        }
        if opts.write {
            let (c, k, errs) = (cache.clone(), keys.clone(), FirstErrors::default());
            let progress = progress_bar(opts.progress, "write", calls as u64);
            let e = errs.clone();
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
            write_rounds.push(st);
        }
        if opts.read {
            for p in pages..2 * pages {
                scatter_page(pool.as_ref(), p, &vec![0u8; page_bytes as usize])?;
            }
            let (c, k, errs) = (cache.clone(), keys.clone(), FirstErrors::default());
            let progress = progress_bar(opts.progress, "read", calls as u64);
            let e = errs.clone();
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
            read_rounds.push(st);
            let mut buf = vec![0u8; page_bytes as usize];
            let check = progress_bar(opts.progress, "verify", pages);
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
        let started = Instant::now();
        let mut found = 0;
        for chunk in keys.chunks(batch) {
            found += cache.batch_exists(chunk).await?;
        }
        exists_keys_per_s = keys.len() as f64 / started.elapsed().as_secs_f64().max(1e-9);
        if opts.write && found != keys.len() {
            verified = false;
        }
    }
    if !opts.keep {
        cache.batch_remove(&keys).await?;
    }
    let info = cache.backend_info();
    Ok(BenchReport {
        plugin: info.name.clone(),
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
    })
}

/// The bytes of page `p` in the benchmark (cheap to generate, distinct per page).
fn page_pattern(len: u64, p: u64) -> Vec<u8> {
    let mut x = p.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len as usize);
    while out.len() < len as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

/// The raw baseline, the disk's limit for this page size and queue depth: one file per page,
/// all opened (created empty) before the clock starts, then per round `qd` threads `pwrite`
/// every page and `pread` it back (O_DIRECT unless `direct` is false). The first round
/// allocates, later rounds overwrite in place — as NIXL's benchmark does. No naming, no
/// publish, no checksums.
pub fn raw_baseline(
    dir: &Path,
    page_bytes: u64,
    pages: u64,
    qd: usize,
    direct: bool,
    rounds: usize,
) -> Result<BenchReport> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let pages = pages.max(1);
    let buf_bytes = pages
        .checked_mul(page_bytes)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::InvalidPool {
            reason: format!("{pages} pages of {page_bytes} bytes overflow the address space"),
        })?;
    // One thread per page at most: more would only idle.
    let qd = qd.clamp(1, usize::try_from(pages).unwrap_or(usize::MAX));
    let dir: PathBuf = dir.join(format!("raw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io("RAW", "create dir", Some(dir.clone()), e))?;
    let files: Vec<std::fs::File> = (0..pages)
        .map(|i| {
            let p = dir.join(format!("page{i:06}"));
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                .open(&p)
                .map_err(|e| Error::io("RAW", "open", Some(p), e))
        })
        .collect::<Result<_>>()?;
    let mut src = hicache::raw::AlignedBuf::zeroed(buf_bytes, 4096)?;
    let mut dst = hicache::raw::AlignedBuf::zeroed(buf_bytes, 4096)?;
    for p in 0..pages {
        src.copy_from((p * page_bytes) as usize, &page_pattern(page_bytes, p))?;
    }
    // Threads write disjoint pages of `dst` through this address; `dst` is not otherwise
    // touched until they have joined.
    let dst_addr = dst.as_mut_ptr() as usize;
    let timed = |write: bool| -> PhaseStats {
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        let errors = std::thread::scope(|s| {
            let handles: Vec<_> = (0..qd)
                .map(|_| {
                    s.spawn(|| {
                        let mut errors = 0u64;
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= pages as usize {
                                return errors;
                            }
                            let off = i * page_bytes as usize;
                            let fd = files[i].as_raw_fd();
                            // SAFETY: each page range of src/dst is touched by one thread only,
                            // and both buffers outlive the scope.
                            let n = unsafe {
                                if write {
                                    libc::pwrite(
                                        fd,
                                        src.as_ptr().add(off).cast(),
                                        page_bytes as usize,
                                        0,
                                    )
                                } else {
                                    libc::pread(
                                        fd,
                                        (dst_addr as *mut u8).add(off).cast(),
                                        page_bytes as usize,
                                        0,
                                    )
                                }
                            };
                            if n != page_bytes as isize {
                                errors += 1;
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(1))
                .sum::<u64>()
        });
        stats(started.elapsed(), &[], errors, pages, page_bytes)
    };
    let mut write_rounds = Vec::new();
    let mut read_rounds = Vec::new();
    for _ in 0..rounds.max(1) {
        write_rounds.push(timed(true));
        read_rounds.push(timed(false));
    }
    drop(files);
    let mut a = vec![0u8; page_bytes as usize];
    let mut b = vec![0u8; page_bytes as usize];
    let mut verified = true;
    for p in 0..pages {
        src.copy_to((p * page_bytes) as usize, &mut a)?;
        dst.copy_to((p * page_bytes) as usize, &mut b)?;
        verified &= a == b;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(BenchReport::baseline(
        "RAW",
        dir.display().to_string(),
        direct,
        (page_bytes, pages, qd),
        write_rounds,
        read_rounds,
        verified,
    ))
}

/// The OBJ baseline: the same `object_store` client the plugin uses, putting and getting each
/// page as one object with `concurrency` requests in flight — no envelope, no naming, no
/// registration. hicache OBJ is compared against it on the same server.
#[cfg(feature = "obj")]
pub async fn raw_object_store(
    cfg: hicache::obj::ObjConfig,
    page_bytes: u64,
    pages: u64,
    concurrency: usize,
    rounds: usize,
) -> Result<BenchReport> {
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    let backend = hicache::obj::ObjBackend::new(cfg)?;
    let store = backend.store().clone();
    let prefix = format!("raw-baseline-{}", std::process::id());
    let paths: Vec<object_store::path::Path> = (0..pages)
        .map(|i| object_store::path::Path::from(format!("{prefix}/page{i}")))
        .collect();
    let data: Vec<bytes::Bytes> = (0..pages)
        .map(|p| bytes::Bytes::from(page_pattern(page_bytes, p)))
        .collect();
    let err = |e: object_store::Error| Error::backend("RAW-OBJ", e.to_string());
    let mut write_rounds = Vec::new();
    let mut read_rounds = Vec::new();
    let mut verified = true;
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        let puts: Vec<_> = paths
            .iter()
            .zip(&data)
            .map(|(p, d)| store.put(p, d.clone().into()))
            .collect();
        let results: Vec<_> = futures::stream::iter(puts)
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        let failed = results.iter().filter(|r| r.is_err()).count() as u64;
        write_rounds.push(stats(started.elapsed(), &[], failed, pages, page_bytes));
        let started = Instant::now();
        let gets: Vec<_> = paths
            .iter()
            .map(|p| {
                let store = store.clone();
                async move { store.get(p).await?.bytes().await }
            })
            .collect();
        let got: Vec<_> = futures::stream::iter(gets)
            .buffered(concurrency.max(1))
            .collect()
            .await;
        let failed = got.iter().filter(|r| r.is_err()).count() as u64;
        read_rounds.push(stats(started.elapsed(), &[], failed, pages, page_bytes));
        for (g, d) in got.iter().zip(&data) {
            verified &= g.as_ref().is_ok_and(|b| b == d);
        }
    }
    for p in &paths {
        store.delete(p).await.map_err(err)?;
    }
    Ok(BenchReport::baseline(
        "RAW-OBJ",
        backend.config().location(),
        false,
        (page_bytes, pages, concurrency),
        write_rounds,
        read_rounds,
        verified,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_pages_do_not_count_as_throughput() {
        let st = stats(Duration::from_secs(1), &[], 10, 100, 1000);
        assert_eq!(st.pages_per_s, 90.0);
        assert_eq!(st.gbps, 90.0 * 1000.0 / 1e9);
        assert_eq!(st.failed_pages, 10);
        let all_failed = stats(Duration::from_secs(1), &[], 100, 100, 1000);
        assert_eq!(all_failed.gbps, 0.0);
    }
}
