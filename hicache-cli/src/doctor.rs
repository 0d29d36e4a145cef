//! `hicache doctor`: the whole diagnosis, in order, with a verdict and a fix for each step.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hicache::raw::BackendInfo;
use hicache::{
    Config, Considered, HiCache, HiCacheOptions, HostSlots, MmapPool, ModeRule, PageKey,
    PluginRegistry, PoolGeometry, ReadOutcome, Selection, Source, StorageIdentity, TransferMode,
    choose_mode, gather_page, scatter_page,
};
use serde::Serialize;

use crate::progress;

/// Outcome of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// All good.
    Pass,
    /// Works, but not as well as it could, or not as the user may think.
    Warn,
    /// Does not work.
    Fail,
}

/// One step of the diagnosis.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Step name.
    pub name: String,
    /// Verdict.
    pub status: Status,
    /// What was found.
    pub details: Vec<String>,
    /// How to fix a problem.
    pub fixes: Vec<String>,
}

impl Step {
    fn new(name: impl Into<String>) -> Self {
        Step {
            name: name.into(),
            status: Status::Pass,
            details: Vec::new(),
            fixes: Vec::new(),
        }
    }

    fn warn(&mut self, detail: String, fix: impl Into<String>) {
        if self.status == Status::Pass {
            self.status = Status::Warn;
        }
        self.details.push(detail);
        self.fixes.push(fix.into());
    }

    fn fail(&mut self, detail: String, fix: impl Into<String>) {
        self.status = Status::Fail;
        self.details.push(detail);
        self.fixes.push(fix.into());
    }
}

/// What to diagnose besides the config.
#[derive(Clone, Debug)]
pub struct DoctorOptions {
    /// The pool geometry to check (alignment, transfer mode, round trip).
    pub geometry: PoolGeometry,
    /// Host pool size, bytes (from `--host-gib`, or ratio × device KV size).
    pub host_pool_bytes: u64,
    /// How the host pool size was derived, for the message.
    pub host_pool_origin: String,
    /// Pages in the live round trip.
    pub round_trip_pages: u64,
    /// Show which step runs on stderr when it is a terminal.
    pub progress: bool,
}

/// The diagnosis.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorReport {
    /// Steps in order.
    pub steps: Vec<Step>,
}

impl DoctorReport {
    /// Whether no step failed.
    pub fn ok(&self) -> bool {
        self.steps.iter().all(|s| s.status != Status::Fail)
    }

    /// A step by name.
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }
}

/// Runs every step over the plugins of `registry` (its error, two plugins of one name, is
/// reported as the plugins step's failure). Never panics; a failing step does not stop
/// later ones unless they need it.
pub async fn run(
    registry: hicache::Result<PluginRegistry>,
    config: &Config,
    opts: &DoctorOptions,
) -> DoctorReport {
    // Before any probe runs: probing creates missing dirs.
    let missing: Vec<PathBuf> = config
        .storage_dirs
        .value
        .iter()
        .filter(|d| !d.exists())
        .cloned()
        .collect();
    let spinner = progress::spinner(opts.progress, "doctor: checking the config");
    let mut steps = vec![config_step(config)];
    // Every plugin is probed once; selection, the dir checks and the build reuse it.
    spinner.set_message("doctor: probing every plugin");
    let (mut plugins, probed, selected) = plugins_step(registry, config);
    // The dirs as they were: opening the plugin adds this process's own spare dir.
    spinner.set_message("doctor: checking the storage dirs");
    let dirs = dirs_step(config, &missing, &probed);
    let backend = selected.and_then(|(registry, selection)| {
        spinner.set_message(format!("doctor: opening {}", selection.plugin.name));
        // The round trip must not start evicting pages from the dirs it checks.
        match registry.build(&config.without_cleaner("hicache doctor"), &selection) {
            Ok(backend) => Some(backend),
            Err(e) => {
                plugins.fail(
                    format!(
                        "{} is usable but failed to open: {e}",
                        selection.plugin.name
                    ),
                    "fix what the error names",
                );
                None
            }
        }
    });
    steps.push(plugins);
    steps.push(dirs);
    let info = backend.as_ref().map(|b| b.info());
    steps.push(geometry_step(config, opts, info.as_ref()));
    steps.push(memory_step(opts));
    spinner.set_message(format!(
        "doctor: round trip of {} pages",
        opts.round_trip_pages
    ));
    steps.push(round_trip_step(config, opts, backend).await);
    spinner.finish_and_clear();
    DoctorReport { steps }
}

