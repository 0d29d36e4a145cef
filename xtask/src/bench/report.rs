//! The markdown tables of a bench report.

use serde_json::Value;

use super::stats::cell;
use super::{BATCH, IN_FLIGHT, RAW_THREADS, ROUNDS};

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
        "\nGB/s = 1e9 B/s. Each contender runs {ROUNDS} write+read rounds per repeat (hicache writes new pages each round and evicts the previous round's, untimed; NIXL and the raw loop rewrite their files, the first round into fresh ones); the table holds medians over all rounds of {} interleaved repeat(s). Batches of {BATCH} pages with {IN_FLIGHT} in flight: hicache {IN_FLIGHT} calls, NIXL {IN_FLIGHT} requests of {BATCH} descriptors in its `uring` and `aio` modes, each with its buffers as its script allocates them (shared anonymous memory) and in private memory advised for huge pages (`+hugepages`, the memory hicache's pool and the raw loops use for direct I/O to a disk); the best variant per figure, named. The raw loop runs {RAW_THREADS} threads with a page in flight each: the {RAW_THREADS} pages that hicache's calls and NIXL's requests have in flight. \"raw-format\" is hicache with `page_format = \"raw\"` (no envelope, no checksum). For OBJ, 1 call in flight; its raw baseline is the object_store client with {BATCH} requests in flight on the same moto server.\n",
        report["repeats"]
    ));
    s
}

/// A case's two figures `a` / `b`.
fn pair(case: &Value, a: &str, b: &str) -> String {
    format!("{} / {}", cell(&case[a]), cell(&case[b]))
}

/// A case's ratio `field`, write / read.
fn ratios(case: &Value, field: &str) -> String {
    format!(
        "{} / {}",
        cell(&case[field]["write"]),
        cell(&case[field]["read"])
    )
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
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            pair(c, "raw_write_gbps", "raw_read_gbps"),
            pair(c, "raw_publish_write_gbps", "raw_publish_read_gbps"),
            ratios(c, "raw_publish_vs_raw"),
            pair(c, "raw_format_write_gbps", "raw_format_read_gbps"),
            pair(c, "hicache_write_gbps", "hicache_read_gbps"),
            ratios(c, "ratio_vs_raw_publish"),
        ));
    }
    s.push_str(&format!("\nThe raw-publish loop (`hicache bench --baseline raw-publish`) is the raw loop with the least that a store of named, atomically published pages does per page: a write opens the page's spare file, writes it, closes it and renames it onto the page's name; a read opens the name, reads it and closes it. Its {RAW_THREADS} threads run free, with no envelope, checksum, buckets or batches. Medians, as above.\n"));
    s
}

/// What an enveloped page's length costs by itself: the raw loop with files of the page's
/// length and with files of the stored object's (header and padding included), counted in
/// payload bytes, and hicache against the latter.
pub(super) fn stored(report: &Value) -> String {
    let mut s = String::from(
        "\n| case | stored bytes a page | raw loop w / r | raw loop at the stored length w / r | that vs raw loop w / r | hicache w / r | hicache vs it w / r |\n|---|---|---|---|---|---|---|\n",
    );
    let mut any = false;
    for c in report["cases"].as_array().into_iter().flatten() {
        if c["raw_stored_write_gbps"].is_null() && c["raw_stored_read_gbps"].is_null() {
            continue;
        }
        any = true;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            c["stored_object_bytes"]
                .as_u64()
                .map_or_else(|| "–".to_string(), |b| b.to_string()),
            pair(c, "raw_write_gbps", "raw_read_gbps"),
            pair(c, "raw_stored_write_gbps", "raw_stored_read_gbps"),
            ratios(c, "raw_stored_vs_raw"),
            pair(c, "hicache_write_gbps", "hicache_read_gbps"),
            ratios(c, "ratio_vs_raw_stored"),
        ));
    }
    if !any {
        return String::new();
    }
    s.push_str("\nThe raw loop run a second time with files as long as hicache's stored objects (an enveloped page is its payload, a header block, and padding to the direct-I/O alignment), its GB/s counted in payload bytes, as hicache's are. Its ratio to the raw loop is what the envelope's extra bytes, and the extra device requests they can take, cost a loop that does nothing else: on a disk that takes at most 4 MiB a request, a page of 8 MiB is 2 requests and one of 8 MiB + 4 KiB is 3; on ext4, files of at most 64 KiB are packed side by side and longer ones are not. Medians, as above.\n");
    s
}

