//! Metrics the connector and the file plugins emit, through the [`metrics`] facade.
//!
//! A library only emits: nothing is recorded until the program installs a recorder
//! (`hicache::start_metrics` installs a Prometheus one from the config; any other
//! `metrics` recorder works too). Emissions happen once per batch call and once per
//! cleaner pass, never per page; a connector builds its metric keys when it opens, so a
//! batch call makes no keys or labels of its own (what the recorder does with a value is
//! the recorder's). Each emission looks the recorder up, so a recorder installed after the
//! connector opened still sees everything from then on.
//!
//! Names follow Prometheus conventions: `hicache_` prefix, base units (bytes, seconds),
//! `_total` on counters. Every connector metric carries a `backend` label (the plugin's
//! name); the cleaner's carry `dir`.

use std::time::Duration;

use metrics::{
    Key, Label, Level, Metadata, SharedString, Unit, counter, describe_counter, describe_gauge,
    describe_histogram, histogram,
};

use crate::backend::ReadOutcome;
use crate::error::{Error, Result};

/// Pages written and published, by `backend`.
pub const PAGES_WRITTEN: &str = "hicache_pages_written_total";
/// Payload bytes of the pages written, by `backend`.
pub const BYTES_WRITTEN: &str = "hicache_written_bytes_total";
/// Pages read and verified (hits), by `backend`.
pub const PAGE_HITS: &str = "hicache_page_hits_total";
/// Payload bytes of the hits, by `backend`.
pub const BYTES_READ: &str = "hicache_read_bytes_total";
/// Reads that found no valid page, by `backend` and `reason`: `not_found`, `torn`,
/// `bad_header`, `foreign`, `wrong_key`, `corrupt`.
pub const PAGE_MISSES: &str = "hicache_page_misses_total";
/// Pages whose write, read or removal failed, by `backend`, `op` and `kind` (the error's
/// [`Error::kind`]).
pub const PAGE_ERRORS: &str = "hicache_page_errors_total";
/// Pages found by existence checks, by `backend`.
pub const PAGES_FOUND: &str = "hicache_exists_found_pages_total";
/// Pages asked about by existence checks, by `backend`.
pub const PAGES_ASKED: &str = "hicache_exists_asked_pages_total";
/// Pages removed on request, by `backend`.
pub const PAGES_REMOVED: &str = "hicache_pages_removed_total";
/// Time of one batch call, by `backend` and `op` (`set`, `get`, `exists`, `remove`).
pub const BATCH_DURATION: &str = "hicache_batch_duration_seconds";
/// Cleaner passes, by `dir`.
pub const CLEANER_PASSES: &str = "hicache_cleaner_passes_total";
/// Cleaner passes that met an error, by `dir`.
pub const CLEANER_ERRORS: &str = "hicache_cleaner_errors_total";
/// Pages the cleaner evicted, by `dir`.
pub const EVICTED_PAGES: &str = "hicache_cleaner_evicted_pages_total";
/// Files the cleaner removed, by `dir`.
pub const EVICTED_FILES: &str = "hicache_cleaner_evicted_files_total";
/// Bytes the cleaner freed, by `dir`.
pub const EVICTED_BYTES: &str = "hicache_cleaner_evicted_bytes_total";
/// Bytes a dir had to give back when the last pass began (0: within its limits), by `dir`.
pub const CLEANER_NEED: &str = "hicache_cleaner_need_bytes";
/// Time of one cleaner pass, by `dir`.
pub const CLEANER_PASS_DURATION: &str = "hicache_cleaner_pass_duration_seconds";