fn config_step(config: &Config) -> Step {
    let mut step = Step::new("config");
    for e in config.entries() {
        step.details
            .push(format!("{} = {} [{}]", e.key, e.value, e.source));
        for (source, value) in &e.overridden {
            if matches!(source, Source::File(_) | Source::Inline)
                && matches!(e.source, Source::Env(_))
            {
                step.warn(
                    format!(
                        "{}: {} from {} overrides {value} from {source}",
                        e.key, e.value, e.source
                    ),
                    format!(
                        "unset {} or change the config file so they agree",
                        e.source.to_string().trim_start_matches("env ")
                    ),
                );
            }
        }
    }
    for w in &config.warnings {
        step.warn(w.clone(), "set only one of the two variables");
    }
    step
}

/// Probes every plugin and selects from those probes.
fn plugins_step(
    registry: hicache::Result<PluginRegistry>,
    config: &Config,
) -> (Step, Vec<Considered>, Option<(PluginRegistry, Selection)>) {
    let mut step = Step::new("plugins");
    let registry = match registry {
        Ok(r) => r,
        Err(e) => {
            step.fail(e.to_string(), "make plugin names unique");
            return (step, Vec::new(), None);
        }
    };
    let probed = registry.probe_all(config);
    for c in &probed {
        step.details.push(format!(
            "{} ({}, priority {}, {}): {}",
            c.name, c.kind, c.priority, c.origin, c.verdict
        ));
    }
    for r in registry.rejected() {
        step.warn(
            format!("plugin file not loaded: {}", r.reason),
            "fix or remove the file, or drop its dir from `plugin_dirs`",
        );
    }
    let selection = match registry.select_probed(config, &probed) {
        Ok(sel) => sel,
        Err(e) => {
            let fix = match &e {
                hicache::Error::PluginUnusable { hint: Some(h), .. } => h.clone(),
                _ => "enable a usable plugin, or fix what its probe reports".into(),
            };
            step.fail(e.to_string(), fix);
            return (step, probed, None);
        }
    };
    step.details.push(selection.summary());
    for w in &selection.warnings {
        step.warn(
            w.clone(),
            "register the plugin, or remove its section from the config",
        );
    }
    (step, probed, Some((registry, selection)))
}

fn dirs_step(config: &Config, missing: &[PathBuf], probed: &[Considered]) -> Step {
    let mut step = Step::new("storage dirs");
    for dir in &config.storage_dirs.value {
        if missing.contains(dir) {
            step.warn(
                format!("{} did not exist", dir.display()),
                format!("create it ahead of time (`mkdir -p {}`) on the disk you mean to use; the POSIX plugin creates it on open", dir.display()),
            );
        }
        check_dir(&mut step, dir, config.use_direct_io.value, probed);
        check_private(&mut step, dir);
        check_contents(&mut step, dir);
        check_cleaner(&mut step, dir, config);
    }
    step
}

/// Whether the dir's capacity cleaner runs, in which process, and what its last pass did.
#[cfg(feature = "posix")]
fn check_cleaner(step: &mut Step, dir: &Path, config: &Config) {
    let enabled = config.cleaner_enabled.value;
    match hicache::posix::cleaner_of(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => step.warn(
            format!(
                "{}: the cleaner's record cannot be read: {e}",
                dir.display()
            ),
            format!(
                "check the permissions of {}",
                dir.join(hicache::posix::CLEANER_FILE).display()
            ),
        ),
        Ok(seen) => {
            let who = seen
                .record
                .as_ref()
                .map_or_else(|| "an unknown process".to_string(), |r| r.owner.clone());
            let last = match seen.record.as_ref().and_then(|r| r.last_pass.as_ref()) {
                None => "no pass recorded".to_string(),
                Some(p) => format!(
                    "last pass at {} (unix s): needed {} bytes, evicted {} pages ({} files, {} bytes) in {} ms{}{}",
                    p.ended_unix_s,
                    p.need_bytes,
                    p.pages,
                    p.files,
                    p.bytes,
                    p.duration_ms,
                    if p.stopped_at_recent {
                        "; stopped at pages used within l3_cleaner_min_age_s"
                    } else {
                        ""
                    },
                    p.error
                        .as_ref()
                        .map(|e| format!("; error: {e}"))
                        .unwrap_or_default(),
                ),
            };
            if seen.running {
                step.details
                    .push(format!("{}: cleaner runs in {who}; {last}", dir.display()));
            } else if enabled {
                step.details.push(format!(
                    "{}: no cleaner runs now (l3_cleaner_enabled is true: the first engine to open the dir runs it); {last}",
                    dir.display()
                ));
            } else {
                step.details.push(format!(
                    "{}: no cleaner runs (l3_cleaner_enabled is false, from {}); the dir grows until writes fail",
                    dir.display(),
                    config.cleaner_enabled.source
                ));
            }
        }
    }
}

