//! Deliberately broken backends: the reference [`MemoryBackend`] with one [`Bug`] planted.
//!
//! A case that passes against every plugin, broken or not, proves nothing. Each case of the
//! suite names the bugs it must catch ([`Case::catches`](crate::Case)); the testkit's own tests
//! run it against a backend with each of them and require a failure. The bugs are the mistakes
//! plugin authors make (results out of step with items, names that collide, stale caches, I/O
//! that outlives its call), so a vendor can also run a case against one to see what it guards.
//!
//! ```
//! use hicache_testkit::broken::Bug;
//! use hicache_testkit::broken_suite;
//! use hicache_testkit::CaseError;
//!
//! let suite = broken_suite(Bug::RemoveDoesNothing).only(&["backend_remove"]);
//! assert!(matches!(suite.run_case("backend_remove"), Err(CaseError::Failed(_))));
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hicache_core::raw::{
    BackendInfo, ListCursor, ListPage, Listed, ObjectKey, ReadCheck, ReadItem, RegionId,
    RegionTable, Slice, StorageBackend, TargetSlice, Usage, WriteItem, WriteSeal,
};
use hicache_core::{Error, MemKind, MemoryBackend, MemoryRegion, MissReason, ReadOutcome, Result};

const NAME: &str = "BROKEN";

/// One planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// `info()` claims a capability no backend can have (zero segments per item).
    InfoLies,
    /// Every batch gets one result fewer than it has items.
    DropsLastResult,
    /// Every batch gets one result more than it has items (an empty batch, one error).
    ExtraResult,
    /// A batch's results come back in reverse order.
    ResultsReversed,
    /// Reads report hits without delivering bytes.
    ReadsDeliverNothing,
    /// A missing object is an error instead of a miss.
    MissIsError,
    /// A read of the wrong length is a hit.
    IgnoresSizeMismatch,
    /// `exists` says yes to everything.
    ExistsAlwaysTrue,
    /// `exists` of a missing object creates an empty one.
    ExistsCreates,
    /// `remove` reports success and keeps the object.
    RemoveDoesNothing,
    /// `remove` also deletes the object whose name sorts next.
    RemoveTakesNeighbour,
    /// Writing an existing name keeps the old object and reports success.
    FirstWriteWins,
    /// Reads are served from a cache that writes and removes do not invalidate.
    StaleReadCache,
    /// Reads return the bytes of the most recent write batch's item at the same position
    /// (a scratch buffer shared by batches, keyed by position instead of name).
    CrossTalk,
    /// Writes store an object without its last segment and report success.
    TornWrites,
    /// A write is visible half-done: first half of the bytes, then the rest.
    NonAtomicPublish,
    /// Writes of bad slices are dropped silently instead of rejected.
    SwallowsBadSlices,
    /// Items of more segments than `max_segments` are stored anyway.
    IgnoresSegmentLimit,
    /// One failed item fails every item of its batch.
    FailsWholeBatch,
    /// Device memory is accepted by a host-only backend.
    AcceptsDeviceMemory,
    /// `deregister` reports success and keeps the region.
    DeregisterIgnored,
    /// Every name is stored as one object.
    OneObjectForAllNames,
    /// Names are cut to their first 100 bytes.
    TruncatesLongNames,
    /// Names lose everything from their last `.` (the pool namespace of hicache naming).
    DropsNameSuffix,
    /// A new instance over the same storage has forgotten everything.
    ForgetsOnReopen,
    /// `usage` reports 0 bytes used, whatever is stored.
    UsageLies,
    /// `list` returns its first page as the last one.
    ListEndsAfterFirstPage,
    /// `list` still returns objects that were removed (a stale index).
    ListsRemovedObjects,
    /// A read dropped while pending keeps writing its target memory afterwards.
    WritesAfterDrop,
    /// A write dropped while pending still publishes, later, over newer writes: its bytes
    /// land right after the next write of the same key completes. (Tied to that write, not to
    /// a timer, so a case sees it however slow the machine is.)
    PublishesAfterDrop,
    /// `read_checked` answers without running the check: its hits are never checked.
    UncheckedReads,
    /// `write_sealed` answers without running the seal: objects are stored with their first
    /// segment as staged.
    UnsealedWrites,
}

