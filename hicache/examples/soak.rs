//! The soak: three threads write and read pages through one `BlockingHiCache` against a
//! storage dir held at its limit by the capacity cleaner, for a bounded time. Every page
//! read back is compared byte for byte with what was written under its key; the dir's usage
//! and the process's RSS are sampled throughout.
//!
//! `cargo xtask soak` runs it in a release build for 10 minutes (`--seconds N` to change,
//! `--dir D` to soak another filesystem) and prints the JSON report; it exits non-zero when
//! a byte was wrong, an operation failed, usage left the band or RSS grew. CI runs it for a
//! short while.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hicache::{
    AttentionKind, BlockingHiCache, Dtype, HiCacheOptions, HostPool, HostSlots, Layout, MmapPool,
    PageKey, PoolGeometry, ReadOutcome, StorageIdentity, gather_page, scatter_page,
};

const THREADS: u64 = 3;
/// Pages per batch call (each thread writes one batch, then reads one).
const BATCH: u64 = 16;
/// The dir's budget: the cleaner keeps the stored bytes between 70 % and 80 % of it.
const BUDGET: u64 = 256 << 20;
const HIGH: f64 = 80.0;
const LOW: f64 = 70.0;
const CLEANER_INTERVAL_S: f64 = 0.1;

struct Args {
    seconds: u64,
    dir: Option<PathBuf>,
    /// Writes of all threads together, MiB/s (0: as fast as they go).
    write_mib_s: u64,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        seconds: 600,
        dir: None,
        write_mib_s: 256,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--seconds" => {
                out.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?;
                if !(1..=86_400).contains(&out.seconds) {
                    return Err("--seconds: from 1 to 86400".into());
                }
            }
            "--dir" => out.dir = Some(PathBuf::from(value()?)),
            "--write-mib-s" => {
                out.write_mib_s = value()?
                    .parse()
                    .map_err(|e| format!("--write-mib-s: {e}"))?;
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (--seconds N, --dir D, --write-mib-s M)"
                ));
            }
        }
    }
    Ok(out)
}

/// The bytes page `id` holds: a pattern no other id shares, cheap to regenerate.
fn fill(id: u64, page: &mut [u8]) {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in page.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn key(id: u64) -> PageKey {
    PageKey::new(format!("soak-{id:016x}")).expect("a soak key is a valid key")
}

/// Bytes of stored objects under `dir`: regular files in its bucket dirs whose names do not
/// start with `.`, which is what the cleaner's budget counts. Writes in flight (temporary
/// files) and recycled files (spares) start with `.`; the cleaner leaves them out, and so
/// does this.
fn usage(dir: &Path) -> u64 {
    let Ok(buckets) = std::fs::read_dir(dir) else {
        return 0;
    };
    let hidden = |name: &std::ffi::OsStr| name.as_encoded_bytes().starts_with(b".");
    buckets
        .flatten()
        .filter(|b| !hidden(&b.file_name()) && b.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|b| std::fs::read_dir(b.path()).ok())
        .flat_map(|files| files.flatten())
        .filter(|f| !hidden(&f.file_name()))
        .filter_map(|f| f.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[derive(Default)]
struct Tally {
    written: AtomicU64,
    hits: AtomicU64,
    evicted: AtomicU64,
    invalid: AtomicU64,
    wrong_bytes: AtomicU64,
    errors: AtomicU64,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::exit(2);
        }
    };
    match run(&args) {
        Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::exit(1);
        }
    }
}

