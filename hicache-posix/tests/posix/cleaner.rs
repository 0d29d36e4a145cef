//! The capacity cleaner on real files: least recently used pages go first and reads count
//! as use; one cleaner per storage dir across processes; a page being read stays.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hicache_core::capacity::{CleanerScope, CleanerSettings};
use hicache_core::raw::{AlignedBuf, ObjectKey, ReadItem, Slice, StorageBackend, WriteItem};
use hicache_core::{MemKind, MemoryRegion, Result};
use hicache_posix::data_path::{DataPath, Direction, Transfer};
use hicache_posix::{EngineChoice, PosixBackend, PosixConfig, SyncMode, cleaner_of};

const PAGE: u64 = 4096;

fn settings(max_bytes: u64) -> CleanerSettings {
    CleanerSettings {
        high_watermark: 80.0,
        low_watermark: 50.0,
        max_bytes: Some(max_bytes),
        min_free_bytes: None,
        interval: Duration::from_millis(50),
        min_age: Duration::ZERO,
        max_removals_per_s: 100_000,
        scope: CleanerScope::Hicache,
    }
}

fn config(dir: &Path, cleaner: Option<CleanerSettings>) -> PosixConfig {
    PosixConfig {
        dirs: vec![dir.to_path_buf()],
        direct_io: false,
        engine: EngineChoice::Threads,
        threads: 2,
        queue_depth: 64,
        sync: SyncMode::None,
        spare_bytes: 0,
        cleaner,
        file_mode: 0o600,
        dir_mode: 0o700,
    }
}

/// Page `i`'s object name, in a hicache namespace.
fn key(i: u64) -> ObjectKey {
    ObjectKey::new(format!("page{i:03}.00112233aabbccdd")).unwrap()
}

/// A backend with one registered region of `pages` pages, page `i` filled with `i + 1`.
fn with_pages(
    cfg: &PosixConfig,
    pages: u64,
) -> (PosixBackend, MemoryRegion, hicache_core::raw::RegionId) {
    let b = PosixBackend::new(cfg).unwrap();
    let memory =
        MemoryRegion::from_aligned(AlignedBuf::zeroed((pages * PAGE) as usize, 4096).unwrap());
    for i in 0..pages {
        let mut t = memory.target(i * PAGE, PAGE, "test").unwrap();
        t.copy_from(0, &vec![i as u8 + 1; PAGE as usize]).unwrap();
    }
    let id = b.register(memory.clone()).unwrap();
    (b, memory, id)
}

/// Writes the region's pages `pages` under their own keys.
async fn write(b: &PosixBackend, id: hicache_core::raw::RegionId, pages: std::ops::Range<u64>) {
    write_from(b, id, pages.clone().map(key).collect(), pages.start).await;
}

/// Writes `keys` from the region's pages `first..`.
async fn write_from(
    b: &PosixBackend,
    id: hicache_core::raw::RegionId,
    keys: Vec<ObjectKey>,
    first: u64,
) {
    let segs: Vec<[Slice; 1]> = (first..first + keys.len() as u64)
        .map(|i| [Slice::new(id, i * PAGE, PAGE)])
        .collect();
    let items: Vec<WriteItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, segments)| WriteItem { key, segments })
        .collect();
    for r in b.write(&items).await {
        r.unwrap();
    }
}

async fn read(
    b: &PosixBackend,
    id: hicache_core::raw::RegionId,
    pages: &[u64],
) -> Vec<Result<hicache_core::ReadOutcome>> {
    let keys: Vec<ObjectKey> = pages.iter().map(|&i| key(i)).collect();
    let segs: Vec<[Slice; 1]> = pages
        .iter()
        .map(|&i| [Slice::new(id, i * PAGE, PAGE)])
        .collect();
    let items: Vec<ReadItem<'_>> = keys
        .iter()
        .zip(&segs)
        .map(|(key, segments)| ReadItem { key, segments })
        .collect();
    b.read(&items).await
}

fn stored(b: &PosixBackend, pages: std::ops::Range<u64>) -> Vec<u64> {
    pages.filter(|&i| b.object_path(&key(i)).exists()).collect()
}

