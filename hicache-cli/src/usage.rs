//! `hicache usage`: a plugin's capacity figures and what its listing holds, counted by
//! namespace (the 16 hex digits hicache puts at the end of object names) with bytes and ages.

use std::collections::BTreeMap;
use std::time::SystemTime;

use hicache::Result;
use hicache::capacity::{Candidate, CleanerScope, Group, eviction_order};
use hicache::raw::{ListWalk, Namespace, StorageBackend, Usage};
use serde::Serialize;

use crate::progress;

/// Objects of one namespace (or of names that carry none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NamespaceUsage {
    /// 16 hex digits as in object names; `None` for names without a namespace (SGLang
    /// naming, or objects that are not pages).
    pub namespace: Option<String>,
    /// Objects.
    pub objects: u64,
    /// Their bytes, as listed.
    pub bytes: u64,
    /// Age of the oldest, in seconds, when the storage knows when objects were written.
    pub oldest_age_s: Option<u64>,
    /// Age of the newest, in seconds, likewise.
    pub newest_age_s: Option<u64>,
    /// Seconds since the least recently used was last read or written, when the storage
    /// records reads (POSIX: access times) or writes.
    pub oldest_use_age_s: Option<u64>,
    /// Seconds since the most recently used was, likewise.
    pub newest_use_age_s: Option<u64>,
}

impl NamespaceUsage {
    fn add(&mut self, bytes: u64, age_s: Option<u64>, use_age_s: Option<u64>) {
        self.objects += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if let Some(age) = age_s {
            self.oldest_age_s = Some(self.oldest_age_s.map_or(age, |o| o.max(age)));
            self.newest_age_s = Some(self.newest_age_s.map_or(age, |n| n.min(age)));
        }
        if let Some(age) = use_age_s {
            self.oldest_use_age_s = Some(self.oldest_use_age_s.map_or(age, |o| o.max(age)));
            self.newest_use_age_s = Some(self.newest_use_age_s.map_or(age, |n| n.min(age)));
        }
    }
}

/// What `hicache usage` reports.
#[derive(Clone, Debug, Serialize)]
pub struct UsageReport {
    /// The plugin.
    pub plugin: String,
    /// Where it stores data.
    pub location: String,
    /// Its capacity figures.
    pub capacity: Usage,
    /// Only names starting with this were counted.
    pub prefix: String,
    /// Every listed object together.
    pub total: NamespaceUsage,
    /// By namespace, most bytes first.
    pub namespaces: Vec<NamespaceUsage>,
    /// The pages a cleaner with this scope would evict first, least recently used first
    /// (at most [`NEXT_TO_EVICT`]; all objects of a page together).
    pub next_to_evict: Vec<Group>,
}

/// How many pages [`UsageReport::next_to_evict`] lists.
pub const NEXT_TO_EVICT: usize = 10;

/// Capacity figures and every object `backend` lists under `prefix`, `page` per listing call,
/// and the pages a cleaner of `scope` would evict first. A plugin that cannot list is the
/// error it returns ([`hicache::Error::Unsupported`]).
pub async fn usage(
    backend: &dyn StorageBackend,
    prefix: &str,
    page: usize,
    scope: CleanerScope,
    show_progress: bool,
) -> Result<UsageReport> {
    let info = backend.info();
    let capacity = backend.usage().await?;
    let spinner = progress::spinner(show_progress, "usage");
    let now = SystemTime::now();
    let mut total = NamespaceUsage::default();
    let mut by_ns: BTreeMap<Option<String>, NamespaceUsage> = BTreeMap::new();
    let mut candidates = Vec::new();
    let mut walk = ListWalk::new(backend, prefix, page);
    let walked: Result<()> = async {
        while let Some(objects) = walk.next_page().await? {
            for object in &objects {
                // A clock set back shows as age 0, not as an error.
                let age_of = |t: SystemTime| now.duration_since(t).unwrap_or_default().as_secs();
                let age = object.modified.map(age_of);
                let use_age = object.last_used().map(age_of);
                let name = object.key.as_str();
                let ns = Namespace::suffix_of(hicache::capacity::page_group(name))
                    .map(str::to_ascii_lowercase);
                if scope.covers(name) {
                    candidates.push(Candidate {
                        dir: 0,
                        name: name.to_string(),
                        bytes: object.size,
                        last_used: object.last_used().unwrap_or(SystemTime::UNIX_EPOCH),
                        token: 0,
                    });
                }
                total.add(object.size, age, use_age);
                by_ns
                    .entry(ns.clone())
                    .or_insert_with(|| NamespaceUsage {
                        namespace: ns,
                        ..NamespaceUsage::default()
                    })
                    .add(object.size, age, use_age);
            }
            spinner.set_message(format!("{} objects", total.objects));
        }
        Ok(())
    }
    .await;
    spinner.finish_and_clear();
    walked?;
    let mut namespaces: Vec<NamespaceUsage> = by_ns.into_values().collect();
    namespaces.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.namespace.cmp(&b.namespace)));
    Ok(UsageReport {
        plugin: info.name,
        location: info.location,
        capacity,
        prefix: prefix.to_string(),
        total,
        namespaces,
        next_to_evict: eviction_order(candidates)
            .into_iter()
            .take(NEXT_TO_EVICT)
            .collect(),
    })
}