/// Registers each metric's unit and help text with the installed recorder (what an
/// exporter shows as `# HELP`). Call it after installing one.
pub fn describe() {
    let counters = [
        (PAGES_WRITTEN, Unit::Count, "Pages written and published."),
        (
            BYTES_WRITTEN,
            Unit::Bytes,
            "Payload bytes of the pages written.",
        ),
        (PAGE_HITS, Unit::Count, "Pages read and verified."),
        (
            BYTES_READ,
            Unit::Bytes,
            "Payload bytes of the pages read and verified.",
        ),
        (
            PAGE_MISSES,
            Unit::Count,
            "Reads that found no valid page, by reason.",
        ),
        (
            PAGE_ERRORS,
            Unit::Count,
            "Pages whose operation failed, by operation and error kind.",
        ),
        (PAGES_FOUND, Unit::Count, "Pages existence checks found."),
        (
            PAGES_ASKED,
            Unit::Count,
            "Pages existence checks asked about.",
        ),
        (PAGES_REMOVED, Unit::Count, "Pages removed on request."),
        (CLEANER_PASSES, Unit::Count, "Cleaner passes."),
        (
            CLEANER_ERRORS,
            Unit::Count,
            "Cleaner passes that met an error.",
        ),
        (EVICTED_PAGES, Unit::Count, "Pages the cleaner evicted."),
        (EVICTED_FILES, Unit::Count, "Files the cleaner removed."),
        (EVICTED_BYTES, Unit::Bytes, "Bytes the cleaner freed."),
    ];
    for (name, unit, help) in counters {
        describe_counter!(name, unit, help);
    }
    describe_gauge!(
        CLEANER_NEED,
        Unit::Bytes,
        "Bytes the dir had to give back when the last cleaner pass began."
    );
    describe_histogram!(BATCH_DURATION, Unit::Seconds, "Time of one batch call.");
    describe_histogram!(
        CLEANER_PASS_DURATION,
        Unit::Seconds,
        "Time of one cleaner pass."
    );
}

/// The batch operations, as the `op` label names them (in the order of
/// `ConnectorMeters::durations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Set = 0,
    Get = 1,
    Exists = 2,
    Remove = 3,
}

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::Get => "get",
            Op::Exists => "exists",
            Op::Remove => "remove",
        }
    }
}

/// Where an emission comes from, for recorders that filter (the macros' equivalent).
static META: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The miss reasons, in [`MissReason::label`](crate::MissReason::label)'s words.
const MISS_REASONS: [&str; 6] = [
    "not_found",
    "torn",
    "bad_header",
    "foreign",
    "wrong_key",
    "corrupt",
];

/// What one connector emits. Its keys are built once, when it opens, so a batch call makes
/// none (a failed page's error, labelled by kind, does).
#[derive(Clone, Debug)]
pub(crate) struct ConnectorMeters {
    backend: SharedString,
    written: Key,
    written_bytes: Key,
    hits: Key,
    read_bytes: Key,
    misses: [Key; 6],
    asked: Key,
    found: Key,
    removed: Key,
    durations: [Key; 4],
}

fn add(key: &Key, n: u64) {
    if n > 0 {
        metrics::with_recorder(|r| r.register_counter(key, &META).increment(n));
    }
}