/// Polls `done` every 20 ms for up to 20 s (a generous bound for a loaded machine; the
/// cleaner runs every 50 ms).
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// 20 pages against a budget of 25: at 80 % (20 pages) the cleaner evicts down to 50 %
/// (12 pages), least recently used first. Pages 0..5 were written first but read last, so
/// pages 5..13 go. The reads must count through the access times the cleaner sets: the
/// kernel's own `relatime` update happened already at the first read of every page.
#[test]
fn over_its_high_watermark_a_dir_comes_back_under_the_low_one_keeping_recent_reads() {
    let rt = runtime();
    for (label, parent) in super::parents() {
        let tmp = tempfile::tempdir_in(&parent).unwrap();
        let dir = tmp.path().join("root");
        // A first backend without a cleaner writes and reads every page once.
        let (plain, _m, id) = with_pages(&config(&dir, None), 20);
        rt.block_on(write(&plain, id, 0..20));
        let all: Vec<u64> = (0..20).collect();
        for r in rt.block_on(read(&plain, id, &all)) {
            assert!(r.unwrap().is_hit());
        }
        drop(plain);
        // The pages must be older than the reads to come, whatever the timestamp granularity.
        std::thread::sleep(Duration::from_millis(30));
        let mut s = settings(25 * PAGE);
        // Nothing is evicted until the reads below are recorded and touched.
        s.min_age = Duration::from_millis(1500);
        let (b, _m, id) = with_pages(&config(&dir, Some(s)), 20);
        for r in rt.block_on(read(&b, id, &[0, 1, 2, 3, 4])) {
            assert!(r.unwrap().is_hit());
        }
        eventually("the cleaner's pass", || stored(&b, 0..20).len() <= 12);
        let kept = stored(&b, 0..20);
        let want: Vec<u64> = (0..5).chain(13..20).collect();
        assert_eq!(kept, want, "{label}: the 8 least recently used pages go");
        let dirs = b.cleaner().expect("the cleaner runs");
        let pass = dirs[0].last_pass.clone().unwrap();
        assert!(dirs[0].elected, "{label}");
        let seen = cleaner_of(&dir).unwrap();
        assert!(seen.running, "{label}: the lock is held");
        assert!(
            seen.record
                .unwrap()
                .owner
                .ends_with(&format!("pid {}", std::process::id())),
            "{label}"
        );
        // The pass that evicted, or one after it that found nothing to do.
        assert!(pass.pages == 8 || pass.need_bytes == 0, "{label}: {pass:?}");
        drop(b);
        let seen = cleaner_of(&dir).unwrap();
        assert!(
            !seen.running,
            "{label}: closing the backend lets the dir go"
        );
    }
}

/// 20 pages against a budget of 25, 3 of them last used an hour ago and 17 just written,
/// with `min_age` 1.5 s: the first pass evicts the 3 and stops at the recent ones, leaving
/// 17 pages (68 %), under the high watermark but above the low one (12 pages). The dir
/// stays owed, and once the 17 age the passes take it down to 12.
#[test]
fn a_pass_cut_short_by_recent_pages_finishes_once_they_age() {
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let (plain, _m, id) = with_pages(&config(&dir, None), 20);
    rt.block_on(write(&plain, id, 0..20));
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    for i in 0..3 {
        std::fs::File::options()
            .write(true)
            .open(plain.object_path(&key(i)))
            .unwrap()
            .set_times(
                std::fs::FileTimes::new()
                    .set_accessed(long_ago)
                    .set_modified(long_ago),
            )
            .unwrap();
    }
    drop(plain);
    let mut s = settings(25 * PAGE);
    s.min_age = Duration::from_millis(1500);
    let (b, _m, _id) = with_pages(&config(&dir, Some(s)), 20);
    eventually("the pages used an hour ago go", || {
        stored(&b, 0..3).is_empty()
    });
    eventually("the dir back at its low watermark", || {
        stored(&b, 0..20).len() <= 12
    });
    let kept = stored(&b, 0..20);
    assert_eq!(
        kept.len(),
        12,
        "down to the low watermark, no further: {kept:?}"
    );
}

