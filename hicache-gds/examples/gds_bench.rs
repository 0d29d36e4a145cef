//! GPU memory to storage and back, four ways, interleaved round by round:
//!
//! - `gds_mt`, `gds`: the plugins, built as selection builds them, moving pages of one
//!   registered device region (`write`/`read` calls of `--batch` pages, `--inflight` calls at
//!   once, `--threads` workers);
//! - `raw_cufile`: the floor a plugin stands on — `--threads` threads, each looping
//!   `cuFileWrite`/`cuFileRead` over its share of pre-created, pre-registered O_DIRECT files
//!   (one per page, overwritten in place: no create, no rename);
//! - `bounce`: the path without GDS — the POSIX plugin on page-locked host memory, each call
//!   copying its pages GPU → host before the write and host → GPU after the read
//!   (`cudaMemcpy`), with the same batches, calls in flight and threads.
//!
//! Every read lands in a second device region, checked against what was written after each
//! phase. Medians over `--rounds`, in GB/s, and each way's ratio to `raw_cufile`, are
//! printed and written as JSON to `--json FILE` when given.
//!
//! ```sh
//! cargo run --release -p hicache-gds --example gds_bench -- --dir DIR \
//!     [--cufile LIB] [--cudart LIB] [--pages 1024] [--page-kib 1024] [--batch 32] \
//!     [--inflight 2] [--threads 16] [--rounds 5] [--json FILE] \
//!     [--ways gds_mt,gds,bounce] [--gds-batch-limit N]
//! ```

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use hicache_core::raw::{
    AlignedBuf, DynBackend, ObjectKey, PluginContext, PluginDescriptor, ReadItem, RegionId, Slice,
    WriteItem, params_for,
};
use hicache_core::{ConfigLoader, MemoryRegion, ReadOutcome};
use hicache_gds::cuda::{CudaRuntime, copy_from_device, copy_to_device, device_region};
use hicache_gds::cufile::CuFile;

struct Args {
    dir: PathBuf,
    cufile: Option<PathBuf>,
    cudart: Option<PathBuf>,
    pages: usize,
    page_bytes: usize,
    batch: usize,
    inflight: usize,
    threads: usize,
    rounds: usize,
    json: Option<PathBuf>,
    /// The ways to run beside raw cuFile (all by default).
    ways: Vec<String>,
    /// GDS's `batch_limit`, when given.
    gds_batch_limit: Option<usize>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        dir: PathBuf::new(),
        cufile: None,
        cudart: None,
        pages: 1024,
        page_bytes: 1 << 20,
        batch: 32,
        inflight: 2,
        threads: 16,
        rounds: 5,
        json: None,
        ways: ["gds_mt", "gds", "bounce"].map(String::from).to_vec(),
        gds_batch_limit: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--dir" => a.dir = value()?.into(),
            "--cufile" => a.cufile = Some(value()?.into()),
            "--cudart" => a.cudart = Some(value()?.into()),
            "--pages" => a.pages = number(value()?)?,
            "--page-kib" => a.page_bytes = number(value()?)? * 1024,
            "--batch" => a.batch = number(value()?)?,
            "--inflight" => a.inflight = number(value()?)?,
            "--threads" => a.threads = number(value()?)?,
            "--rounds" => a.rounds = number(value()?)?,
            "--json" => a.json = Some(value()?.into()),
            "--ways" => {
                a.ways = value()?.split(',').map(String::from).collect();
                if let Some(w) = a
                    .ways
                    .iter()
                    .find(|w| !["gds_mt", "gds", "bounce"].contains(&w.as_str()))
                {
                    return Err(format!("--ways: unknown way {w} (gds_mt, gds, bounce)"));
                }
            }
            "--gds-batch-limit" => a.gds_batch_limit = Some(number(value()?)?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.dir.as_os_str().is_empty() {
        return Err("--dir DIR is required".into());
    }
    if a.pages == 0 || a.page_bytes == 0 || !a.page_bytes.is_multiple_of(4096) || a.batch == 0 {
        return Err("--pages and --batch must be positive, --page-kib a multiple of 4".into());
    }
    if a.inflight == 0 || a.threads == 0 || a.rounds == 0 {
        return Err("--inflight, --threads and --rounds must be positive".into());
    }
    Ok(a)
}

/// Opens `plugin` over `dir` as selection does: parameters checked, probe, build.
fn open(plugin: &'static PluginDescriptor, dir: &Path, a: &Args) -> Result<DynBackend, String> {
    let section = format!("plugin.{}", plugin.name.to_ascii_lowercase());
    let mut loader = ConfigLoader::new()
        .set("storage_dir", dir.display().to_string())
        .set(format!("{section}.threads"), a.threads as u64);
    if let (Some(lib), true) = (&a.cufile, plugin.name != "POSIX") {
        loader = loader.set(format!("{section}.cufile_path"), lib.display().to_string());
    }
    if let (Some(limit), true) = (a.gds_batch_limit, plugin.name == hicache_gds::GDS) {
        loader = loader.set(format!("{section}.batch_limit"), limit as u64);
    }
    let config = loader.load().map_err(|e| e.to_string())?;
    let params = params_for(plugin, &config).map_err(|e| e.to_string())?;
    let ctx = PluginContext::new(&config, &params);
    let probe = plugin.probe(&ctx);
    if !probe.verdict().is_usable() {
        return Err(format!("{}: {}", plugin.name, probe.verdict()));
    }
    plugin
        .build(&ctx.with_findings(probe.findings()))
        .map_err(|e| e.to_string())
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 4096) as u8) ^ (i as u8).wrapping_mul(31))
        .collect()
}

