//! The Prometheus exporter, scraped over loopback HTTP and read from its file, against the
//! operations a connector performed. One test: a process has one `metrics` recorder.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hicache::{
    AttentionKind, Config, Dtype, HiCacheOptions, HostSlots, Layout, MmapPool, PageKey,
    PoolGeometry, ReadOutcome, StorageIdentity, scatter_page,
};

fn config(dir: &Path, port: u16, file: &Path) -> Config {
    hicache::config()
        .set("storage_dir", dir.join("pages").display().to_string())
        .set("plugin", "posix")
        .set("use_direct_io", false)
        // The cleaner runs (a budget it never reaches) so its passes are counted.
        .set("l3_cleaner_max_bytes", "1TiB")
        .set("l3_cleaner_interval_s", 0.05)
        .set("metrics_listen", format!("127.0.0.1:{port}"))
        .set("metrics_file", file.display().to_string())
        .set("metrics_file_interval_s", 0.1)
        .load()
        .unwrap()
}

/// `GET /metrics` over a plain socket: the body, parsed into `series -> value`.
fn scrape(port: u16) -> HashMap<String, f64> {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    parse(body)
}

fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn value(m: &HashMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("{series} missing from {:#?}", m.keys().collect::<Vec<_>>()))
}

fn free_port() -> TcpListener {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_match_the_operations() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hicache.prom");

    // A port in use is refused now, naming the key, and installs nothing.
    let taken = free_port();
    let port = taken.local_addr().unwrap().port();
    let err = hicache::start_metrics(&config(dir.path(), port, &file)).unwrap_err();
    assert!(
        matches!(&err, hicache::Error::InvalidConfig { key, .. } if key == "metrics_listen"),
        "{err}"
    );
    drop(taken);
    // A file that cannot be written (no such dir; a dir or a FIFO in its place) is refused the
    // same way, and what is in its place stays.
    let fifo = tempfile::tempdir().unwrap();
    let fifo = fifo.path().join("hicache.prom");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for bad in [
        dir.path().join("missing/hicache.prom"),
        dir.path().to_path_buf(),
        fifo.clone(),
    ] {
        let err = hicache::start_metrics(&config(dir.path(), port, &bad)).unwrap_err();
        assert!(
            matches!(&err, hicache::Error::InvalidConfig { key, .. } if key == "metrics_file"),
            "{err}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a refused start leaves nothing behind"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );

    let cfg = config(dir.path(), port, &file);
    let identity = StorageIdentity::single("metrics-model");
    let cache = hicache::open(cfg.clone(), HiCacheOptions::new(identity)).unwrap();
    let running = hicache::start_metrics(&cfg).unwrap().unwrap();
    assert_eq!(running.listen_addr().unwrap().port(), port);
    // Other settings in the same process are refused, naming the key that differs.
    let other = config(dir.path(), port, &dir.path().join("other.prom"));
    let err = hicache::start_metrics(&other).unwrap_err();
    assert!(
        matches!(&err, hicache::Error::InvalidConfig { key, .. } if key == "metrics_file"),
        "{err}"
    );

    // Rank 1 of 2 given the same config serves on the next port: another exporter, refused
    // in this process; a port past 65535 is refused before anything starts.
    let rank1 = StorageIdentity {
        tp_rank: 1,
        tp_size: 2,
        ..StorageIdentity::single("metrics-model")
    };
    let err = hicache::start_rank_metrics(&cfg, &rank1).unwrap_err();
    assert!(
        matches!(&err, hicache::Error::InvalidConfig { key, .. } if key == "metrics_listen"),
        "{err}"
    );
    let top = config(dir.path(), u16::MAX, &file);
    let err = hicache::start_rank_metrics(&top, &rank1).unwrap_err();
    assert!(err.to_string().contains("past 65535"), "{err}");

    let geometry = PoolGeometry::builder(AttentionKind::Mha {
        kv_heads: 1,
        head_dim: 64,
    })
    .layers(2)
    .page_tokens(4)
    .dtype(Dtype::Bf16)
    .layout(Layout::PageFirst)
    .pages(32)
    .build()
    .unwrap();
    let pool = Arc::new(MmapPool::new(geometry).unwrap());
    cache.register_pool(pool.clone()).unwrap();
    let page_bytes = geometry.page_bytes();
    let keys: Vec<PageKey> = (0..10)
        .map(|i| PageKey::new(format!("metrics-{i}")).unwrap())
        .collect();
    for p in 0..8 {
        scatter_page(pool.as_ref(), p, &vec![p as u8 + 1; page_bytes as usize]).unwrap();
    }
    let slots: Vec<u64> = (0..8).collect();
    for r in cache
        .batch_set(&keys[..8], HostSlots::Pages(&slots))
        .await
        .unwrap()
    {
        r.unwrap();
    }
    // One stored page corrupted: its last payload byte flipped.
    let object = cache.object_names(&keys[7]).unwrap().remove(0);
    let path = find(&dir.path().join("pages"), object.as_str()).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    // 7 hits, 1 corrupt, 2 not found.
    let read_slots: Vec<u64> = (10..20).collect();
    let got = cache
        .batch_get(&keys, HostSlots::Pages(&read_slots))
        .await
        .unwrap();
    let hits = got
        .iter()
        .filter(|r| matches!(r, Ok(ReadOutcome::Hit)))
        .count();
    assert_eq!(hits, 7);
    assert_eq!(cache.batch_exists(&keys).await.unwrap(), 8);
    for r in cache.batch_remove(&keys[..3]).await.unwrap() {
        r.unwrap();
    }

    let b = r#"backend="POSIX""#;
    let m = scrape(port);
    let stats = cache.stats();
    assert_eq!(
        value(&m, &format!("hicache_pages_written_total{{{b}}}")),
        8.0
    );
    assert_eq!(stats.pages_written, 8);
    assert_eq!(
        value(&m, &format!("hicache_written_bytes_total{{{b}}}")),
        (8 * page_bytes) as f64
    );
    assert_eq!(value(&m, &format!("hicache_page_hits_total{{{b}}}")), 7.0);
    assert_eq!(
        value(&m, &format!("hicache_read_bytes_total{{{b}}}")),
        (7 * page_bytes) as f64
    );
    assert_eq!(stats.bytes_read, 7 * page_bytes);
    assert_eq!(
        value(
            &m,
            &format!("hicache_page_misses_total{{{b},reason=\"not_found\"}}")
        ),
        2.0
    );
    assert_eq!(
        value(
            &m,
            &format!("hicache_page_misses_total{{{b},reason=\"corrupt\"}}")
        ),
        1.0
    );
    assert_eq!(
        value(&m, &format!("hicache_exists_asked_pages_total{{{b}}}")),
        10.0
    );
    assert_eq!(
        value(&m, &format!("hicache_exists_found_pages_total{{{b}}}")),
        8.0
    );
    assert_eq!(
        value(&m, &format!("hicache_pages_removed_total{{{b}}}")),
        3.0
    );
    for op in ["set", "get", "exists", "remove"] {
        assert_eq!(
            value(
                &m,
                &format!("hicache_batch_duration_seconds_count{{{b},op=\"{op}\"}}")
            ),
            1.0,
            "{op}"
        );
    }
    assert!(
        !m.keys().any(|k| k.starts_with("hicache_page_errors_total")),
        "no errors happened"
    );

    // The file carries the same numbers once it is next rewritten.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let f = parse(&text);
        if f.get(&format!("hicache_pages_removed_total{{{b}}}")) == Some(&3.0) {
            assert_eq!(
                f.get(&format!("hicache_page_hits_total{{{b}}}")),
                Some(&7.0)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the file never caught up: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The cleaner's passes, by dir, with nothing evicted (the budget is far away).
    let deadline = Instant::now() + Duration::from_secs(20);
    let pages_dir = dir.path().join("pages").display().to_string();
    let passes = format!("hicache_cleaner_passes_total{{dir=\"{pages_dir}\"}}");
    while scrape(port).get(&passes).copied().unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "no cleaner pass was counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = scrape(port);
    assert_eq!(
        value(
            &m,
            &format!("hicache_cleaner_evicted_pages_total{{dir=\"{pages_dir}\"}}")
        ),
        0.0
    );
    assert_eq!(
        value(
            &m,
            &format!("hicache_cleaner_need_bytes{{dir=\"{pages_dir}\"}}")
        ),
        0.0
    );
    // HELP lines come from the descriptions.
    assert!(
        running
            .render()
            .contains("# HELP hicache_page_misses_total")
    );
}

/// The file named `name` under `root`, however deep.
fn find(root: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            return Some(path);
        }
        if entry.file_type().ok()?.is_dir()
            && let Some(found) = find(&path, name)
        {
            return Some(found);
        }
    }
    None
}