impl Bug {
    /// Every bug.
    pub const ALL: &'static [Bug] = &[
        Bug::InfoLies,
        Bug::DropsLastResult,
        Bug::ExtraResult,
        Bug::ResultsReversed,
        Bug::ReadsDeliverNothing,
        Bug::MissIsError,
        Bug::IgnoresSizeMismatch,
        Bug::ExistsAlwaysTrue,
        Bug::ExistsCreates,
        Bug::RemoveDoesNothing,
        Bug::RemoveTakesNeighbour,
        Bug::FirstWriteWins,
        Bug::StaleReadCache,
        Bug::CrossTalk,
        Bug::TornWrites,
        Bug::NonAtomicPublish,
        Bug::SwallowsBadSlices,
        Bug::IgnoresSegmentLimit,
        Bug::FailsWholeBatch,
        Bug::AcceptsDeviceMemory,
        Bug::DeregisterIgnored,
        Bug::OneObjectForAllNames,
        Bug::TruncatesLongNames,
        Bug::DropsNameSuffix,
        Bug::ForgetsOnReopen,
        Bug::UsageLies,
        Bug::ListEndsAfterFirstPage,
        Bug::ListsRemovedObjects,
        Bug::WritesAfterDrop,
        Bug::PublishesAfterDrop,
        Bug::UncheckedReads,
        Bug::UnsealedWrites,
    ];
}

/// A dropped write's object name and bytes ([`Bug::PublishesAfterDrop`]).
type Unpublished = (String, Vec<u8>);

/// A [`MemoryBackend`] with `bug` planted. It declares itself persistent: within one trial,
/// every instance serves the same objects (unless the bug is [`Bug::ForgetsOnReopen`]).
#[derive(Debug)]
pub struct BrokenBackend {
    inner: Arc<MemoryBackend>,
    /// The same registrations, so bugs can pin and copy memory as a real engine would.
    regions: RegionTable,
    bug: Bug,
    /// [`Bug::StaleReadCache`]: bytes last read per name.
    cache: Mutex<HashMap<String, Vec<u8>>>,
    /// [`Bug::CrossTalk`]: the bytes of the last write batch, by position.
    last_batch: Mutex<Vec<Vec<u8>>>,
    /// [`Bug::ListsRemovedObjects`]: what was removed.
    removed: Mutex<Vec<ObjectKey>>,
    /// [`Bug::PublishesAfterDrop`]: the bytes of dropped writes, by name, still to publish.
    late_publish: Arc<Mutex<Vec<Unpublished>>>,
}

impl BrokenBackend {
    /// The reference backend (4096-byte direct-I/O alignment, so alignment and bounce cases
    /// run) with `bug` planted.
    pub fn new(bug: Bug) -> Self {
        BrokenBackend {
            inner: Arc::new(MemoryBackend::with_alignment(4096)),
            regions: RegionTable::new(NAME),
            bug,
            cache: Mutex::default(),
            last_batch: Mutex::default(),
            removed: Mutex::default(),
            late_publish: Arc::default(),
        }
    }

    /// The name the bug stores `key` under.
    fn stored_name(&self, key: &ObjectKey) -> ObjectKey {
        let name = key.as_str();
        let mapped = match self.bug {
            Bug::OneObjectForAllNames => "one-object",
            Bug::TruncatesLongNames => {
                let mut end = name.len().min(100);
                while !name.is_char_boundary(end) {
                    end -= 1;
                }
                &name[..end]
            }
            Bug::DropsNameSuffix => match name.rfind('.') {
                Some(dot) if dot > 0 => &name[..dot],
                _ => name,
            },
            _ => return key.clone(),
        };
        ObjectKey::new(mapped).unwrap_or_else(|_| key.clone())
    }