/// Where NIXL's pages lie: NIXL as its script runs (a request's pages side by side on the
/// disk), NIXL with its pages scattered over its files, the raw loop and hicache, per disk
/// case.
pub(super) fn scattered(report: &Value) -> String {
    let mut s = String::from(
        "\n| case | NIXL w / r | NIXL, pages scattered w / r | scattered vs NIXL w / r | raw loop w / r | hicache w / r | hicache vs scattered NIXL w / r |\n|---|---|---|---|---|---|---|\n",
    );
    let mut any = false;
    for c in report["cases"].as_array().into_iter().flatten() {
        if c["nixl_scattered_write_gbps"].is_null() && c["nixl_scattered_read_gbps"].is_null() {
            continue;
        }
        any = true;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c["name"].as_str().unwrap_or(""),
            pair(c, "nixl_write_gbps", "nixl_read_gbps"),
            pair(c, "nixl_scattered_write_gbps", "nixl_scattered_read_gbps"),
            ratios(c, "nixl_scattered_vs_nixl"),
            pair(c, "raw_write_gbps", "raw_read_gbps"),
            pair(c, "hicache_write_gbps", "hicache_read_gbps"),
            ratios(c, "ratio_vs_nixl_scattered"),
        ));
    }
    if !any {
        return String::new();
    }
    s.push_str("\nNIXL's script writes page `i` to file `i` and reads it back from there, round after round; its first round allocates the files in page order, so a request's pages lie side by side on the disk and the block layer can merge them (requests table). The scattered variant runs the same script, in huge pages, behind a prelude that sends page `i` to file `perm[i]` for one fixed random permutation, with the script's `--prealloc`, which allocates the files in their own order before the clock starts: a request's pages then lie apart, as a store's do when each write lands in whichever file is free (hicache publishes each page by renaming a spare file onto its name). Best mode per figure; medians, as above.\n");
    s
}

