//! Crash safety: a process writing and removing pages is killed with SIGKILL at random moments,
//! and after every kill a fresh process reads every key back. A page it serves must be exactly
//! a page some writer stored under that key: never torn, never another key's, never a mix of
//! two writes. At the end `scrub` must find no torn or corrupt file.
//!
//! `HICACHE_CRASH_KILLS` sets the number of kills (default 20); `cargo xtask crash` runs 200
//! and keeps the figures, which this test prints as one `crash-report: {json}` line.
#![cfg(feature = "posix")]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hicache::{
    ConfigLoader, HiCache, HiCacheOptions, HostSlots, Layout, MmapPool, PageKey, ReadOutcome,
    StorageIdentity, gather_page, scatter_page,
};
use hicache_cli::bench::ModelShape;
use hicache_cli::scrub::{ScrubOptions, scrub};

/// Keys the writers cycle through: few, so that kills land on overwrites and removals.
const KEYS: u64 = 48;
/// Pages per write call; two calls are in flight in the writer.
const BATCH: u64 = 8;
const PAGE_BYTES: u64 = 64 << 10;
const CHILD_ENV: &str = "HICACHE_CRASH_CHILD";

/// One page format on its own root: every kill alternates between them.
#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    settings: &'static [(&'static str, &'static str)],
}

const VARIANTS: [Variant; 2] = [
    Variant {
        name: "envelope",
        settings: &[],
    },
    Variant {
        name: "raw",
        settings: &[("naming", "sglang"), ("page_format", "raw")],
    },
];

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Contents of one object of write `generation` of key `key`: both numbers up front, then
/// words that depend on both and on their position, so a mix of two writes or of two keys
/// cannot pass.
fn fill_object(key: u64, generation: u64, object: &mut [u8]) {
    for (i, word) in object.chunks_exact_mut(8).enumerate() {
        let v = match i {
            0 => key,
            1 => generation,
            _ => splitmix(key << 40 ^ generation.wrapping_mul(0x1_0000_0001) ^ i as u64),
        };
        word.copy_from_slice(&v.to_le_bytes());
    }
}

/// A page is `objects` equal parts, one per object it is stored as.
fn fill(key: u64, generation: u64, objects: usize, page: &mut [u8]) {
    let len = page.len() / objects;
    for object in page.chunks_exact_mut(len) {
        fill_object(key, generation, object);
    }
}

/// What a served page is: `Ok(())` when each of its objects is exactly one write of `key`.
/// Each object is published atomically on its own; a page stored as two objects (SGLang's
/// `_k`/`_v` names) may join two writes of one key after a kill, which is harmless where a
/// key's bytes are fixed by its tokens, so only objects are checked whole.
fn check(key: u64, objects: usize, page: &[u8]) -> Result<(), String> {
    let len = page.len() / objects;
    for (o, object) in page.chunks_exact(len).enumerate() {
        let word = |i: usize| u64::from_le_bytes(object[i * 8..i * 8 + 8].try_into().unwrap());
        if word(0) != key {
            return Err(format!("key {key} object {o} holds key {}", word(0)));
        }
        let mut expected = vec![0u8; len];
        fill_object(key, word(1), &mut expected);
        if let Some(at) = object.iter().zip(&expected).position(|(a, b)| a != b) {
            return Err(format!(
                "key {key} object {o} (write {}) is torn at byte {at}",
                word(1)
            ));
        }
    }
    Ok(())
}

fn key(i: u64) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

fn open(
    root: &Path,
    variant: Variant,
    engine: &str,
    pages: u64,
) -> (HiCache, Arc<MmapPool>, usize) {
    let mut loader = ConfigLoader::new()
        .set("storage_dir", root.display().to_string())
        .set("plugin", "posix")
        .set("plugin.posix.engine", engine);
    for (k, v) in variant.settings {
        loader = loader.set(*k, *v);
    }
    let cache = hicache::open(
        loader.load().unwrap(),
        HiCacheOptions::new(StorageIdentity::single("crash")),
    )
    .unwrap();
    let geometry = ModelShape::Custom {
        page_bytes: PAGE_BYTES,
    }
    .geometry(16, Layout::PageFirst, pages)
    .unwrap();
    let pool = Arc::new(MmapPool::new(geometry).unwrap());
    let report = cache.register_pool(pool.clone()).unwrap();
    (cache, pool, report.objects_per_page as usize)
}