/// A writer that passes half the watermark band wakes the cleaner: with an interval of an
/// hour, the dir still comes back under its low watermark.
#[test]
fn writes_past_half_the_band_wake_the_cleaner() {
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let mut s = settings(40 * PAGE);
    s.interval = Duration::from_secs(3600);
    let (b, _m, id) = with_pages(&config(&dir, Some(s)), 40);
    // The first pass (at start) sets the trigger: half of 30 % of 40 pages, 6 pages, but
    // at least 1 MiB (256 pages of 4 KiB): write past it in batches.
    eventually("the first pass", || {
        b.cleaner().is_some_and(|d| d[0].last_pass.is_some())
    });
    for round in 0..8u64 {
        rt.block_on(write_from(
            &b,
            id,
            (round * 40..round * 40 + 40).map(key).collect(),
            0,
        ));
    }
    // The batch that takes the count past 1 MiB (256 pages) wakes it as it starts, when 240
    // pages are stored: the pass evicts at least 220 of them, down to 50 % of the budget
    // (20 pages).
    eventually("a pass woken by the writes", || {
        b.cleaner()
            .and_then(|d| d[0].last_pass.clone())
            .is_some_and(|p| p.pages >= 220)
    });
}

const SMALL_FS: &str = "HICACHE_TEST_CLEANER_SMALL_FS";