/// What the device under each disk case saw: mean KiB per request and requests merged into
/// others per request that reached it, read / write, per contender.
pub(super) fn requests(report: &Value) -> String {
    const WHO: [(&str, &str); 7] = [
        ("hicache", "hicache"),
        ("raw_format", "raw-format"),
        ("raw", "raw loop"),
        ("raw_publish", "raw-publish loop"),
        ("raw_stored", "raw loop, stored length"),
        ("nixl", "NIXL (all variants)"),
        ("nixl_scattered", "NIXL, pages scattered"),
    ];
    let mut s = String::from("\n| device requests, KiB each r / w (merged into each r / w) |");
    for (_, label) in WHO {
        s.push_str(&format!(" {label} |"));
    }
    s.push_str(&format!("\n|---|{}\n", "---|".repeat(WHO.len())));
    let mut any = false;
    for c in report["cases"].as_array().into_iter().flatten() {
        if c["requests"].is_null() || WHO.iter().all(|(k, _)| c["requests"][*k].is_null()) {
            continue;
        }
        any = true;
        s.push_str(&format!("| {} |", c["name"].as_str().unwrap_or("")));
        for (key, _) in WHO {
            let d = &c["requests"][key];
            let merged = |dir: &str| -> Value {
                match (d[dir]["merged"].as_f64(), d[dir]["requests"].as_f64()) {
                    (Some(m), Some(n)) if n > 0.0 => serde_json::json!(m / n),
                    _ => Value::Null,
                }
            };
            if d.is_null() {
                s.push_str(" – |");
            } else {
                s.push_str(&format!(
                    " {:.0} / {:.0} ({} / {}) |",
                    d["read"]["kib_per_request"].as_f64().unwrap_or(f64::NAN),
                    d["write"]["kib_per_request"].as_f64().unwrap_or(f64::NAN),
                    cell(&merged("read")),
                    cell(&merged("write")),
                ));
            }
        }
        s.push('\n');
    }
    if !any {
        return String::new();
    }
    s.push_str("\nFrom `/proc/diskstats` of the device under the bench dir, summed over each contender's runs: requests completed, their mean size, and requests the block layer merged into others (per request completed). The device's own counters: they include each run's untimed setup and the filesystem's metadata writes. A merge joins adjacent sectors, so a contender whose files lie next to each other on disk and whose pages reach the block layer together (NIXL submits a batch's pages at once) can have its pages merged into larger requests. A thread per page (the raw loops, hicache's thread pool) hands the block layer one page at a time, which it merges only with an adjacent request still queued.\n");
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

    #[test]
    fn the_requests_table_has_a_row_per_case_with_a_device() {
        let per = |r: u64, rm: u64, rk: f64, w: u64, wm: u64, wk: f64| {
            json!({
                "read": { "requests": r, "merged": rm, "kib_per_request": rk },
                "write": { "requests": w, "merged": wm, "kib_per_request": wk },
            })
        };
        let report = json!({ "cases": [
            {
                "name": "ext4/64KiB",
                "requests": {
                    "hicache": per(100, 0, 68.0, 100, 50, 67.6),
                    "raw_format": per(100, 0, 64.0, 100, 0, 64.0),
                    "raw": per(100, 0, 64.0, 100, 0, 64.0),
                    "raw_publish": per(100, 0, 64.0, 100, 0, 64.0),
                    "raw_stored": per(100, 0, 68.0, 100, 0, 68.0),
                    "nixl": per(10, 140, 940.0, 40, 120, 278.4),
                    "nixl_scattered": per(100, 1, 64.0, 100, 0, 64.0),
                },
            },
            // tmpfs: no device, no row.
            { "name": "tmpfs/64KiB", "requests": {
                "hicache": null, "raw_format": null, "raw": null, "raw_publish": null,
                "raw_stored": null, "nixl": null,
            } },
            // A run without NIXL: a dash in its column.
            {
                "name": "ext4/1MiB",
                "requests": {
                    "hicache": per(10, 0, 1028.0, 10, 0, 1028.0),
                    "raw_format": per(10, 0, 1024.0, 10, 0, 1024.0),
                    "raw": per(10, 0, 1024.0, 10, 0, 1024.0),
                    "raw_publish": per(10, 0, 1024.0, 10, 0, 1024.0),
                    "raw_stored": per(10, 0, 1028.0, 10, 0, 1028.0),
                    "nixl": null,
                },
            },
        ]});
        let table = requests(&report);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 3, "{table}");
        assert!(
            rows[1].starts_with("| ext4/64KiB | 68 / 68 (0.00 / 0.50) | 64 / 64 (0.00 / 0.00) |"),
            "{}",
            rows[1]
        );
        assert!(
            rows[1].ends_with("| 940 / 278 (14.00 / 3.00) | 64 / 64 (0.01 / 0.00) |"),
            "NIXL's column, then its scattered variant's: {}",
            rows[1]
        );
        assert!(
            rows[1].contains("| 64 / 64 (0.00 / 0.00) | 68 / 68 (0.00 / 0.00) | 940"),
            "the stored-length loop's column, before NIXL's: {}",
            rows[1]
        );
        assert!(rows[2].starts_with("| ext4/1MiB |") && rows[2].ends_with("| – | – |"));
        // No case with a device: no table at all.
        let none = json!({ "cases": [{ "name": "tmpfs/64KiB", "requests": null }] });
        assert_eq!(requests(&none), "");
    }

    #[test]
    fn the_stored_length_table_prices_the_envelope_bytes_where_the_loop_ran() {
        let report = json!({ "cases": [
            {
                "name": "ext4/8MiB",
                "stored_object_bytes": 8392704,
                "raw_write_gbps": 4.4, "raw_read_gbps": 2.7,
                "raw_stored_write_gbps": 4.136, "raw_stored_read_gbps": 2.511,
                "raw_stored_vs_raw": { "write": 0.94, "read": 0.93 },
                "hicache_write_gbps": 4.0, "hicache_read_gbps": 2.5,
                "ratio_vs_raw_stored": { "write": 0.9671, "read": 0.9956 },
            },
            // A page stored as several objects, or a report without the length: no loop ran.
            { "name": "ext4/64KiB", "raw_write_gbps": 2.9, "raw_read_gbps": 1.9,
              "raw_stored_write_gbps": null, "raw_stored_read_gbps": null },
        ]});
        let table = stored(&report);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert_eq!(
            rows[1],
            "| ext4/8MiB | 8392704 | 4.40 / 2.70 | 4.14 / 2.51 | 0.94 / 0.93 | 4.00 / 2.50 | 0.97 / 1.00 |"
        );
        let none = json!({ "cases": [{ "name": "tmpfs/64KiB" }] });
        assert_eq!(stored(&none), "", "no case ran the loop: no table");
    }

    #[test]
    fn the_scattered_table_has_a_row_per_case_where_nixl_ran_scattered() {
        let report = json!({ "cases": [
            {
                "name": "ext4/64KiB",
                "nixl_write_gbps": 3.4, "nixl_read_gbps": 2.35,
                "nixl_scattered_write_gbps": 2.48, "nixl_scattered_read_gbps": 1.76,
                "nixl_scattered_vs_nixl": { "write": 0.7294, "read": 0.7489 },
                "raw_write_gbps": 2.71, "raw_read_gbps": 1.79,
                "hicache_write_gbps": 2.12, "hicache_read_gbps": 1.52,
                "ratio_vs_nixl_scattered": { "write": 0.8548, "read": 0.8636 },
            },
            // tmpfs, or a run without NIXL: the variant did not run, no row.
            { "name": "tmpfs/64KiB", "nixl_write_gbps": 6.4, "nixl_read_gbps": 6.9,
              "nixl_scattered_write_gbps": null, "nixl_scattered_read_gbps": null },
        ]});
        let table = scattered(&report);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert_eq!(
            rows[1],
            "| ext4/64KiB | 3.40 / 2.35 | 2.48 / 1.76 | 0.73 / 0.75 | 2.71 / 1.79 | 2.12 / 1.52 | 0.85 / 0.86 |"
        );
        let none = json!({ "cases": [{ "name": "tmpfs/64KiB" }] });
        assert_eq!(scattered(&none), "", "no case ran the variant: no table");
    }
}