#[cfg(not(feature = "posix"))]
fn check_cleaner(_step: &mut Step, _dir: &Path, _config: &Config) {}

/// Pages come from users' prompts: a storage dir that others can read or write is a warning.
fn check_private(step: &mut Step, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        let who = if mode & 0o022 != 0 {
            "writable"
        } else {
            "readable"
        };
        step.warn(
            format!(
                "{}: mode {mode:#o}: {who} by other users (pages hold users' prompts)",
                dir.display()
            ),
            format!(
                "`chmod 700 {}` (hicache creates dirs 0700 and files 0600; dir_mode/file_mode change that)",
                dir.display()
            ),
        );
    }
}

/// What the POSIX probe found in `dir` (it examines every existing dir); a dir it did not
/// examine (missing before the run, or POSIX refused the config) is probed here.
#[cfg(feature = "posix")]
fn check_dir(step: &mut Step, dir: &Path, direct: bool, probed: &[Considered]) {
    let found = probed
        .iter()
        .find(|c| c.name == hicache::posix::NAME)
        .and_then(|c| c.findings.get::<hicache::posix::PosixFindings>())
        .filter(|f| f.config.direct_io == direct)
        .and_then(|f| f.dirs.iter().flatten().find(|p| p.path == dir).cloned());
    let outcome = match found {
        Some(p) => Ok(p),
        None => hicache::posix::probe_dir(dir, direct),
    };
    match outcome {
        Ok(p) => {
            let align = match (p.fs.dio_mem_align, p.fs.dio_offset_align) {
                (Some(m), Some(o)) => format!("DIOALIGN mem {m} / offset {o}"),
                _ => format!(
                    "no DIOALIGN reported (using {})",
                    hicache::posix::FALLBACK_ALIGN
                ),
            };
            step.details.push(format!(
                "{}: {}, {:.1} GiB free, {align}",
                dir.display(),
                p.fs.fs_type,
                p.free_bytes as f64 / (1u64 << 30) as f64
            ));
            match (p.direct_io, p.direct_io_error) {
                (Some(true), _) => step.details.push(format!("{}: aligned O_DIRECT write + read + verify ok", dir.display())),
                (Some(false), Some(e)) => step.warn(
                    format!("{}: {e}", dir.display()),
                    "put storage dirs on a filesystem with O_DIRECT (ext4, xfs), or set use_direct_io = false to choose buffered I/O knowingly",
                ),
                _ => step.details.push(format!("{}: buffered write + read + verify ok (use_direct_io = false)", dir.display())),
            }
        }
        Err(problem) => step.fail(problem.reason, problem.hint),
    }
}

