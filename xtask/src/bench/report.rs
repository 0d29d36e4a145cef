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
        "\nGB/s = 1e9 B/s. Each contender runs {ROUNDS} write+read rounds per repeat (hicache writes new pages each round and evicts the previous round's, untimed; NIXL and the raw loop rewrite their files, the first round into fresh ones); the table holds medians over all rounds of {} interleaved repeat(s). Batches of {BATCH} pages with {IN_FLIGHT} in flight: hicache {IN_FLIGHT} calls, NIXL {IN_FLIGHT} requests of {BATCH} descriptors in its `uring` and `aio` modes, each with its buffers as its script allocates them (shared anonymous memory) and in private memory advised for huge pages (`+hugepages`, the memory hicache's pool and the raw loops use for direct I/O to a disk); the best variant per figure, named. The raw loop runs {BATCH} threads. \"raw-format\" is hicache with `page_format = \"raw\"` (no envelope, no checksum). For OBJ, 1 call in flight; its raw baseline is the object_store client with {BATCH} requests in flight on the same moto server.\n",
        report["repeats"]
    ));
    s
}

/// What naming and publishing cost: the raw loop, the same loop opening each page's file
/// by name and publishing each write with a rename, and hicache with raw and enveloped pages.
pub(super) fn publish(report: &Value) -> String {
    let mut s = String::from(
        "\n| case | raw loop w / r | raw-publish loop w / r | raw-publish vs raw loop w / r | hicache raw-format w / r | hicache w / r | hicache vs raw-publish w / r |\n|---|---|---|---|---|---|---|\n",
    );
    for c in report["cases"].as_array().into_iter().flatten() {
        if c["raw_publish_write_gbps"].is_null() && c["raw_publish_read_gbps"].is_null() {
            continue;
        }
        let pair = |a: &str, b: &str| format!("{} / {}", cell(&c[a]), cell(&c[b]));
        let ratios =
            |field: &str| format!("{} / {}", cell(&c[field]["write"]), cell(&c[field]["read"]));
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            pair("raw_write_gbps", "raw_read_gbps"),
            pair("raw_publish_write_gbps", "raw_publish_read_gbps"),
            ratios("raw_publish_vs_raw"),
            pair("raw_format_write_gbps", "raw_format_read_gbps"),
            pair("hicache_write_gbps", "hicache_read_gbps"),
            ratios("ratio_vs_raw_publish"),
        ));
    }
    s.push_str(&format!("\nThe raw-publish loop (`hicache bench --baseline raw-publish`) is the raw loop with the least that a store of named, atomically published pages does per page: a write opens the page's spare file, writes it, closes it and renames it onto the page's name; a read opens the name, reads it and closes it. Its {BATCH} threads run free, with no envelope, checksum, buckets or batches. Medians, as above.\n"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_publish_table_has_a_row_per_case_with_the_publish_loop() {
        let report = json!({ "cases": [
            {
                "name": "ext4/64KiB",
                "raw_write_gbps": 2.0, "raw_read_gbps": 1.8,
                "raw_publish_write_gbps": 1.8, "raw_publish_read_gbps": 1.8,
                "raw_publish_vs_raw": { "write": 0.9, "read": 1.0 },
                "raw_format_write_gbps": 0.4, "raw_format_read_gbps": 1.7,
                "hicache_write_gbps": 1.9, "hicache_read_gbps": 1.5,
                "ratio_vs_raw_publish": { "write": 1.0556, "read": 0.8333 },
            },
            // An OBJ case has no publish loop: no row.
            { "name": "obj/1MiB", "raw_write_gbps": 0.5, "raw_read_gbps": 0.6 },
        ]});
        let table = publish(&report);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[1].starts_with("| ext4/64KiB | 2.00 / 1.80 | 1.80 / 1.80 | 0.90 / 1.00 |"));
        assert!(
            rows[1].ends_with("| 1.90 / 1.50 | 1.06 / 0.83 |"),
            "{}",
            rows[1]
        );
    }
}