    fn names(&self, keys: impl Iterator<Item = ObjectKey>) -> Vec<ObjectKey> {
        keys.map(|k| self.stored_name(&k)).collect()
    }

    /// Applies the bugs that bend every batch's results.
    fn bend<T>(&self, mut results: Vec<Result<T>>) -> Vec<Result<T>> {
        match self.bug {
            Bug::DropsLastResult => {
                results.pop();
            }
            Bug::ExtraResult => results.push(Err(Error::backend(NAME, "an extra result"))),
            Bug::ResultsReversed => results.reverse(),
            Bug::FailsWholeBatch => {
                if let Some(msg) = results
                    .iter()
                    .find_map(|r| r.as_ref().err().map(ToString::to_string))
                {
                    return results
                        .iter()
                        .map(|_| Err(Error::backend(NAME, msg.clone())))
                        .collect();
                }
            }
            _ => {}
        }
        results
    }

    async fn write_items(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        let names = self.names(batch.iter().map(|i| i.key.clone()));
        let short: Vec<Vec<Slice>> = batch
            .iter()
            .map(|i| {
                let mut s = i.segments.to_vec();
                if self.bug == Bug::TornWrites && s.len() > 1 {
                    s.pop();
                }
                s
            })
            .collect();
        let items: Vec<WriteItem<'_>> = names
            .iter()
            .zip(&short)
            .map(|(key, segments)| WriteItem { key, segments })
            .collect();
        match self.bug {
            Bug::FirstWriteWins => {
                let mut out = Vec::with_capacity(items.len());
                for item in &items {
                    if self.inner.raw_object(item.key.as_str()).is_some() {
                        out.push(Ok(()));
                    } else {
                        out.extend(self.inner.write(std::slice::from_ref(item)).await);
                    }
                }
                out
            }
            Bug::NonAtomicPublish => {
                for item in &items {
                    if let Ok(mut bytes) = self.regions.gather(item.segments) {
                        let half = bytes.len() / 2;
                        bytes[half..].fill(0);
                        self.inner.put_raw_object(item.key.as_str(), bytes);
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                self.inner.write(&items).await
            }
            Bug::CrossTalk => {
                *self.last_batch.lock().unwrap_or_else(|e| e.into_inner()) = items
                    .iter()
                    .map(|i| self.regions.gather(i.segments).unwrap_or_default())
                    .collect();
                self.inner.write(&items).await
            }
            Bug::IgnoresSegmentLimit => {
                let mut out = Vec::with_capacity(items.len());
                for item in &items {
                    if item.segments.len() > self.inner.info().capability.max_segments as usize {
                        out.push(self.regions.gather(item.segments).map(|bytes| {
                            self.inner.put_raw_object(item.key.as_str(), bytes);
                        }));
                    } else {
                        out.extend(self.inner.write(std::slice::from_ref(item)).await);
                    }
                }
                out
            }
            Bug::SwallowsBadSlices => self
                .inner
                .write(&items)
                .await
                .into_iter()
                .map(|_| Ok(()))
                .collect(),
            _ => self.inner.write(&items).await,
        }
    }

    async fn read_items(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        let names = self.names(batch.iter().map(|i| i.key.clone()));
        let items: Vec<ReadItem<'_>> = names
            .iter()
            .zip(batch)
            .map(|(key, i)| ReadItem {
                key,
                segments: i.segments,
            })
            .collect();
        match self.bug {
            Bug::ReadsDeliverNothing => self
                .inner
                .exists(&names)
                .await
                .into_iter()
                .map(|r| {
                    r.map(|e| {
                        if e {
                            ReadOutcome::Hit
                        } else {
                            ReadOutcome::Miss(MissReason::NotFound)
                        }
                    })
                })
                .collect(),
            Bug::StaleReadCache => {
                let mut out = Vec::with_capacity(items.len());
                for item in &items {
                    let len: u64 = item.segments.iter().map(|s| s.len).sum();
                    let cached = self
                        .cache
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(item.key.as_str())
                        .filter(|b| b.len() as u64 == len)
                        .cloned();
                    if let Some(bytes) = cached {
                        out.push(
                            self.regions
                                .scatter(item.segments, &bytes)
                                .map(|()| ReadOutcome::Hit),
                        );
                        continue;
                    }
                    let r = self.inner.read(std::slice::from_ref(item)).await;
                    if let Some(Ok(ReadOutcome::Hit)) = r.first()
                        && let Ok(bytes) = self.regions.gather(item.segments)
                    {
                        self.cache
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(item.key.as_str().to_string(), bytes);
                    }
                    out.extend(r);
                }
                out
            }
            Bug::CrossTalk => {
                let out = self.inner.read(&items).await;
                let last = self.last_batch.lock().unwrap_or_else(|e| e.into_inner());
                for (i, item) in items.iter().enumerate() {
                    let len: u64 = item.segments.iter().map(|s| s.len).sum();
                    if let Some(bytes) = last.get(i).filter(|b| b.len() as u64 == len)
                        && matches!(out.get(i), Some(Ok(ReadOutcome::Hit)))
                    {
                        let _ = self.regions.scatter(item.segments, bytes);
                    }
                }
                out
            }
            Bug::MissIsError => self
                .inner
                .read(&items)
                .await
                .into_iter()
                .map(|r| match r {
                    Ok(ReadOutcome::Miss(MissReason::NotFound)) => {
                        Err(Error::backend(NAME, "object not found"))
                    }
                    other => other,
                })
                .collect(),
            Bug::IgnoresSizeMismatch => self
                .inner
                .read(&items)
                .await
                .into_iter()
                .map(|r| match r {
                    Ok(ReadOutcome::Miss(MissReason::SizeMismatch { .. })) => Ok(ReadOutcome::Hit),
                    other => other,
                })
                .collect(),
            _ => self.inner.read(&items).await,
        }
    }

    /// [`Bug::PublishesAfterDrop`]: publishes what dropped writes of `batch`'s keys left
    /// pending, over the write that just completed.
    fn publish_late(&self, batch: &[WriteItem<'_>]) {
        let late: Vec<Unpublished> = {
            let mut pending = self.late_publish.lock().unwrap_or_else(|e| e.into_inner());
            let (now, later) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|(name, _)| batch.iter().any(|i| i.key.as_str() == name));
            *pending = later;
            now
        };
        for (name, bytes) in late {
            self.inner.put_raw_object(&name, bytes);
        }
    }
}

/// Runs `late` if dropped before `disarm`: it leaves behind the I/O a buggy engine keeps
/// running after its caller gave up.
struct Late(Option<Box<dyn FnOnce() + Send>>);

impl Late {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Late {
    fn drop(&mut self) {
        if let Some(late) = self.0.take() {
            late();
        }
    }
}

#[async_trait]
impl StorageBackend for BrokenBackend {
    fn info(&self) -> BackendInfo {
        let mut info = self.inner.info();
        info.name = NAME.into();
        info.capability.persistent = true;
        if self.bug == Bug::InfoLies {
            info.capability.max_segments = 0;
        }
        info
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        if self.bug == Bug::AcceptsDeviceMemory && region.kind() != MemKind::Host {
            // An id no transfer can use: the bug is the acceptance itself.
            return Ok(RegionId(u64::MAX - 1));
        }
        let id = self.inner.register(region.clone())?;
        let mirrored = self.regions.insert(region);
        debug_assert_eq!(mirrored, id, "region ids stay in step");
        Ok(id)
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        if self.bug == Bug::DeregisterIgnored {
            return Ok(());
        }
        self.inner.deregister(id)?;
        self.regions.remove(id).map(drop)
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        if self.bug == Bug::PublishesAfterDrop {
            let late: Vec<Unpublished> = batch
                .iter()
                .filter_map(|i| {
                    Some((
                        i.key.as_str().to_string(),
                        self.regions.gather(i.segments).ok()?,
                    ))
                })
                .collect();
            let pending = self.late_publish.clone();
            let guard = Late(Some(Box::new(move || {
                pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(late);
            })));
            tokio::task::yield_now().await;
            guard.disarm();
        }
        let results = self.write_items(batch).await;
        if self.bug == Bug::PublishesAfterDrop {
            self.publish_late(batch);
        }
        self.bend(results)
    }

    async fn write_sealed(
        &self,
        batch: &[WriteItem<'_>],
        seal: &WriteSeal<'_>,
    ) -> Option<Vec<Result<()>>> {
        let _ = seal;
        if self.bug == Bug::UnsealedWrites {
            return Some(self.write(batch).await);
        }
        None
    }

    async fn read_checked(
        &self,
        batch: &[ReadItem<'_>],
        check: &ReadCheck<'_>,
    ) -> Option<Vec<Result<ReadOutcome>>> {
        let _ = check;
        if self.bug == Bug::UncheckedReads {
            return Some(self.read(batch).await);
        }
        None
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        if self.bug == Bug::WritesAfterDrop {
            let mut pins: Vec<TargetSlice> = batch
                .iter()
                .flat_map(|i| i.segments.iter())
                .filter_map(|s| self.regions.target(s).ok())
                .collect();
            let guard = Late(Some(Box::new(move || {
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(1));
                    for p in &mut pins {
                        let n = p.len();
                        let _ = p.copy_from(0, &vec![0xa5; n]);
                    }
                });
            })));
            tokio::task::yield_now().await;
            guard.disarm();
        }
        let results = self.read_items(batch).await;
        self.bend(results)
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        let names = self.names(keys.iter().cloned());
        let results = match self.bug {
            Bug::ExistsAlwaysTrue => keys.iter().map(|_| Ok(true)).collect(),
            Bug::ExistsCreates => {
                let found = self.inner.exists(&names).await;
                for (name, f) in names.iter().zip(&found) {
                    if matches!(f, Ok(false)) {
                        self.inner.put_raw_object(name.as_str(), Vec::new());
                    }
                }
                found
            }
            _ => self.inner.exists(&names).await,
        };
        self.bend(results)
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        let names = self.names(keys.iter().cloned());
        let results = match self.bug {
            Bug::RemoveDoesNothing => keys.iter().map(|_| Ok(())).collect(),
            Bug::RemoveTakesNeighbour => {
                let all = self.inner.object_names();
                let neighbours: Vec<ObjectKey> = names
                    .iter()
                    .filter_map(|n| all.iter().find(|o| o.as_str() > n.as_str()))
                    .filter_map(|o| ObjectKey::new(o.as_str()).ok())
                    .collect();
                let out = self.inner.remove(&names).await;
                self.inner.remove(&neighbours).await;
                out
            }
            _ => self.inner.remove(&names).await,
        };
        if self.bug == Bug::ListsRemovedObjects {
            self.removed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(names.iter().cloned());
        }
        self.bend(results)
    }

    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        let mut page = self.inner.list(prefix, cursor, limit).await?;
        if self.bug == Bug::ListEndsAfterFirstPage {
            page.next = None;
        }
        if self.bug == Bug::ListsRemovedObjects {
            let removed = self.removed.lock().unwrap_or_else(|e| e.into_inner());
            page.objects.extend(
                removed
                    .iter()
                    .filter(|k| k.as_str().starts_with(prefix))
                    .map(|k| Listed::new(k.clone(), 1, None)),
            );
        }
        Ok(page)
    }

    async fn usage(&self) -> Result<Usage> {
        let mut usage = self.inner.usage().await?;
        if self.bug == Bug::UsageLies {
            usage.used_bytes = Some(0);
        }
        Ok(usage)
    }
}