/// Bytes of a device region.
fn device_bytes(cuda: &CudaRuntime, r: &MemoryRegion) -> Result<Vec<u8>, String> {
    let s = r.source(0, r.len(), "check").map_err(|e| e.to_string())?;
    let mut out = vec![0; r.len() as usize];
    copy_from_device(cuda, &s, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn fill_device(cuda: &CudaRuntime, r: &MemoryRegion, bytes: &[u8]) -> Result<(), String> {
    let mut t = r.target(0, r.len(), "fill").map_err(|e| e.to_string())?;
    copy_to_device(cuda, &mut t, bytes).map_err(|e| e.to_string())
}

/// One way of moving pages: a phase's seconds.
trait Way {
    fn write(&self) -> Result<f64, String>;
    fn read(&self) -> Result<f64, String>;
}

/// A plugin moving device pages, or (`bounce`) the POSIX plugin moving host pages that
/// each call copies to or from the GPU.
struct Plugin {
    backend: DynBackend,
    runtime: tokio::runtime::Runtime,
    keys: Vec<ObjectKey>,
    /// Regions the backend moves: device (src, dst), or host staging for the bounce path.
    src: RegionId,
    dst: RegionId,
    bounce: Option<Bounce>,
    batch: usize,
    inflight: usize,
    page: u64,
}

/// The bounce path's regions: device pages and the page-locked host staging they pass.
struct Bounce {
    cuda: Arc<CudaRuntime>,
    device_src: MemoryRegion,
    device_dst: MemoryRegion,
    host_src: MemoryRegion,
    host_dst: MemoryRegion,
}

impl Plugin {
    fn phase(&self, write: bool) -> Result<f64, String> {
        let calls = self.keys.len().div_ceil(self.batch);
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let results: Vec<Result<(), String>> = self.runtime.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..self.inflight {
                let next = next.clone();
                tasks.push(async move {
                    loop {
                        let call = next.fetch_add(1, Ordering::Relaxed);
                        if call >= calls {
                            return Ok(());
                        }
                        self.call(call, write).await?;
                    }
                });
            }
            futures_join(tasks).await
        });
        let took = started.elapsed().as_secs_f64();
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        Ok(took)
    }

    async fn call(&self, call: usize, write: bool) -> Result<(), String> {
        let first = call * self.batch;
        let pages = first..(first + self.batch).min(self.keys.len());
        let at = first as u64 * self.page;
        let len = pages.len() as u64 * self.page;
        if let (Some(b), true) = (&self.bounce, write) {
            let s = b
                .device_src
                .source(at, len, "bounce")
                .map_err(|e| e.to_string())?;
            let mut t = b
                .host_src
                .target(at, len, "bounce")
                .map_err(|e| e.to_string())?;
            let host = t.host_bytes_mut().map_err(|e| e.to_string())?;
            copy_from_device(&b.cuda, &s, host).map_err(|e| e.to_string())?;
        }
        let region = if write { self.src } else { self.dst };
        let segs: Vec<[Slice; 1]> = pages
            .clone()
            .map(|i| [Slice::new(region, i as u64 * self.page, self.page)])
            .collect();
        if write {
            let items: Vec<WriteItem<'_>> = pages
                .clone()
                .zip(&segs)
                .map(|(i, s)| WriteItem {
                    key: &self.keys[i],
                    segments: s,
                })
                .collect();
            for r in self.backend.write(&items).await {
                r.map_err(|e| e.to_string())?;
            }
        } else {
            let items: Vec<ReadItem<'_>> = pages
                .clone()
                .zip(&segs)
                .map(|(i, s)| ReadItem {
                    key: &self.keys[i],
                    segments: s,
                })
                .collect();
            for r in self.backend.read(&items).await {
                match r.map_err(|e| e.to_string())? {
                    ReadOutcome::Hit => {}
                    miss => return Err(format!("a page read as {miss:?}")),
                }
            }
        }
        if let (Some(b), false) = (&self.bounce, write) {
            let s = b
                .host_dst
                .source(at, len, "bounce")
                .map_err(|e| e.to_string())?;
            let host = s.host_bytes().map_err(|e| e.to_string())?;
            let mut t = b
                .device_dst
                .target(at, len, "bounce")
                .map_err(|e| e.to_string())?;
            copy_to_device(&b.cuda, &mut t, host).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Waits for every future (the few calls in flight) on the current task.
async fn futures_join<F: std::future::Future<Output = Result<(), String>>>(
    tasks: Vec<F>,
) -> Vec<Result<(), String>> {
    let mut pinned: Vec<_> = tasks.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<Result<(), String>>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => *slot = Some(r),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
}

impl Way for Plugin {
    fn write(&self) -> Result<f64, String> {
        self.phase(true)
    }
    fn read(&self) -> Result<f64, String> {
        self.phase(false)
    }
}

/// `--threads` threads looping cuFileWrite/cuFileRead over pre-created files.
struct Raw {
    cufile: Arc<CuFile>,
    files: Vec<std::fs::File>,
    src: MemoryRegion,
    dst: MemoryRegion,
    threads: usize,
    page: usize,
}

impl Raw {
    /// Both phases with one set of threads: each registers its files' handles, then all
    /// write, then all read; the seconds of each phase.
    fn run(&self) -> Result<(f64, f64), String> {
        let gate = Barrier::new(self.threads + 1);
        let errors = std::sync::Mutex::new(Vec::new());
        let mut marks = [Instant::now(); 3];
        std::thread::scope(|scope| {
            for t in 0..self.threads {
                let (gate, errors) = (&gate, &errors);
                scope.spawn(move || {
                    let mine: Vec<usize> = (t..self.files.len()).step_by(self.threads).collect();
                    let handles: Result<Vec<_>, _> = mine
                        .iter()
                        .map(|&i| self.cufile.register_file(self.files[i].as_fd()))
                        .collect();
                    gate.wait();
                    let handles = match handles {
                        Ok(h) => h,
                        Err(e) => {
                            errors
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(e.to_string());
                            gate.wait();
                            return;
                        }
                    };
                    for (&i, h) in mine.iter().zip(&handles) {
                        let off = (i * self.page) as u64;
                        // SAFETY: `src` is registered device memory of every page, alive
                        // for the scope; each page is read by one thread.
                        let r = unsafe {
                            self.cufile
                                .write(h, self.src.addr() as *const _, self.page, 0, off)
                        };
                        if !matches!(r, Ok(n) if n == self.page) {
                            errors
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(format!("cuFileWrite: {r:?}"));
                        }
                    }
                    gate.wait();
                    for (&i, h) in mine.iter().zip(&handles) {
                        let off = (i * self.page) as u64;
                        // SAFETY: `dst` is registered device memory; each page is written
                        // by one thread.
                        let r = unsafe {
                            self.cufile
                                .read(h, self.dst.addr() as *mut _, self.page, 0, off)
                        };
                        if !matches!(r, Ok(n) if n == self.page) {
                            errors
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(format!("cuFileRead: {r:?}"));
                        }
                    }
                });
            }
            gate.wait();
            marks[0] = Instant::now();
            gate.wait();
            marks[1] = Instant::now();
        });
        marks[2] = Instant::now();
        let errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = errors.first() {
            return Err(format!("{} errors, first: {e}", errors.len()));
        }
        Ok((
            (marks[1] - marks[0]).as_secs_f64(),
            (marks[2] - marks[1]).as_secs_f64(),
        ))
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gds_bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let a = args()?;
    let total = a.pages * a.page_bytes;
    let cuda = Arc::new(CudaRuntime::load(a.cudart.as_deref()).map_err(|e| e.to_string())?);
    let cufile = Arc::new(CuFile::load(a.cufile.as_deref()).map_err(|e| e.to_string())?);
    cufile.open_driver().map_err(|e| e.to_string())?;
    let region = |what: &str| device_region(&cuda, 0, total).map_err(|e| format!("{what}: {e}"));
    let data = pattern(total);
    let zeros = vec![0u8; total];
    let (src, dst) = (region("device source")?, region("device target")?);
    fill_device(&cuda, &src, &data)?;

    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.inflight + 1)
            .build()
            .map_err(|e| e.to_string())
    };
    let keys = |way: &str| -> Result<Vec<ObjectKey>, String> {
        (0..a.pages)
            .map(|i| ObjectKey::new(format!("bench-{way}-{i:06}")).map_err(|e| e.to_string()))
            .collect()
    };
    let mut ways: Vec<(&str, Box<dyn Way>)> = Vec::new();
    for (name, plugin) in [
        ("gds_mt", &hicache_gds::GDS_MT_DESCRIPTOR),
        ("gds", &hicache_gds::GDS_DESCRIPTOR),
    ] {
        if !a.ways.iter().any(|w| w == name) {
            continue;
        }
        let backend = open(plugin, &a.dir.join(name), &a)?;
        let s = backend.register(src.clone()).map_err(|e| e.to_string())?;
        let d = backend.register(dst.clone()).map_err(|e| e.to_string())?;
        ways.push((
            name,
            Box::new(Plugin {
                backend,
                runtime: runtime()?,
                keys: keys(name)?,
                src: s,
                dst: d,
                bounce: None,
                batch: a.batch,
                inflight: a.inflight,
                page: a.page_bytes as u64,
            }),
        ));
    }
    if a.ways.iter().any(|w| w == "bounce") {
        // The bounce path's staging: page-locked host memory, as engines' host pools are.
        let host = |what: &str| -> Result<MemoryRegion, String> {
            let mut buf = AlignedBuf::zeroed(total, 4096).map_err(|e| format!("{what}: {e}"))?;
            // SAFETY: the buffer stays allocated inside the region, which outlives the run; the
            // process ends without unregistering it.
            if let Err(e) = unsafe { cuda.host_register(buf.as_mut_ptr(), total) } {
                // The stand-in runtime has no page-locking; NVIDIA's always has.
                println!("{what}: not page-locked ({e}); the bounce path copies pageable memory");
            }
            Ok(MemoryRegion::from_aligned(buf))
        };
        let (host_src, host_dst) = (host("host staging")?, host("host staging")?);
        let posix = open(&hicache_posix::DESCRIPTOR, &a.dir.join("bounce"), &a)?;
        let (s, d) = (
            posix
                .register(host_src.clone())
                .map_err(|e| e.to_string())?,
            posix
                .register(host_dst.clone())
                .map_err(|e| e.to_string())?,
        );
        ways.push((
            "bounce",
            Box::new(Plugin {
                backend: posix,
                runtime: runtime()?,
                keys: keys("bounce")?,
                src: s,
                dst: d,
                bounce: Some(Bounce {
                    cuda: cuda.clone(),
                    device_src: src.clone(),
                    device_dst: dst.clone(),
                    host_src,
                    host_dst,
                }),
                batch: a.batch,
                inflight: a.inflight,
                page: a.page_bytes as u64,
            }),
        ));
    }
    // The raw loop: its own device regions, registered with cuFile directly, and one
    // pre-created file per page.
    let (raw_src, raw_dst) = (region("raw source")?, region("raw target")?);
    fill_device(&cuda, &raw_src, &data)?;
    for r in [&raw_src, &raw_dst] {
        // SAFETY: the regions live until the process ends.
        unsafe { cufile.register_buffer(r.addr() as *const _, total) }
            .map_err(|e| e.to_string())?;
    }
    let raw_dir = a.dir.join("raw");
    std::fs::create_dir_all(&raw_dir).map_err(|e| e.to_string())?;
    let files = (0..a.pages)
        .map(|i| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_DIRECT)
                .open(raw_dir.join(format!("p{i:06}")))?;
            f.set_len(a.page_bytes as u64)?;
            Ok(f)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| format!("raw files: {e}"))?;
    let raw = Raw {
        cufile: cufile.clone(),
        files,
        src: raw_src,
        dst: raw_dst.clone(),
        threads: a.threads,
        page: a.page_bytes,
    };

    let mut seconds: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let gb = total as f64 / 1e9;
    for round in 0..a.rounds {
        // Interleaved: the ways take turns, starting one later each round.
        let n = ways.len() + 1;
        for k in 0..n {
            let turn = (k + round) % n;
            if turn == ways.len() {
                fill_device(&cuda, &raw_dst, &zeros)?;
                let (w, r) = raw.run()?;
                if device_bytes(&cuda, &raw_dst)? != data {
                    return Err(format!("raw_cufile round {round}: read back other bytes"));
                }
                let e = seconds.entry("raw_cufile").or_default();
                e.0.push(w);
                e.1.push(r);
                println!(
                    "round {round} raw_cufile: write {:.2} GB/s, read {:.2} GB/s",
                    gb / w,
                    gb / r
                );
                continue;
            }
            let (name, way) = &ways[turn];
            fill_device(&cuda, &dst, &zeros)?;
            let w = way.write()?;
            let r = way.read()?;
            if device_bytes(&cuda, &dst)? != data {
                return Err(format!("{name} round {round}: read back other bytes"));
            }
            let e = seconds.entry(name).or_default();
            e.0.push(w);
            e.1.push(r);
            println!(
                "round {round} {name}: write {:.2} GB/s, read {:.2} GB/s",
                gb / w,
                gb / r
            );
        }
    }
    let mut medians = BTreeMap::new();
    for (name, (w, r)) in &mut seconds {
        medians.insert(*name, (gb / median(w), gb / median(r)));
    }
    let (raw_w, raw_r) = medians["raw_cufile"];
    println!(
        "\nmedians over {} rounds, {} pages of {} KiB ({:.2} GB), batch {}, {} calls in flight, {} threads; mode: {}",
        a.rounds,
        a.pages,
        a.page_bytes / 1024,
        gb,
        a.batch,
        a.inflight,
        a.threads,
        if cufile.is_stand_in() {
            "the test stand-in"
        } else {
            match hicache_gds::probe::mode() {
                hicache_gds::probe::Mode::P2p => "P2P",
                hicache_gds::probe::Mode::Compat => "compat",
            }
        }
    );
    let mut json = String::from("{\n  \"medians_gbps\": {\n");
    let rows: Vec<String> = medians
        .iter()
        .map(|(name, (w, r))| {
            println!(
                "{name:>10}: write {w:.2} GB/s ({:.2}x raw), read {r:.2} GB/s ({:.2}x raw)",
                w / raw_w,
                r / raw_r
            );
            format!(
                "    \"{name}\": {{\"write\": {w:.3}, \"read\": {r:.3}, \"write_vs_raw\": {:.3}, \"read_vs_raw\": {:.3}}}",
                w / raw_w,
                r / raw_r
            )
        })
        .collect();
    json += &rows.join(",\n");
    json += &format!(
        "\n  }},\n  \"pages\": {}, \"page_bytes\": {}, \"batch\": {}, \"inflight\": {}, \"threads\": {}, \"rounds\": {}\n}}\n",
        a.pages, a.page_bytes, a.batch, a.inflight, a.threads, a.rounds
    );
    if let Some(path) = &a.json {
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
