//! `hicache usage`: a plugin's capacity figures and what its listing holds, counted by
//! namespace (the 16 hex digits hicache puts at the end of object names) with bytes and ages.

use std::collections::BTreeMap;
use std::time::SystemTime;

use hicache::Result;
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
}

impl NamespaceUsage {
    fn add(&mut self, bytes: u64, age_s: Option<u64>) {
        self.objects += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if let Some(age) = age_s {
            self.oldest_age_s = Some(self.oldest_age_s.map_or(age, |o| o.max(age)));
            self.newest_age_s = Some(self.newest_age_s.map_or(age, |n| n.min(age)));
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
}

/// Capacity figures and every object `backend` lists under `prefix`, `page` per listing call.
/// A plugin that cannot list is the error it returns ([`hicache::Error::Unsupported`]).
pub async fn usage(
    backend: &dyn StorageBackend,
    prefix: &str,
    page: usize,
    show_progress: bool,
) -> Result<UsageReport> {
    let info = backend.info();
    let capacity = backend.usage().await?;
    let spinner = progress::spinner(show_progress, "usage");
    let now = SystemTime::now();
    let mut total = NamespaceUsage::default();
    let mut by_ns: BTreeMap<Option<String>, NamespaceUsage> = BTreeMap::new();
    let mut walk = ListWalk::new(backend, prefix, page);
    let walked: Result<()> = async {
        while let Some(objects) = walk.next_page().await? {
            for object in &objects {
                // A clock set back shows as age 0, not as an error.
                let age = object
                    .modified
                    .map(|m| now.duration_since(m).unwrap_or_default().as_secs());
                let ns = Namespace::suffix_of(object.key.as_str()).map(str::to_ascii_lowercase);
                total.add(object.size, age);
                by_ns
                    .entry(ns.clone())
                    .or_insert_with(|| NamespaceUsage {
                        namespace: ns,
                        ..NamespaceUsage::default()
                    })
                    .add(object.size, age);
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
    })
}