/// The writer, run in a child process by the test below (ignored when run on its own).
#[test]
#[ignore = "the writer process of sigkill_while_writing_never_serves_a_wrong_page"]
fn crash_writer() {
    let root = std::env::var_os(CHILD_ENV).expect("run by its parent test, which sets the root");
    let variant = VARIANTS[std::env::var("HICACHE_CRASH_VARIANT")
        .unwrap()
        .parse::<usize>()
        .unwrap()];
    let engine = std::env::var("HICACHE_CRASH_ENGINE").unwrap();
    let seed: u64 = std::env::var("HICACHE_CRASH_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let (cache, pool, objects) = open(Path::new(&root), variant, &engine, 2 * BATCH);
    let cache = Arc::new(cache);
    println!("crash-writer-ready");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut streams = (0..2u64).map(|stream| {
            let (cache, pool) = (cache.clone(), pool.clone());
            tokio::spawn(async move {
                let mut state = splitmix(seed ^ stream);
                let mut page = vec![0u8; PAGE_BYTES as usize];
                loop {
                    state = splitmix(state);
                    // Each stream owns half of the keys, so two writes of a key never race.
                    let first = stream * (KEYS / 2) + state % (KEYS / 2 - BATCH);
                    let keys: Vec<PageKey> = (first..first + BATCH).map(key).collect();
                    if state.is_multiple_of(8) {
                        let _ = cache.batch_remove(&keys).await;
                        continue;
                    }
                    let slots: Vec<u64> = (stream * BATCH..(stream + 1) * BATCH).collect();
                    for (k, &slot) in (first..first + BATCH).zip(&slots) {
                        fill(k, splitmix(state ^ k), objects, &mut page);
                        scatter_page(pool.as_ref(), slot, &page).unwrap();
                    }
                    let _ = cache.batch_set(&keys, HostSlots::Pages(&slots)).await;
                }
            })
        });
        // The streams write until the parent kills this process; a panic in either ends it.
        let (first, second) = (streams.next().unwrap(), streams.next().unwrap());
        tokio::try_join!(first, second).unwrap();
    });
}

#[derive(Default, serde::Serialize)]
struct Figures {
    kills: u64,
    kills_during_start: u64,
    pages_checked: u64,
    hits: u64,
    misses: u64,
    read_errors: u64,
    wrong_pages_served: u64,
    scrub_files: u64,
    scrub_valid: u64,
    scrub_raw: u64,
    scrub_torn: u64,
    scrub_corrupt: u64,
    scrub_stale_temp: u64,
    links: u64,
    seconds: f64,
}

fn spawn_writer(root: &Path, variant: usize, engine: &str, seed: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, root)
        .env("HICACHE_CRASH_VARIANT", variant.to_string())
        .env("HICACHE_CRASH_ENGINE", engine)
        .env("HICACHE_CRASH_SEED", seed.to_string())
        .env_remove("HICACHE_CONFIG")
        .env_remove("HICACHE_STORAGE_DIR")
        .env_remove("HICACHE_BACKEND_PLUGIN")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Reads until the writer says it is writing; `false` if it ended first.
fn wait_ready(child: &mut Child) -> bool {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains("crash-writer-ready") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60)).is_ok()
}

fn sigkill(child: &mut Child) {
    // SAFETY: kill(2) on our own child's PID, which `wait` below has not reaped yet.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the writer ended on its own before the kill: {status:?}"
    );
}

