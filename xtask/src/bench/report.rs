//! The markdown tables of a bench report.

use serde_json::Value;

use super::stats::cell;
use super::{BATCH, IN_FLIGHT, ROUNDS};

/// The NIXL figure with the mode that gave it, e.g. `1.23 (aio)`.
fn nixl_cell(figure: &Value, mode: &Value) -> String {
    match mode.as_str() {
        Some(m) => format!("{} ({m})", cell(figure)),
        None => cell(figure),
    }
}

/// The transfer cases: hicache, hicache with raw pages, the raw loop and NIXL; ratios.
pub(super) fn transfers(report: &Value) -> String {
    let mut s = String::from(
        "| case | hicache write | raw-format write | raw loop write | NIXL write | hicache read | raw-format read | raw loop read | NIXL read | write vs raw loop | write vs NIXL | read vs raw loop | read vs NIXL | envelope vs raw format (w/r) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in report["cases"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |\n",
            c["name"].as_str().unwrap_or(""),
            cell(&c["hicache_write_gbps"]),
            cell(&c["raw_format_write_gbps"]),
            cell(&c["raw_write_gbps"]),
            nixl_cell(&c["nixl_write_gbps"], &c["nixl_mode"]["write"]),
            cell(&c["hicache_read_gbps"]),
            cell(&c["raw_format_read_gbps"]),
            cell(&c["raw_read_gbps"]),
            nixl_cell(&c["nixl_read_gbps"], &c["nixl_mode"]["read"]),
            cell(&c["ratio_vs_raw"]["write"]),
            cell(&c["ratio_vs_nixl"]["write"]),
            cell(&c["ratio_vs_raw"]["read"]),
            cell(&c["ratio_vs_nixl"]["read"]),
            cell(&c["ratio_vs_raw_format"]["write"]),
            cell(&c["ratio_vs_raw_format"]["read"]),
        ));
    }
    s.push_str(&format!(
        "\nGB/s = 1e9 B/s. Each contender runs {ROUNDS} write+read rounds per repeat (hicache writes new pages each round and evicts the previous round's, untimed; NIXL and the raw loop rewrite their files, the first round into fresh ones); the table holds medians over all rounds of {} interleaved repeat(s). Batches of {BATCH} pages with {IN_FLIGHT} in flight: hicache {IN_FLIGHT} calls, NIXL {IN_FLIGHT} requests of {BATCH} descriptors in its `uring` and `aio` modes (the better mode per figure, named), the raw loop {BATCH} threads. \"raw-format\" is hicache with `page_format = \"raw\"` (no envelope, no checksum). For OBJ, 1 call in flight; its raw baseline is the object_store client with {BATCH} requests in flight on the same moto server.\n",
        report["repeats"]
    ));
    s
}

/// Memory of the hicache transfer runs: heap allocations per page and peak RSS beyond the
/// pool.
pub(super) fn memory(report: &Value) -> String {
    let mut s = String::from(
        "\n| hicache memory | allocations per page, write | read | per call, write | read | peak RSS beyond the pool |\n|---|---|---|---|---|---|\n",
    );
    for c in report["cases"].as_array().into_iter().flatten() {
        let Some(rss) = c["rss_beyond_pool_bytes"].as_f64() else {
            continue;
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.1} MiB |\n",
            c["name"].as_str().unwrap_or(""),
            cell(&c["allocations_per_page"]["write"]),
            cell(&c["allocations_per_page"]["read"]),
            cell(&c["allocations_per_call"]["write"]),
            cell(&c["allocations_per_call"]["read"]),
            rss / f64::from(1u32 << 20),
        ));
    }
    s.push_str(&format!("\nAllocations: every heap allocation in the process during a timed phase (the `hicache` binary counts them), divided by the pages moved, and by the calls (batches of {BATCH} pages); medians over rounds. A count per call that does not grow with the batch means no allocation is made per page. Peak RSS: the largest `VmHWM` of the runs less the pool (written pages and the region they are read back into).\n"));
    s
}

/// The exists cases: hicache `batch_exists` against NIXL `query_memory`.
pub(super) fn exists(report: &Value) -> String {
    let mut s = String::from(
        "\n| exists, pages that exist | hicache keys/s | NIXL query_memory keys/s | hicache vs NIXL |\n|---|---|---|---|\n",
    );
    for c in report["exists"].as_array().into_iter().flatten() {
        let keys = |v: &Value| {
            v.as_f64()
                .map(|x| format!("{:.0}", x))
                .unwrap_or_else(|| "–".into())
        };
        let nixl = match c["nixl_mode"].as_str() {
            Some(m) => format!("{} ({m})", keys(&c["nixl_keys_per_s"])),
            None => keys(&c["nixl_keys_per_s"]),
        };
        s.push_str(&format!(
            "| {} ({} pages, {} keys a call) | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            c["pages"],
            c["batch"],
            keys(&c["hicache_keys_per_s"]),
            nixl,
            cell(&c["ratio_vs_nixl"]),
        ));
    }
    s.push_str("\nEach side asks for every page again and again, a call at a time, for about a second; medians over repeats.\n");
    s
}