fn run(args: &Args) -> hicache::Result<bool> {
    let tmp = match &args.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .map_err(|e| hicache::Error::io(hicache::Component::Tool("soak"), "tempdir", None, e))?;
    let dir = tmp.path().join("root");
    let config = hicache::config()
        .set("storage_dir", dir.display().to_string())
        .set("plugin", "posix")
        .set("l3_cleaner_max_bytes", BUDGET)
        .set("l3_cleaner_high_watermark", HIGH)
        .set("l3_cleaner_low_watermark", LOW)
        .set("l3_cleaner_interval_s", CLEANER_INTERVAL_S)
        .set("l3_cleaner_min_age_s", 0.1)
        .set("l3_cleaner_max_removals_per_s", 100_000)
        .load()?;
    let cache = Arc::new(BlockingHiCache::new(hicache::open(
        config,
        HiCacheOptions::new(StorageIdentity::single("soak")),
    )?)?);
    let geometry = PoolGeometry::builder(AttentionKind::Mha {
        kv_heads: 8,
        head_dim: 128,
    })
    .layers(8)
    .page_tokens(8)
    .dtype(Dtype::Bf16)
    .layout(Layout::PageFirst)
    .pages(2 * THREADS * BATCH)
    .build()?;
    let pool = Arc::new(MmapPool::new(geometry)?);
    cache.register_pool(pool.clone())?;
    let page_bytes = geometry.page_bytes();

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let next_id = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, pool, stop, tally, next_id) = (
                cache.clone(),
                pool.clone(),
                stop.clone(),
                tally.clone(),
                next_id.clone(),
            );
            let per_thread = args.write_mib_s as f64 * (1 << 20) as f64 / THREADS as f64;
            std::thread::spawn(move || {
                worker(t, &cache, &pool, &stop, &tally, &next_id, per_thread)
            })
        })
        .collect();

    let started = Instant::now();
    let mut usage_pct = Vec::new();
    let mut rss = Vec::new();
    let mut over_budget = 0u64;
    let mut samples = 0u64;
    let mut peak: (u64, f64, Option<hicache::posix::CleanerPass>) = (0, 0.0, None);
    while started.elapsed() < Duration::from_secs(args.seconds) {
        std::thread::sleep(Duration::from_millis(250));
        let used = usage(&dir);
        samples += 1;
        if used > BUDGET {
            over_budget += 1;
        }
        if used > peak.0 {
            // What the cleaner had last done when usage peaked: why a band was left, if it was.
            let pass = hicache::posix::cleaner_of(&dir)
                .ok()
                .and_then(|seen| seen.record)
                .and_then(|r| r.last_pass);
            peak = (used, started.elapsed().as_secs_f64(), pass);
        }
        usage_pct.push(100.0 * used as f64 / BUDGET as f64);
        rss.push((started.elapsed().as_secs_f64(), rss_bytes()));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("a soak worker panicked");
    }
    let seconds = started.elapsed().as_secs_f64();

    // Usage once the dir first reached its limit (the fill before it is not the band).
    let first_full = usage_pct
        .iter()
        .position(|&u| u >= LOW)
        .unwrap_or(usage_pct.len());
    let mut at_limit: Vec<f64> = usage_pct[first_full..].to_vec();
    let max_usage = at_limit.iter().copied().fold(0.0, f64::max);
    let min_usage = at_limit.iter().copied().fold(f64::INFINITY, f64::min);
    let median_usage = median(&mut at_limit);
    // RSS: the median of the second tenth of the run against the median of the last tenth.
    let tenth = (rss.len() / 10).max(1);
    let mut early: Vec<f64> = rss
        .iter()
        .skip(tenth)
        .take(tenth)
        .map(|r| r.1 as f64)
        .collect();
    let mut late: Vec<f64> = rss.iter().rev().take(tenth).map(|r| r.1 as f64).collect();
    let (early, late) = (median(&mut early), median(&mut late));
    let rss_growth = late - early;

    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let passes = hicache::posix::cleaner_of(&dir)
        .ok()
        .and_then(|seen| seen.record)
        .and_then(|r| r.last_pass);
    let wrong = get(&tally.wrong_bytes);
    let errors = get(&tally.errors) + get(&tally.invalid);
    // The band: after the first fill the stored bytes never pass the budget in a sample,
    // the median stays within the watermarks give or take one cleaner interval of writes.
    let band_ok = over_budget == 0 && max_usage <= 100.0 && median_usage >= LOW - 10.0;
    let rss_ok = rss_growth <= (16 << 20) as f64;
    let ok = wrong == 0 && errors == 0 && band_ok && rss_ok && get(&tally.hits) > 0;
    let report = serde_json::json!({
        "seconds": seconds,
        "threads": THREADS,
        "page_bytes": page_bytes,
        "budget_bytes": BUDGET,
        "watermarks_pct": [LOW, HIGH],
        "pages_written": get(&tally.written),
        "pages_read_verified": get(&tally.hits),
        "pages_found_evicted": get(&tally.evicted),
        "pages_invalid": get(&tally.invalid),
        "wrong_bytes": wrong,
        "errors": get(&tally.errors),
        "write_mib_s_asked": args.write_mib_s,
        "write_mib_per_s": (get(&tally.written) * page_bytes) as f64 / seconds / (1 << 20) as f64,
        "usage_pct_at_limit": {"min": min_usage, "median": median_usage, "max": max_usage},
        "usage_samples": samples,
        "usage_samples_over_budget": over_budget,
        "rss_mib": {"early_median": early / (1 << 20) as f64, "late_median": late / (1 << 20) as f64},
        "last_cleaner_pass": passes.map(|p| serde_json::json!({
            "pages": p.pages, "bytes": p.bytes, "duration_ms": p.duration_ms, "error": p.error,
        })),
        "peak": {
            "usage_pct": 100.0 * peak.0 as f64 / BUDGET as f64,
            "at_s": peak.1,
            "cleaner_pass_before": peak.2,
        },
        "ok": ok,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    cache.close();
    Ok(ok)
}

/// One I/O thread: writes a batch of new pages, then reads back a batch of pages written
/// recently by any thread (some of them evicted meanwhile), verifying every byte of a hit.
fn worker(
    t: u64,
    cache: &BlockingHiCache,
    pool: &MmapPool,
    stop: &AtomicBool,
    tally: &Tally,
    next_id: &AtomicU64,
    bytes_per_s: f64,
) {
    let started = Instant::now();
    let mut sent = 0u64;
    let len = pool.geometry().page_bytes() as usize;
    let src: Vec<u64> = (t * 2 * BATCH..t * 2 * BATCH + BATCH).collect();
    let dst: Vec<u64> = src.iter().map(|p| p + BATCH).collect();
    let mut page = vec![0u8; len];
    let mut expected = vec![0u8; len];
    let mut rng = t.wrapping_add(1).wrapping_mul(0x2545_F491_4F6C_DD1D);
    while !stop.load(Ordering::Relaxed) {
        let first = next_id.fetch_add(BATCH, Ordering::Relaxed);
        let ids: Vec<u64> = (first..first + BATCH).collect();
        for (&p, &id) in src.iter().zip(&ids) {
            fill(id, &mut page);
            if scatter_page(pool, p, &page).is_err() {
                tally.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        let keys: Vec<PageKey> = ids.iter().map(|&id| key(id)).collect();
        match cache.batch_set(&keys, HostSlots::Pages(&src)) {
            Ok(results) => {
                for r in results {
                    let counter = if r.is_ok() {
                        &tally.written
                    } else {
                        &tally.errors
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                tally.errors.fetch_add(BATCH, Ordering::Relaxed);
            }
        }
        sent += BATCH * len as u64;
        if bytes_per_s > 0.0 {
            let due = Duration::from_secs_f64(sent as f64 / bytes_per_s);
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
        // Read pages from the last ~2 budgets' worth of ids: recent ones hit, older ones
        // are partly evicted.
        let written = next_id.load(Ordering::Relaxed);
        let window = (2 * BUDGET / len as u64).max(1);
        let read_ids: Vec<u64> = (0..BATCH)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                written.saturating_sub(1 + rng % window.min(written.max(1)))
            })
            .collect();
        let keys: Vec<PageKey> = read_ids.iter().map(|&id| key(id)).collect();
        let results = match cache.batch_get(&keys, HostSlots::Pages(&dst)) {
            Ok(r) => r,
            Err(_) => {
                tally.errors.fetch_add(BATCH, Ordering::Relaxed);
                continue;
            }
        };
        for ((r, &id), &p) in results.into_iter().zip(&read_ids).zip(&dst) {
            match r {
                Ok(ReadOutcome::Hit) => {
                    tally.hits.fetch_add(1, Ordering::Relaxed);
                    fill(id, &mut expected);
                    if gather_page(pool, p, &mut page).is_err() {
                        tally.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let wrong = page.iter().zip(&expected).filter(|(a, b)| a != b).count();
                    tally.wrong_bytes.fetch_add(wrong as u64, Ordering::Relaxed);
                }
                // Evicted, or not yet published by the thread that took the id.
                Ok(ReadOutcome::Miss(hicache::MissReason::NotFound)) => {
                    tally.evicted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(ReadOutcome::Miss(_)) => {
                    tally.invalid.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