/// Not a test on its own: what [`a_full_filesystem_comes_back_under_its_low_watermark`] runs
/// in a private mount namespace, on the 1 MiB tmpfs mounted at `$HICACHE_TEST_CLEANER_SMALL_FS`.
#[test]
fn child_on_a_small_filesystem() {
    let Some(mount) = std::env::var_os(SMALL_FS) else {
        return;
    };
    let dir = Path::new(&mount).join("root");
    let used = || {
        let st = nix::sys::statvfs::statvfs(Path::new(&mount)).unwrap();
        let total = st.blocks() as f64;
        100.0 * (total - st.blocks_available() as f64) / total
    };
    let rt = runtime();
    // 220 pages of 4 KiB fill 86 % of the 256 blocks: past the high watermark (80 %).
    let (plain, _m, id) = with_pages(&config(&dir, None), 220);
    rt.block_on(write(&plain, id, 0..220));
    let all: Vec<u64> = (0..220).collect();
    for r in rt.block_on(read(&plain, id, &all)) {
        assert!(r.unwrap().is_hit());
    }
    drop(plain);
    let before = used();
    assert!(
        before > 80.0,
        "{before:.1} % used: not past the high watermark"
    );
    std::thread::sleep(Duration::from_millis(30));
    let mut s = settings(0);
    s.max_bytes = None;
    s.min_age = Duration::from_millis(1500);
    let (b, _m, id) = with_pages(&config(&dir, Some(s)), 220);
    for r in rt.block_on(read(&b, id, &[0, 1, 2, 3, 4])) {
        assert!(r.unwrap().is_hit());
    }
    // The cleaner frees what `statvfs` says is over; the lock file's record, rewritten after
    // the pass, may take a block of its own (0.4 % here).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let last = used();
        if last <= 50.4 {
            break;
        }
        let pass = b.cleaner().and_then(|d| d[0].last_pass.clone());
        assert!(
            Instant::now() < deadline,
            "still {last:.2} % used; last pass: {pass:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let kept = stored(&b, 0..220);
    let evicted: Vec<u64> = (0..220).filter(|i| !kept.contains(i)).collect();
    let n = evicted.len() as u64;
    assert_eq!(
        evicted,
        (5..5 + n).collect::<Vec<_>>(),
        "the least recently used go, the 5 read last stay"
    );
    println!(
        "small fs: {before:.1} % used, then {:.1} % after evicting {n} pages",
        used()
    );
}

/// The watermarks as percent of a real filesystem: a 1 MiB tmpfs (mounted in a private
/// user and mount namespace, so nothing outside the test sees it) filled past 80 % comes
/// back under 50 %, least recently used pages first and recently read ones kept.
#[test]
fn a_full_filesystem_comes_back_under_its_low_watermark() {
    let probe = std::process::Command::new("unshare")
        .args(["-rm", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED: cannot make a private mount namespace (`unshare -rm`: {:?}); the \
             percent-of-filesystem case needs one to mount a small tmpfs",
            probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("unshare")
        .arg("-rm")
        .arg("sh")
        .arg("-c")
        .arg(r#"mount -t tmpfs -o size=1m hicache-test "$0" && exec "$1" --exact cleaner::child_on_a_small_filesystem --nocapture"#)
        .arg(tmp.path())
        .arg(std::env::current_exe().unwrap())
        .env(SMALL_FS, tmp.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let line = text.lines().find(|l| l.starts_with("small fs:"));
    println!("{}", line.expect("the child ran its case"));
    assert!(
        std::fs::read_dir(tmp.path()).unwrap().next().is_none(),
        "the tmpfs was private to the child"
    );
}

/// Objects outside the scope, temporary and spare names, links and files at the root are
/// never removed, however far over its budget the dir is.
#[test]
fn only_pages_in_scope_are_evicted() {
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let (plain, _m, id) = with_pages(&config(&dir, None), 4);
    rt.block_on(write(&plain, id, 0..4));
    let bucket = plain.object_path(&key(0)).parent().unwrap().to_path_buf();
    drop(plain);
    let foreign = bucket.join("sglang_page_Qwen_0_1_k");
    let temp = bucket.join(".tmp-writer");
    let outside = tmp.path().join("outside");
    std::fs::write(&foreign, vec![1u8; 1 << 20]).unwrap();
    std::fs::write(&temp, vec![1u8; 1 << 20]).unwrap();
    std::fs::write(&outside, b"keep").unwrap();
    let link = bucket.join("link.00112233aabbccdd");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    std::fs::write(dir.join("notes.00112233aabbccdd"), b"keep").unwrap();
    let (b, _m, _id) = with_pages(&config(&dir, Some(settings(PAGE))), 4);
    eventually("the hicache pages go", || stored(&b, 0..4).is_empty());
    std::thread::sleep(Duration::from_millis(200));
    for kept in [
        &foreign,
        &temp,
        &outside,
        &dir.join("notes.00112233aabbccdd"),
    ] {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
    assert!(link.symlink_metadata().is_ok(), "the link was removed");
}

/// Two backends (two processes below, here the same process) on one dir: one holds the
/// dir's cleaner.
#[test]
fn one_cleaner_per_dir_within_a_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let a = PosixBackend::new(&config(&dir, Some(settings(1 << 30)))).unwrap();
    eventually("a is elected", || a.cleaner().unwrap()[0].elected);
    let b = PosixBackend::new(&config(&dir, Some(settings(1 << 30)))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!b.cleaner().unwrap()[0].elected, "a holds the dir");
    drop(a);
    eventually("b takes over", || b.cleaner().unwrap()[0].elected);
}

const CHILD_DIR: &str = "HICACHE_TEST_CLEANER_CHILD_DIR";

/// Not a test on its own: the process [`one_cleaner_per_dir_across_processes`] starts. It
/// opens a backend with a cleaner on the dir it is given and holds it until its stdin closes.
#[test]
fn child_process_holding_a_cleaner() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let _b = PosixBackend::new(&config(Path::new(&dir), Some(settings(1 << 30)))).unwrap();
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
}

/// A second process on the same dir runs the dir's cleaner only once the first has died
/// (killed: nothing of it runs to let go), through the lock the kernel drops.
#[test]
fn one_cleaner_per_dir_across_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cleaner::child_process_holding_a_cleaner",
            "--nocapture",
        ])
        .env(CHILD_DIR, &dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    eventually("the child runs the dir's cleaner", || {
        cleaner_of(&dir).is_ok_and(|s| {
            s.running
                && s.record
                    .is_some_and(|r| r.owner.ends_with(&format!("pid {pid}")))
        })
    });
    let b = PosixBackend::new(&config(&dir, Some(settings(1 << 30)))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!b.cleaner().unwrap()[0].elected, "the child holds the dir");
    child.kill().unwrap();
    child.wait().unwrap();
    eventually("this process takes over", || {
        b.cleaner().unwrap()[0].elected
    });
    let me = format!("pid {}", std::process::id());
    assert!(
        cleaner_of(&dir)
            .unwrap()
            .record
            .unwrap()
            .owner
            .ends_with(&me)
    );
}

/// Reads through this path wait at a gate until it opens.
#[derive(Debug, Default)]
struct Gated {
    open: AtomicBool,
    waiting: AtomicBool,
}

impl DataPath for Gated {
    fn accepts(&self, kind: MemKind) -> bool {
        kind == MemKind::Host
    }
    fn register(&self, _: &MemoryRegion) -> Result<()> {
        Ok(())
    }
    fn deregister(&self, _: &MemoryRegion) -> Result<()> {
        Ok(())
    }
    fn call(&self, _: Direction) -> &'static str {
        "gated pread/pwrite"
    }
    fn transfer(&self, t: &Transfer<'_>) -> std::io::Result<u64> {
        if t.direction() == Direction::Read {
            self.waiting.store(true, Ordering::SeqCst);
            while !self.open.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        super::data_path::host_transfer(t)
    }
    fn describe(&self) -> String {
        "a gated test path".into()
    }
}

/// A page is being read (its read waits at a gate for many cleaner passes) while the
/// cleaner must evict every page: it evicts all the others and keeps that one, and the read
/// returns its bytes whole.
#[test]
fn a_page_being_read_is_never_evicted() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    // Page 0 is written last, after the others are past `min_age`: the cleaner's first
    // passes, which may come before the read below has started, leave it alone.
    let min_age = Duration::from_millis(1500);
    let (plain, _m, id) = with_pages(&config(&dir, None), 6);
    rt.block_on(write(&plain, id, 1..6));
    std::thread::sleep(min_age + Duration::from_millis(100));
    rt.block_on(write(&plain, id, 0..1));
    let young_until = Instant::now() + min_age;
    drop(plain);
    let path = Arc::new(Gated::default());
    // A failing assertion must not leave the read waiting forever (the runtime's drop
    // would wait for it): the gate opens when the test ends, however it ends.
    struct OpenOnDrop(Arc<Gated>);
    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.open.store(true, Ordering::SeqCst);
        }
    }
    let _gate = OpenOnDrop(path.clone());
    let b = Arc::new(
        PosixBackend::with_data_path(
            "GATED",
            &config(
                &dir,
                Some(CleanerSettings {
                    min_age,
                    ..settings(PAGE)
                }),
            ),
            path.clone(),
        )
        .unwrap(),
    );
    let memory = MemoryRegion::from_aligned(AlignedBuf::zeroed(PAGE as usize, 4096).unwrap());
    let rid = b.register(memory.clone()).unwrap();
    let reader = {
        let b = b.clone();
        rt.spawn(async move {
            let k = key(0);
            let segments = [Slice::new(rid, 0, PAGE)];
            b.read(&[ReadItem {
                key: &k,
                segments: &segments,
            }])
            .await
        })
    };
    eventually("the read waits at the gate", || {
        path.waiting.load(Ordering::SeqCst)
    });
    eventually("the others go", || stored(&b, 1..6).is_empty());
    // Past `min_age`, and many more passes than the two intervals recent reads are kept
    // for: only the read in flight keeps the page now.
    std::thread::sleep(young_until.saturating_duration_since(Instant::now()));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stored(&b, 0..6), [0], "the page being read stays");
    path.open.store(true, Ordering::SeqCst);
    let got = rt.block_on(reader).unwrap();
    assert!(got[0].as_ref().unwrap().is_hit(), "{got:?}");
    let source = memory.source(0, PAGE, "test").unwrap();
    assert!(
        source.host_bytes().unwrap().iter().all(|&x| x == 1),
        "page 0's bytes"
    );
    eventually("once read, it goes too", || stored(&b, 0..1).is_empty());
}

/// A lock file that is not one (garbage, a FIFO, a link out of the dir) neither hangs nor
/// breaks `cleaner_of` or the cleaner, and nothing outside the dir is touched.
#[test]
fn a_hostile_lock_file_is_refused_without_harm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    std::fs::create_dir(&dir).unwrap();
    let lock = dir.join(hicache_posix::CLEANER_FILE);
    std::fs::write(&lock, b"\xff{not json").unwrap();
    let seen = cleaner_of(&dir).unwrap();
    assert!(!seen.running && seen.record.is_none());
    std::fs::remove_file(&lock).unwrap();
    nix::unistd::mkfifo(&lock, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let err = cleaner_of(&dir).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let b = PosixBackend::new(&config(&dir, Some(settings(1 << 30)))).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!b.cleaner().unwrap()[0].elected, "a FIFO is no lock");
    drop(b);
    std::fs::remove_file(&lock).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    std::os::unix::fs::symlink(&outside, &lock).unwrap();
    assert!(cleaner_of(&dir).is_err(), "a link is not followed");
    let b = PosixBackend::new(&config(&dir, Some(settings(1 << 30)))).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!b.cleaner().unwrap()[0].elected, "a link is no lock");
    drop(b);
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
}