/// Links planted under a root (the plugin refuses them) and the spare dirs of the processes
/// sharing it.
#[cfg(feature = "posix")]
fn check_contents(step: &mut Step, dir: &Path) {
    let Ok(found) = hicache::posix::inspect_root(dir) else {
        return; // the probe above already reported why the dir cannot be used
    };
    if !found.links.is_empty() {
        let shown: Vec<String> = found
            .links
            .iter()
            .take(10)
            .map(|p| p.display().to_string())
            .collect();
        step.fail(
            format!(
                "{}: {} symbolic link(s) under the storage dir, refused by the plugin (never followed): {}{}",
                dir.display(),
                found.links.len(),
                shown.join(", "),
                if found.links.len() > 10 { ", …" } else { "" }
            ),
            "remove them (`rm` on each path; it removes the link, not what it points to): only hicache's own dirs and files belong under a storage dir",
        );
    }
    if !found.misplaced.is_empty() {
        step.fail(
            format!(
                "{}: {} entr(ies) named like bucket dirs are not dirs: {}",
                dir.display(),
                found.misplaced.len(),
                found
                    .misplaced
                    .iter()
                    .take(10)
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "move them away: hicache keeps pages in the dirs 00..ff",
        );
    }
    step.details.push(format!(
        "{}: spare dirs: {} of running processes, {} of processes that are gone (removed by the next writer to start), {} whose owner cannot be proven gone (kept)",
        dir.display(),
        found.live_spare_dirs.len(),
        found.dead_spare_dirs.len(),
        found.unknown_spare_dirs.len()
    ));
    if !found.unknown_spare_dirs.is_empty() {
        step.warn(
            format!(
                "{}: spare dirs without a testable lock: {}",
                dir.display(),
                found.unknown_spare_dirs.join(", ")
            ),
            format!(
                "they come from an older hicache or another tool; remove them from {}/.hicache-spare once no such process runs",
                dir.display()
            ),
        );
    }
}

#[cfg(not(feature = "posix"))]
fn check_contents(_step: &mut Step, _dir: &Path) {}

#[cfg(not(feature = "posix"))]
fn check_dir(step: &mut Step, dir: &Path, _direct: bool, _probed: &[Considered]) {
    step.details.push(format!(
        "{}: not checked (this build has no FILE plugin)",
        dir.display()
    ));
}

fn geometry_step(config: &Config, opts: &DoctorOptions, info: Option<&BackendInfo>) -> Step {
    let mut step = Step::new("geometry");
    let g = &opts.geometry;
    step.details.push(g.to_string());
    let Some(info) = info else {
        step.warn(
            "no plugin could be opened, so the transfer mode is unknown".into(),
            "fix the plugins step first",
        );
        return step;
    };
    // Host pools are mmap'ed: the base is page-aligned.
    let cap = &info.capability;
    let (mode, reason) = choose_mode(g, Some(0), info, config);
    step.details
        .push(format!("transfer mode: {mode} ({reason})"));
    // Bounce only because the config asks for it?
    let forced = config.transfer_mode.value == hicache::TransferChoice::Bounce
        && hicache::decide_mode(g, Some(0), cap, ModeRule::of(config, info)).0
            == TransferMode::ZeroCopy;
    if mode == TransferMode::Bounce {
        let align = cap.io_alignment;
        let fix = if forced {
            "set transfer_mode = auto (or remove it) for zero-copy".to_string()
        } else {
            format!(
                "use page_first or page_first_direct with a page size whose spans are multiples of {align} bytes (e.g. more tokens per page) for zero-copy"
            )
        };
        step.warn(
            format!("pages are copied through bounce buffers: {reason}"),
            fix,
        );
    }
    step
}

/// `MemAvailable` from /proc/meminfo, bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

fn memory_step(opts: &DoctorOptions) -> Step {
    let mut step = Step::new("memory");
    let want = opts.host_pool_bytes;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match available_memory() {
        Some(avail) => {
            step.details.push(format!(
                "host pool {:.1} GiB ({}), available {:.1} GiB",
                gib(want),
                opts.host_pool_origin,
                gib(avail)
            ));
            if want > avail {
                step.fail(
                    format!("the host pool needs {:.1} GiB but only {:.1} GiB is available", gib(want), gib(avail)),
                    "lower --ratio (or --hicache-size) or free memory; a pool larger than memory swaps or is killed",
                );
            } else if want > avail / 10 * 9 {
                step.warn(
                    format!(
                        "the host pool takes over 90% of available memory ({:.1} of {:.1} GiB)",
                        gib(want),
                        gib(avail)
                    ),
                    "leave headroom for the engine and the page cache",
                );
            }
        }
        None => step.warn(
            "cannot read MemAvailable from /proc/meminfo".into(),
            "check the host pool size by hand",
        ),
    }
    check_huge_pages(
        &mut step,
        std::fs::read_to_string(THP_ENABLED).ok().as_deref(),
    );
    step
}

/// The kernel's transparent huge page mode, `[mode]` among the choices.
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The selected mode in the text of [`THP_ENABLED`] (`always [madvise] never` → `madvise`).
fn selected_mode(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once('[')?;
    let (mode, _) = rest.split_once(']')?;
    (!mode.is_empty() && mode.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .then_some(mode)
}

/// Whether pools that direct I/O moves can get huge pages (`HostPages::Huge`, which
/// `hicache bench` uses for them): direct I/O hands the device one segment per physically
/// contiguous run, and 4 KiB pages made O_DIRECT transfers much slower on a virtio disk.
/// `text`: [`THP_ENABLED`].
fn check_huge_pages(step: &mut Step, text: Option<&str>) {
    let Some(text) = text else {
        step.details.push(format!(
            "transparent huge pages: not offered by this kernel ({THP_ENABLED} is missing); pools made for direct I/O keep 4 KiB pages"
        ));
        return;
    };
    match selected_mode(text) {
        Some(mode @ ("always" | "madvise")) => step.details.push(format!(
            "transparent huge pages: {mode} (pools made for direct I/O, `HostPages::Huge`, ask for them)"
        )),
        Some("never") => step.warn(
            "transparent huge pages are off (`never`): pools made for direct I/O (`HostPages::Huge`) keep 4 KiB pages, and direct I/O from them hands the device a segment per page".into(),
            format!("`echo madvise > {THP_ENABLED}` (as root): such pools ask for huge pages themselves"),
        ),
        _ => step.warn(
            format!("cannot tell the transparent huge page mode from {THP_ENABLED}: {:?}", text.trim()),
            "check the setting by hand; pools made for direct I/O ask for huge pages where the kernel allows",
        ),
    }
}

async fn round_trip_step(
    config: &Config,
    opts: &DoctorOptions,
    backend: Option<hicache::raw::DynBackend>,
) -> Step {
    let mut step = Step::new("round trip");
    let Some(backend) = backend else {
        step.fail(
            "no plugin could be opened".into(),
            "fix the plugins step first",
        );
        return step;
    };
    let n = opts.round_trip_pages.max(1);
    let result = async {
        let cache = HiCache::with_backend(
            backend,
            config.clone(),
            HiCacheOptions::new(StorageIdentity::single("hicache-doctor")),
        )?;
        let geometry = opts.geometry.with_pages(2 * n)?;
        let pool = Arc::new(MmapPool::new(geometry)?);
        let report = cache.register_pool(pool.clone())?;
        let stamp = std::process::id();
        let keys: Vec<PageKey> = (0..n)
            .map(|i| PageKey::new(format!("doctor-{stamp:x}-{i}")))
            .collect::<hicache::Result<_>>()?;
        let mut expected = Vec::new();
        for p in 0..n {
            let bytes: Vec<u8> = (0..geometry.page_bytes())
                .map(|i| (i as u8) ^ (p as u8).wrapping_mul(37))
                .collect();
            scatter_page(pool.as_ref(), p, &bytes)?;
            expected.push(bytes);
        }
        let src: Vec<u64> = (0..n).collect();
        let dst: Vec<u64> = (n..2 * n).collect();
        let set = cache.batch_set(&keys, HostSlots::Pages(&src)).await?;
        let get = cache.batch_get(&keys, HostSlots::Pages(&dst)).await?;
        let _ = cache.batch_remove(&keys).await;
        let mut bad = Vec::new();
        for i in 0..n as usize {
            let mut got = vec![0u8; geometry.page_bytes() as usize];
            gather_page(pool.as_ref(), n + i as u64, &mut got)?;
            match (&set[i], &get[i]) {
                (Ok(_), Ok(ReadOutcome::Hit)) if got == expected[i] => {}
                (s, g) => bad.push(format!("page {i}: set {s:?}, get {g:?}")),
            }
        }
        Ok::<_, hicache::Error>((report, bad))
    }
    .await;
    match result {
        Ok((report, bad)) if bad.is_empty() => step.details.push(format!(
            "{n} pages written, read back and verified ({} mode, {} stored per page)",
            report.mode,
            hicache::ByteSize(report.stored_bytes_per_page)
        )),
        Ok((_, bad)) => step.fail(
            bad.join("; "),
            "see the errors above; run `hicache scrub` on the storage dirs",
        ),
        Err(e) => step.fail(
            e.to_string(),
            "see the error; it names the failing path or setting",
        ),
    }
    step
}

/// Status as a short label.
pub fn label(s: Status) -> &'static str {
    match s {
        Status::Pass => "PASS",
        Status::Warn => "WARN",
        Status::Fail => "FAIL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_huge_page_mode_is_read_from_the_kernels_text_and_nothing_else() {
        assert_eq!(selected_mode("always [madvise] never\n"), Some("madvise"));
        assert_eq!(selected_mode("[always] madvise never"), Some("always"));
        assert_eq!(selected_mode("always madvise [never]"), Some("never"));
        for hostile in [
            "",
            "madvise",
            "[",
            "]",
            "[]",
            "[mad vise]",
            "[\u{1b}[31m]",
            "x]y[z",
        ] {
            assert_eq!(selected_mode(hostile), None, "{hostile:?}");
        }
    }

    #[test]
    fn huge_pages_off_or_unknown_warn_with_a_fix_and_on_is_a_detail() {
        let step_for = |text: Option<&str>| {
            let mut step = Step::new("memory");
            check_huge_pages(&mut step, text);
            step
        };
        let on = step_for(Some("always [madvise] never"));
        assert_eq!(on.status, Status::Pass);
        assert!(on.details[0].contains("madvise"), "{on:?}");
        let off = step_for(Some("always madvise [never]"));
        assert_eq!(off.status, Status::Warn);
        assert!(off.fixes[0].contains("echo madvise"), "{off:?}");
        let garbled = step_for(Some("\u{0}\u{0}garbage"));
        assert_eq!(garbled.status, Status::Warn);
        assert!(garbled.details[0].contains("garbage"), "{garbled:?}");
        let missing = step_for(None);
        assert_eq!(missing.status, Status::Pass);
        assert!(missing.details[0].contains("4 KiB"), "{missing:?}");
    }
}
