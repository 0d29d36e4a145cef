//! Reads, recorded for the cleaner: least recently *used* needs reads to count, and every
//! process sharing a storage dir must see them.
//!
//! A read puts its object's name here (no syscall, no allocation: the buffers are sized
//! once); the cleaner's thread takes the names each interval and sets each file's access
//! time to now (`utimensat`, atime only), where every process and host that shares the dir
//! sees it. A name read again within one interval is recorded once. Past [`CAPACITY`]
//! distinct names in one interval, further reads are not recorded (counted as dropped):
//! such a page was still written or read recently enough to be among the last evicted,
//! and the kernel's own `relatime` update covers a first read after a write.
//!
//! It is also the cleaner's in-process guard ([`UseLog::guard`]): it never removes an
//! object this process is reading (counted from before the read starts until it has ended,
//! its future dropped included), nor one whose read started in this interval or the one
//! before.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use hicache_core::raw::ObjectKey;

/// Distinct names recorded per interval.
pub(crate) const CAPACITY: usize = 4096;

#[derive(Debug)]
struct Uses {
    /// Hashes of the names recorded this interval.
    now: HashSet<u64>,
    /// Hashes of the names recorded the interval before.
    before: HashSet<u64>,
    /// The names recorded this interval, with their storage dir.
    names: Vec<(usize, ObjectKey)>,
    /// Reads not recorded because the interval was full.
    dropped: u64,
    /// Reads in flight, by name hash.
    active: HashMap<u64, u32>,
}

/// The reads of one backend since the cleaner last took them.
#[derive(Debug)]
pub(crate) struct UseLog {
    uses: Mutex<Uses>,
}

impl UseLog {
    pub(crate) fn new() -> Self {
        UseLog {
            uses: Mutex::new(Uses {
                now: HashSet::with_capacity(CAPACITY),
                before: HashSet::with_capacity(CAPACITY),
                names: Vec::with_capacity(CAPACITY),
                dropped: 0,
                active: HashMap::with_capacity(CAPACITY),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Uses> {
        self.uses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads of `keys` (each with its storage dir) are starting, under one lock;
    /// [`end`](Self::end) says when they have ended.
    pub(crate) fn record<'a>(&self, keys: impl Iterator<Item = (usize, &'a ObjectKey)>) {
        let mut uses = self.lock();
        for (dir, key) in keys {
            *uses.active.entry(key.hash()).or_insert(0) += 1;
            if uses.now.contains(&key.hash()) {
                continue;
            }
            if uses.names.len() == CAPACITY {
                uses.dropped += 1;
                continue;
            }
            uses.now.insert(key.hash());
            uses.names.push((dir, key.clone()));
        }
    }

    /// Reads of these names (each [`record`](Self::record)ed once) have ended.
    pub(crate) fn end<'a>(&self, keys: impl Iterator<Item = &'a ObjectKey>) {
        let mut uses = self.lock();
        for key in keys {
            if let Some(n) = uses.active.get_mut(&key.hash()) {
                *n -= 1;
                if *n == 0 {
                    uses.active.remove(&key.hash());
                }
            }
        }
    }

    /// Moves this interval's names into `into` (cleared first) and starts the next
    /// interval; returns the reads dropped since the last call.
    pub(crate) fn take(&self, into: &mut Vec<(usize, ObjectKey)>) -> u64 {
        into.clear();
        let mut uses = self.lock();
        std::mem::swap(&mut uses.names, into);
        let Uses { now, before, .. } = &mut *uses;
        std::mem::swap(now, before);
        now.clear();
        std::mem::take(&mut uses.dropped)
    }

    /// Runs `f` with a test of whether a name is being read, or its read started in this
    /// interval or the one before. No read can start while `f` runs, so an object `f`
    /// removes is one whose read had not started (it will miss) or one `f` was told about.
    pub(crate) fn guard<R>(&self, f: impl FnOnce(&dyn Fn(u64) -> bool) -> R) -> R {
        let uses = self.lock();
        let in_use = |hash: u64| {
            uses.active.contains_key(&hash)
                || uses.now.contains(&hash)
                || uses.before.contains(&hash)
        };
        f(&in_use)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> ObjectKey {
        ObjectKey::new(format!("k{i}")).unwrap()
    }

    #[test]
    fn a_name_is_recorded_once_per_interval_and_guarded_for_two() {
        let log = UseLog::new();
        log.record([(0, &key(1))].into_iter());
        log.record([(0, &key(1))].into_iter());
        log.record([(1, &key(2))].into_iter());
        let mut taken = Vec::new();
        assert_eq!(log.take(&mut taken), 0);
        assert_eq!(taken.len(), 2);
        assert!(log.guard(|in_use| in_use(key(1).hash())), "still guarded");
        log.end([key(1), key(1), key(2)].iter());
        log.take(&mut taken);
        assert!(taken.is_empty());
        assert!(
            !log.guard(|in_use| in_use(key(1).hash())),
            "two intervals on"
        );
    }

    #[test]
    fn a_read_in_flight_is_guarded_however_long_it_runs() {
        let log = UseLog::new();
        log.record([(0, &key(1))].into_iter());
        log.record([(0, &key(1))].into_iter());
        let mut taken = Vec::new();
        for _ in 0..3 {
            log.take(&mut taken);
        }
        assert!(log.guard(|in_use| in_use(key(1).hash())));
        log.end([key(1)].iter());
        assert!(
            log.guard(|in_use| in_use(key(1).hash())),
            "one of two still runs"
        );
        log.end([key(1)].iter());
        assert!(!log.guard(|in_use| in_use(key(1).hash())));
    }

    #[test]
    fn a_full_interval_drops_and_counts() {
        let log = UseLog::new();
        for i in 0..CAPACITY + 3 {
            log.record([(0, &key(i))].into_iter());
        }
        let mut taken = Vec::new();
        assert_eq!(log.take(&mut taken), 3);
        assert_eq!(taken.len(), CAPACITY);
    }
}
