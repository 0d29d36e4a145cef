//! Capacity: what the cleaner of a storage dir keeps, and in which order it evicts.
//!
//! The file plugins run the cleaner (POSIX and the plugins built on its file layer); this
//! module holds what does not depend on where the bytes live, so that `hicache usage` shows
//! the same order the cleaner follows:
//!
//! - [`CleanerSettings`]: the validated `l3_cleaner_*` keys;
//! - [`CleanerSettings::need`]: how many bytes a storage dir must give back, from its
//!   filesystem's figures and the bytes of its objects;
//! - [`page_group`] and [`eviction_order`]: the objects of one page go together (SGLang's
//!   `_k`/`_v` halves), least recently used page first.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::key::Namespace;

/// Which objects the cleaner may evict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CleanerScope {
    /// Pages under hicache naming (names that end in a namespace), of any model or rank.
    #[default]
    Hicache,
    /// Every object in the bucket dirs, SGLang-named pages included.
    All,
}

impl fmt::Display for CleanerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CleanerScope::Hicache => "hicache",
            CleanerScope::All => "all",
        })
    }
}

impl CleanerScope {
    /// Whether an object named `name` is the cleaner's to evict.
    pub fn covers(self, name: &str) -> bool {
        match self {
            CleanerScope::All => true,
            CleanerScope::Hicache => Namespace::suffix_of(page_group(name)).is_some(),
        }
    }
}

/// The cleaner's settings, validated (see the `l3_cleaner_*` keys in the config reference).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CleanerSettings {
    /// Usage, percent, at which a storage dir is cleaned.
    pub high_watermark: f64,
    /// Usage, percent, down to which it is cleaned.
    pub low_watermark: f64,
    /// A budget of object bytes per storage dir; the watermarks then apply to it instead of
    /// the filesystem's size.
    pub max_bytes: Option<u64>,
    /// Free bytes kept on each storage dir's filesystem.
    pub min_free_bytes: Option<u64>,
    /// Time between passes.
    pub interval: Duration,
    /// Pages used more recently than this are never evicted.
    pub min_age: Duration,
    /// Most files removed per second.
    pub max_removals_per_s: u32,
    /// Which objects may be evicted.
    pub scope: CleanerScope,
}

/// What the cleaner knows of one storage dir when it decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DirSpace {
    /// The filesystem's size, bytes.
    pub total: u64,
    /// Bytes still free on it for this user.
    pub available: u64,
    /// Bytes of the objects in the dir (only needed with a budget).
    pub objects: u64,
}

impl CleanerSettings {
    /// Bytes written after which a cleaner should not wait for its next interval: half the
    /// watermark band of a dir of `capacity` bytes (its budget, or its filesystem's size),
    /// and at least 1 MiB. A writer faster than the band per interval then wakes the
    /// cleaner instead of overshooting by a whole interval of writes.
    pub fn early_pass_after(&self, capacity: u64) -> u64 {
        let band = (self.high_watermark - self.low_watermark).max(0.0) / 100.0;
        ((capacity as f64 * band / 2.0) as u64).max(1 << 20)
    }

    /// Bytes the dir must give back, 0 when it is not above a limit:
    ///
    /// - with a budget, objects at or above `high`% of `max_bytes` are cleaned down to
    ///   `low`% of it; without one, a filesystem at or above `high`% used is cleaned down to
    ///   `low`%;
    /// - with `min_free_bytes`, a filesystem with less free is cleaned until that much plus
    ///   the band (`high - low`% of the filesystem) is free.
    ///
    /// The largest of these wins.
    pub fn need(&self, space: DirSpace) -> u64 {
        let at_high = self
            .fill(space)
            .is_some_and(|(level, of)| level >= share(self.high_watermark, of));
        let mut need = if at_high { self.above_low(space) } else { 0 };
        if let Some(min_free) = self.min_free_bytes
            && space.available < min_free
        {
            let band = share(self.high_watermark - self.low_watermark, space.total);
            need = need.max((min_free + band).saturating_sub(space.available));
        }
        need
    }

    /// Bytes above the low watermark (of the budget, or of the filesystem without one),
    /// whether or not the dir reached its high watermark: what a cleaner still owes a dir
    /// whose last pass stopped at pages used within `min_age` before it got there.
    pub fn above_low(&self, space: DirSpace) -> u64 {
        self.fill(space).map_or(0, |(level, of)| {
            level.saturating_sub(share(self.low_watermark, of))
        })
    }

    /// What the watermarks are measured on: the dir's objects against the budget, or
    /// without one the filesystem's used bytes against its size (None when that is unknown).
    fn fill(&self, space: DirSpace) -> Option<(u64, u64)> {
        match self.max_bytes {
            Some(max) => Some((space.objects, max)),
            None if space.total > 0 => {
                Some((space.total.saturating_sub(space.available), space.total))
            }
            None => None,
        }
    }
}

/// `pct` % of `of` bytes.
fn share(pct: f64, of: u64) -> u64 {
    (of as f64 * pct / 100.0) as u64
}

/// The page an object belongs to: its name without SGLang's `_k`/`_v` half suffix. Every
/// object of a group is evicted together.
pub fn page_group(name: &str) -> &str {
    name.strip_suffix("_k")
        .or_else(|| name.strip_suffix("_v"))
        .unwrap_or(name)
}

/// One stored object the cleaner may evict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// Index of its storage dir.
    pub dir: usize,
    /// Its name.
    pub name: String,
    /// Its bytes.
    pub bytes: u64,
    /// When it was last read or written.
    #[serde(skip)]
    pub last_used: SystemTime,
    /// What the store needs to find it again and tell it from a replacement (opaque here).
    #[serde(skip)]
    pub token: u64,
}