/// Reads every key into a fresh pool and checks each page served.
fn verify(root: &Path, variant: Variant, engine: &str, figures: &mut Figures) -> Vec<String> {
    let (cache, pool, objects) = open(root, variant, engine, KEYS);
    let keys: Vec<PageKey> = (0..KEYS).map(key).collect();
    let slots: Vec<u64> = (0..KEYS).collect();
    let results = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(cache.batch_get(&keys, HostSlots::Pages(&slots)))
        .unwrap();
    let mut wrong = Vec::new();
    let mut page = vec![0u8; PAGE_BYTES as usize];
    for (k, r) in results.into_iter().enumerate() {
        figures.pages_checked += 1;
        match r {
            Ok(ReadOutcome::Hit) => {
                figures.hits += 1;
                gather_page(pool.as_ref(), k as u64, &mut page).unwrap();
                if let Err(e) = check(k as u64, objects, &page) {
                    figures.wrong_pages_served += 1;
                    wrong.push(format!("{}: {e}", variant.name));
                }
            }
            Ok(ReadOutcome::Miss(_)) => figures.misses += 1,
            Err(e) => {
                figures.read_errors += 1;
                wrong.push(format!("{}: key {k}: read error {e}", variant.name));
            }
        }
    }
    cache.close();
    wrong
}

#[test]
fn sigkill_while_writing_never_serves_a_wrong_page() {
    let kills: u64 = std::env::var("HICACHE_CRASH_KILLS")
        .ok()
        .map(|v| v.parse().expect("HICACHE_CRASH_KILLS: a number"))
        .unwrap_or(20);
    // Under target/: the repository's filesystem (ext4 on the project's machines).
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let roots: Vec<_> = VARIANTS
        .iter()
        .map(|v| {
            let r = base.path().join(v.name);
            std::fs::create_dir(&r).unwrap();
            r
        })
        .collect();
    let started = Instant::now();
    let mut figures = Figures::default();
    let mut problems = Vec::new();
    let mut rng = splitmix(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    for n in 0..kills {
        rng = splitmix(rng);
        let variant = (n % 2) as usize;
        let engine = if (n / 2).is_multiple_of(2) {
            "threads"
        } else {
            "uring"
        };
        let mut child = spawn_writer(&roots[variant], variant, engine, rng);
        if n % 10 == 9 {
            // While it starts: opening the root, creating its spare dir, probing.
            figures.kills_during_start += 1;
            std::thread::sleep(Duration::from_millis(rng % 40));
        } else {
            assert!(wait_ready(&mut child), "the writer never started");
            std::thread::sleep(Duration::from_millis(5 + rng % 250));
        }
        sigkill(&mut child);
        figures.kills += 1;
        let reader_engine = if rng.is_multiple_of(2) {
            "threads"
        } else {
            "uring"
        };
        problems.extend(verify(
            &roots[variant],
            VARIANTS[variant],
            reader_engine,
            &mut figures,
        ));
    }
    for root in &roots {
        let report = scrub(&ScrubOptions {
            dirs: vec![root.clone()],
            delete: false,
            namespace: None,
            temp_age: Duration::ZERO,
            progress: false,
        })
        .unwrap();
        figures.scrub_files += report.files;
        figures.scrub_valid += report.valid;
        figures.scrub_raw += report.raw;
        figures.scrub_torn += report.count("torn") as u64;
        figures.scrub_corrupt += report.count("corrupt") as u64;
        figures.scrub_stale_temp += report.count("stale-temp") as u64;
        for f in &report.findings {
            if !matches!(f.kind, "stale-temp") {
                problems.push(format!("scrub: {f:?}"));
            }
        }
        // Leftover temp files are proof of nothing but an interrupted write: --delete takes
        // them, and then nothing is left to find.
        let opts = ScrubOptions {
            dirs: vec![root.clone()],
            delete: true,
            namespace: None,
            temp_age: Duration::ZERO,
            progress: false,
        };
        scrub(&opts).unwrap();
        let again = scrub(&opts).unwrap();
        assert!(again.findings.is_empty(), "{again:#?}");
        assert_eq!(again.valid + again.raw, report.valid + report.raw);
        let contents = hicache::posix::inspect_root(root).unwrap();
        figures.links += contents.links.len() as u64;
        assert!(
            contents.links.is_empty() && contents.misplaced.is_empty(),
            "{contents:?}"
        );
        assert!(
            contents.live_spare_dirs.is_empty(),
            "a killed writer's spare dir still looks alive: {contents:?}"
        );
    }
    figures.seconds = started.elapsed().as_secs_f64();
    println!("crash-report: {}", serde_json::to_string(&figures).unwrap());
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(figures.wrong_pages_served, 0);
    assert!(
        figures.hits > 0,
        "no page survived any kill: the test proves nothing"
    );
}
