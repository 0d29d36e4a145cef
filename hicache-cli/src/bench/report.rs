//! What a bench run reports, and the arithmetic of its figures.

use std::time::Duration;

use serde::Serialize;

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
    /// Heap allocations in the whole process during the phase, per page (None when not
    /// counted: only the `hicache` binary counts).
    pub allocations_per_page: Option<f64>,
    /// The same allocations per call (`batch_set` / `batch_get` of `--batch` pages): a count
    /// that stays level as `--batch` grows means none is made per page.
    pub allocations_per_call: Option<f64>,
}

/// The result of `hicache bench`.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Plugin.
    pub plugin: String,
    /// What the plugin's probe established: engine, each dir's filesystem and I/O mode,
    /// the endpoint (empty for a baseline).
    pub plugin_facts: Vec<hicache::Fact>,
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
    /// Keys answered per second by `batch_exists`, `batch` keys a call, over passes through
    /// every key for about a second (0 when the phase did not run).
    pub exists_keys_per_s: f64,
    /// Whether pages were read back and compared (false for a write-only run).
    pub read_back: bool,
    /// Every page read back equals what was written (false when nothing was read back).
    pub verified: bool,
    /// Per-round write figures.
    pub write_rounds: Vec<PhaseStats>,
    /// Per-round read figures.
    pub read_rounds: Vec<PhaseStats>,
    /// Bytes stored per page: the objects' lengths, envelope headers and alignment padding
    /// included (the page's bytes for a baseline).
    pub stored_bytes_per_page: u64,
    /// Objects each page is stored as (1 for a baseline).
    pub objects_per_page: u64,
    /// Bytes of the host pool (the pages written and the region they are read back into).
    pub pool_bytes: u64,
    /// Whether the host pool was in a shared-memory file (`--shared-pool`).
    pub shared_pool: bool,
    /// How the plugin moved the pool's bytes, as `register_pool` reported it and counted at
    /// the end (in zero-copy mode; None otherwise, and for a baseline).
    pub pool_path: Option<String>,
    /// Peak resident memory of the process at the end, bytes (None when unknown).
    pub peak_rss_bytes: Option<u64>,
}

impl BenchReport {
    /// The report of a baseline run: `shape` is (page bytes, pages, requests in flight).
    pub(super) fn baseline(
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
            plugin_facts: Vec::new(),
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
            stored_bytes_per_page: page_bytes,
            objects_per_page: 1,
            pool_bytes: 0,
            shared_pool: false,
            pool_path: None,
            peak_rss_bytes: None,
        }
    }
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
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

pub(super) fn stats(
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
        allocations_per_page: None,
        allocations_per_call: None,
    }
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