/// The objects of one page, in eviction order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// [`page_group`] of its objects.
    pub page: String,
    /// The latest use of any of its objects.
    #[serde(skip)]
    pub last_used: SystemTime,
    /// Their bytes together.
    pub bytes: u64,
    /// The objects.
    pub objects: Vec<Candidate>,
}

/// Groups `candidates` by page, least recently used first (ties by name, so the order is
/// the same on every run).
pub fn eviction_order(mut candidates: Vec<Candidate>) -> Vec<Group> {
    candidates.sort_by(|a, b| page_group(&a.name).cmp(page_group(&b.name)));
    let mut groups: Vec<Group> = Vec::new();
    for c in candidates {
        match groups.last_mut() {
            Some(g) if g.page == page_group(&c.name) => {
                g.last_used = g.last_used.max(c.last_used);
                g.bytes = g.bytes.saturating_add(c.bytes);
                g.objects.push(c);
            }
            _ => groups.push(Group {
                page: page_group(&c.name).to_string(),
                last_used: c.last_used,
                bytes: c.bytes,
                objects: vec![c],
            }),
        }
    }
    groups.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.page.cmp(&b.page)));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CleanerSettings {
        crate::Config::default()
            .cleaner()
            .expect("enabled by default")
    }

    #[test]
    fn the_filesystem_band() {
        let s = settings();
        let space = |used: u64| DirSpace {
            total: 1000,
            available: 1000 - used,
            objects: 0,
        };
        assert_eq!(s.need(space(799)), 0);
        assert_eq!(s.need(space(800)), 100);
        assert_eq!(s.need(space(950)), 250);
        assert_eq!(
            s.need(DirSpace::default()),
            0,
            "an unknown size needs nothing"
        );
    }

    #[test]
    fn above_low_counts_from_the_low_watermark_even_under_the_high_one() {
        let s = settings();
        let fs = |used: u64| DirSpace {
            total: 1000,
            available: 1000 - used,
            objects: 0,
        };
        // The defaults: 80 % and 70 %.
        assert_eq!(s.above_low(fs(750)), 50, "between the watermarks");
        assert_eq!(s.above_low(fs(700)), 0);
        assert_eq!(s.above_low(fs(400)), 0);
        assert_eq!(s.above_low(DirSpace::default()), 0, "an unknown size");
        let impossible = DirSpace {
            total: 1000,
            available: 5000,
            objects: 0,
        };
        assert_eq!(
            s.above_low(impossible),
            0,
            "more free than the filesystem's size"
        );
        assert_eq!(s.need(impossible), 0);
        let budget = CleanerSettings {
            max_bytes: Some(1000),
            ..settings()
        };
        let objects = |objects: u64| DirSpace {
            total: 10_000,
            available: 10,
            objects,
        };
        assert_eq!(budget.above_low(objects(750)), 50);
        assert_eq!(budget.above_low(objects(100)), 0);
    }

    #[test]
    fn a_budget_counts_objects_not_the_filesystem() {
        let s = CleanerSettings {
            max_bytes: Some(1000),
            ..settings()
        };
        let space = |objects: u64| DirSpace {
            total: 10_000,
            available: 10,
            objects,
        };
        assert_eq!(
            s.need(space(799)),
            0,
            "a full filesystem alone is not the budget's"
        );
        assert_eq!(s.need(space(800)), 100);
        assert_eq!(s.need(space(1500)), 800);
    }

    #[test]
    fn min_free_space_cleans_to_it_plus_the_band() {
        let s = CleanerSettings {
            min_free_bytes: Some(300),
            ..settings()
        };
        let space = |available: u64| DirSpace {
            total: 1000,
            available,
            objects: 0,
        };
        assert_eq!(s.need(space(300)), 0);
        // 29 % used is under the watermarks; 299 free is under the floor: back to 300 + 100.
        assert_eq!(s.need(space(299)), 101);
        // 95 % used: the watermarks ask for 250, the floor for 300 + 100 - 50: the larger.
        assert_eq!(s.need(space(50)), 350);
    }

    #[test]
    fn halves_of_a_page_group_together_and_the_least_recent_page_goes_first() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let c = |name: &str, at: u64| Candidate {
            dir: 0,
            name: name.into(),
            bytes: 10,
            last_used: t(at),
            token: 0,
        };
        let order = eviction_order(vec![
            c("b_m_0_1_k", 5),
            c("a.0123456789abcdef", 7),
            c("b_m_0_1_v", 1),
            c("c_m_0_1_k", 3),
        ]);
        let pages: Vec<(&str, u64, usize)> = order
            .iter()
            .map(|g| (g.page.as_str(), g.bytes, g.objects.len()))
            .collect();
        assert_eq!(
            pages,
            [
                ("c_m_0_1", 10, 1),
                ("b_m_0_1", 20, 2),
                ("a.0123456789abcdef", 10, 1)
            ]
        );
        assert_eq!(
            order[1].last_used,
            t(5),
            "a page's use is its latest half's"
        );
    }

    #[test]
    fn the_default_scope_is_hicache_names() {
        assert!(CleanerScope::Hicache.covers("abc.0123456789abcdef"));
        assert!(CleanerScope::Hicache.covers("abc.0123456789abcdef_k"));
        assert!(!CleanerScope::Hicache.covers("abc_Qwen_0_1_k"));
        assert!(CleanerScope::All.covers("abc_Qwen_0_1_k"));
    }
}