impl ConnectorMeters {
    pub(crate) fn new(backend: &str) -> Self {
        let backend = SharedString::from(std::sync::Arc::<str>::from(backend));
        let by_backend = |name: &'static str| {
            Key::from_parts(name, vec![Label::new("backend", backend.clone())])
        };
        let with = |name: &'static str, label: &'static str, value: &'static str| {
            Key::from_parts(
                name,
                vec![
                    Label::new("backend", backend.clone()),
                    Label::new(label, value),
                ],
            )
        };
        ConnectorMeters {
            written: by_backend(PAGES_WRITTEN),
            written_bytes: by_backend(BYTES_WRITTEN),
            hits: by_backend(PAGE_HITS),
            read_bytes: by_backend(BYTES_READ),
            misses: MISS_REASONS.map(|reason| with(PAGE_MISSES, "reason", reason)),
            asked: by_backend(PAGES_ASKED),
            found: by_backend(PAGES_FOUND),
            removed: by_backend(PAGES_REMOVED),
            durations: [Op::Set, Op::Get, Op::Exists, Op::Remove]
                .map(|op| with(BATCH_DURATION, "op", op.label())),
            backend,
        }
    }

    fn duration(&self, op: Op, took: Duration) {
        let key = &self.durations[op as usize];
        metrics::with_recorder(|r| r.register_histogram(key, &META).record(took.as_secs_f64()));
    }

    fn errors<'a>(&self, op: Op, errors: impl Iterator<Item = &'a Error>) {
        for e in errors {
            counter!(PAGE_ERRORS, "backend" => self.backend.clone(), "op" => op.label(), "kind" => e.kind())
                .increment(1);
        }
    }

    /// One `batch_set`: its pages written, their bytes, its errors.
    pub(crate) fn set<'a>(
        &self,
        took: Duration,
        written: u64,
        page_bytes: u64,
        errors: impl Iterator<Item = &'a Error>,
    ) {
        add(&self.written, written);
        add(&self.written_bytes, written.saturating_mul(page_bytes));
        self.errors(Op::Set, errors);
        self.duration(Op::Set, took);
    }

    /// One `batch_get`: hits and their bytes, misses by reason, errors.
    pub(crate) fn get(&self, took: Duration, results: &[Result<ReadOutcome>], page_bytes: u64) {
        let mut hits = 0u64;
        let mut misses = [0u64; 6];
        for r in results {
            match r {
                Ok(ReadOutcome::Hit) => hits += 1,
                Ok(ReadOutcome::Miss(reason)) => {
                    if let Some(i) = MISS_REASONS.iter().position(|l| *l == reason.label()) {
                        misses[i] += 1;
                    }
                }
                Err(_) => {}
            }
        }
        add(&self.hits, hits);
        add(&self.read_bytes, hits.saturating_mul(page_bytes));
        for (key, n) in self.misses.iter().zip(misses) {
            add(key, n);
        }
        self.errors(Op::Get, results.iter().filter_map(|r| r.as_ref().err()));
        self.duration(Op::Get, took);
    }

    /// One `batch_exists`: pages asked about, the prefix found.
    pub(crate) fn exists(&self, took: Duration, asked: usize, found: usize) {
        add(&self.asked, asked as u64);
        add(&self.found, found as u64);
        self.duration(Op::Exists, took);
    }

    /// One `batch_remove`: pages removed, errors.
    pub(crate) fn remove(&self, took: Duration, results: &[Result<()>]) {
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        add(&self.removed, ok);
        self.errors(Op::Remove, results.iter().filter_map(|r| r.as_ref().err()));
        self.duration(Op::Remove, took);
    }
}

/// What one cleaner pass emits (the file plugins' cleaner calls it).
#[derive(Clone, Copy, Debug, Default)]
pub struct CleanerPassMeters {
    /// Bytes the dir had to give back when the pass began.
    pub need_bytes: u64,
    /// Pages evicted.
    pub pages: u64,
    /// Files removed.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// How long the pass ran.
    pub took: Duration,
    /// Whether it met an error.
    pub failed: bool,
}

/// Emits one cleaner pass over `dir`.
pub fn cleaner_pass(dir: &std::path::Path, pass: &CleanerPassMeters) {
    let dir = metrics::SharedString::from(dir.display().to_string());
    counter!(CLEANER_PASSES, "dir" => dir.clone()).increment(1);
    if pass.failed {
        counter!(CLEANER_ERRORS, "dir" => dir.clone()).increment(1);
    }
    counter!(EVICTED_PAGES, "dir" => dir.clone()).increment(pass.pages);
    counter!(EVICTED_FILES, "dir" => dir.clone()).increment(pass.files);
    counter!(EVICTED_BYTES, "dir" => dir.clone()).increment(pass.bytes);
    metrics::gauge!(CLEANER_NEED, "dir" => dir.clone()).set(pass.need_bytes as f64);
    histogram!(CLEANER_PASS_DURATION, "dir" => dir).record(pass.took.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use crate::backend::MissReason;

    /// Every miss reason has its own key, labelled as the reason labels itself.
    #[test]
    fn every_miss_reason_has_a_key() {
        let reasons = [
            MissReason::NotFound,
            MissReason::SizeMismatch {
                expected: 1,
                found: 0,
            },
            MissReason::BadHeader {
                detail: String::new(),
            },
            MissReason::ForeignNamespace,
            MissReason::KeyMismatch,
            MissReason::ChecksumMismatch,
        ];
        let labels: Vec<&str> = reasons.iter().map(MissReason::label).collect();
        assert_eq!(labels, super::MISS_REASONS);
    }
}
