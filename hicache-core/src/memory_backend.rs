//! The reference backend: objects in a hash map. It follows every rule of the
//! [`StorageBackend`] contract (registrations, bounds, alignment, per-item results, size
//! checks), so the connector and the conformance suite can be tested against it, and it
//! serves embedded uses where persistence is not wanted.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;

use crate::backend::{
    BackendInfo, BackendKind, Capability, ListCursor, ListPage, Listed, MissReason, ReadItem,
    ReadOutcome, StorageBackend, Usage, WriteItem,
};
use crate::error::Result;
use crate::key::ObjectKey;
use crate::memory::{MemoryRegion, RegionId, RegionTable, scatter_into};

const NAME: &str = "MEMORY";

/// Objects held in process memory.
#[derive(Debug)]
pub struct MemoryBackend {
    regions: RegionTable,
    objects: RwLock<HashMap<String, Arc<Vec<u8>>>>,
    alignment: u64,
    kind: BackendKind,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A backend with no alignment rule.
    pub fn new() -> Self {
        Self::with_alignment(1)
    }

    /// A backend that enforces direct-I/O style alignment of `align` bytes on every slice,
    /// to exercise alignment handling without a disk.
    pub fn with_alignment(align: u64) -> Self {
        MemoryBackend {
            regions: RegionTable::new(NAME),
            objects: RwLock::new(HashMap::new()),
            alignment: align.max(1),
            kind: BackendKind::Object,
        }
    }

    /// The same backend reporting itself as a FILE plugin: with no alignment rule, it stands
    /// for file storage without O_DIRECT (tmpfs before Linux 6.6, many FUSE filesystems),
    /// where a config may still ask for direct I/O.
    pub fn as_file_store(mut self) -> Self {
        self.kind = BackendKind::File;
        self
    }

    /// What this backend can do (no allocation: checked per item).
    fn capability(&self) -> Capability {
        Capability {
            direct_io: self.alignment > 1,
            io_alignment: self.alignment,
            host_memory: true,
            atomic_publish: true,
            max_segments: 1024,
            ..Capability::default()
        }
    }

    /// Number of stored objects.
    pub fn object_count(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A copy of an object's bytes (tests: corruption and layout checks).
    pub fn raw_object(&self, key: &str) -> Option<Vec<u8>> {
        self.objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|v| v.as_ref().clone())
    }

    /// Replaces an object's bytes (tests: simulate corruption, truncation, foreign writers).
    pub fn put_raw_object(&self, key: &str, bytes: Vec<u8>) {
        self.objects
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), Arc::new(bytes));
    }

    /// Names of all stored objects.
    pub fn object_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    fn what(key: &ObjectKey, i: usize) -> String {
        format!("segment {i} of {key}")
    }

    fn write_one(&self, item: &WriteItem<'_>) -> Result<()> {
        self.capability()
            .check_segments(item.key, item.segments.len())?;
        let mut bytes = Vec::with_capacity(item.len() as usize);
        for (i, s) in item.segments.iter().enumerate() {
            let src = self
                .regions
                .source_aligned(s, self.alignment, &Self::what(item.key, i))?;
            bytes.extend_from_slice(src.host_bytes()?);
        }
        self.objects
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(item.key.as_str().to_string(), Arc::new(bytes));
        Ok(())
    }

    fn read_one(&self, item: &ReadItem<'_>) -> Result<ReadOutcome> {
        self.capability()
            .check_segments(item.key, item.segments.len())?;
        let mut targets = item
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| {
                self.regions
                    .target_aligned(s, self.alignment, &Self::what(item.key, i))
            })
            .collect::<Result<Vec<_>>>()?;
        let object = self
            .objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(item.key.as_str())
            .cloned();
        let Some(object) = object else {
            return Ok(ReadOutcome::Miss(MissReason::NotFound));
        };
        let expected = item.len();
        if object.len() as u64 != expected {
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected,
                found: object.len() as u64,
            }));
        }
        scatter_into(NAME, &mut targets, &object)?;
        Ok(ReadOutcome::Hit)
    }
}

#[async_trait]
impl StorageBackend for MemoryBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: self.kind,
            capability: self.capability(),
            location: "process memory".into(),
        }
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        self.regions.register(region, &self.capability())
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        self.regions.deregister(id)
    }

    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        // Names in order; the cursor is the last name listed.
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = objects
            .keys()
            .filter(|n| n.starts_with(prefix))
            .filter(|n| cursor.is_none_or(|c| n.as_str() > c.0.as_str()))
            .collect();
        names.sort();
        let limit = limit.max(1);
        let more = names.len() > limit;
        names.truncate(limit);
        let mut page = ListPage::default();
        for n in names {
            page.objects.push(Listed::new(
                ObjectKey::new(n)?,
                objects[n].len() as u64,
                None,
            ));
        }
        if more {
            page.next = page
                .objects
                .last()
                .map(|l| ListCursor(l.key.as_str().to_string()));
        }
        Ok(page)
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        batch.iter().map(|item| self.write_one(item)).collect()
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        batch.iter().map(|item| self.read_one(item)).collect()
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        keys.iter()
            .map(|k| Ok(objects.contains_key(k.as_str())))
            .collect()
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        keys.iter()
            .map(|k| {
                objects.remove(k.as_str());
                Ok(())
            })
            .collect()
    }

    async fn usage(&self) -> Result<Usage> {
        let used = self
            .objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|v| v.len() as u64)
            .sum();
        Ok(Usage {
            used_bytes: Some(used),
            ..Usage::default()
        })
    }
}
