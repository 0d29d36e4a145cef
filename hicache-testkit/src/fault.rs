//! `FaultyBackend`: wraps any backend and injects faults, deterministically by seed.
//!
//! It plays a *bad* plugin or a bad disk: EIO and ENOSPC, short writes and short (torn)
//! reads that it reports as success, latency, and batches that fail part-way. Cases prove the
//! connector turns all of it into per-page errors or misses — never wrong bytes, never a panic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use hicache_core::raw::{
    BackendInfo, DynBackend, ObjectKey, ReadItem, RegionId, Slice, StorageBackend, Usage, WriteItem,
};
use hicache_core::{Error, MemoryRegion, ReadOutcome, RegionPath, Result};

/// What to inject, each a probability per item (or per batch for `batch_cut`).
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Seed of the deterministic decisions.
    pub seed: u64,
    /// An item fails with EIO.
    pub eio: f64,
    /// A write fails with ENOSPC.
    pub enospc: f64,
    /// A write stores only a prefix of the object and reports success (a lying plugin).
    pub short_write: f64,
    /// A read fills only part of its segments (the rest is garbage) and reports a hit.
    pub short_read: f64,
    /// A batch fails from a random item onwards (connection lost mid-batch).
    pub batch_cut: f64,
    /// Delay added before each batch.
    pub latency: Option<Duration>,
}

/// How many faults of each kind were injected.
#[derive(Debug, Default)]
pub struct Injected {
    /// EIO errors.
    pub eio: AtomicU64,
    /// ENOSPC errors.
    pub enospc: AtomicU64,
    /// Short writes reported as success.
    pub short_writes: AtomicU64,
    /// Torn reads reported as hits.
    pub short_reads: AtomicU64,
    /// Items failed by batch cuts.
    pub cut_items: AtomicU64,
}

impl Injected {
    /// Total faults injected.
    pub fn total(&self) -> u64 {
        [
            &self.eio,
            &self.enospc,
            &self.short_writes,
            &self.short_reads,
            &self.cut_items,
        ]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum()
    }
}

/// A backend that misbehaves on purpose.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: DynBackend,
    plan: FaultPlan,
    sequence: AtomicU64,
    regions: RwLock<HashMap<RegionId, MemoryRegion>>,
    /// Counters of what was injected.
    pub injected: Arc<Injected>,
}

impl FaultyBackend {
    /// Wraps `inner`.
    pub fn new(inner: DynBackend, plan: FaultPlan) -> Self {
        FaultyBackend {
            inner,
            plan,
            sequence: AtomicU64::new(0),
            regions: RwLock::new(HashMap::new()),
            injected: Arc::new(Injected::default()),
        }
    }

    /// A deterministic number in [0, 1) for (batch, item, salt).
    fn roll(&self, batch: u64, item: usize, salt: u64) -> f64 {
        let mut z = self
            .plan
            .seed
            .wrapping_add(batch.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add((item as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_add(salt.wrapping_mul(0x94D0_49BB_1331_11EB));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn os_error(&self, code: i32, op: &'static str) -> Error {
        Error::io("FAULTY", op, None, std::io::Error::from_raw_os_error(code))
    }

    /// Index from which the batch is cut, if it is.
    fn cut(&self, batch: u64, len: usize) -> usize {
        if len > 0 && self.roll(batch, 0, 7) < self.plan.batch_cut {
            (self.roll(batch, 1, 8) * len as f64) as usize
        } else {
            len
        }
    }

    async fn delay(&self) {
        if let Some(d) = self.plan.latency {
            tokio::time::sleep(d).await;
        }
    }

    /// Overwrites the second half of the last segment with garbage.
    fn tear(&self, segments: &[Slice]) {
        let Some(last) = segments.last() else { return };
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let Some(region) = regions.get(&last.region) else {
            return;
        };
        if last.offset + last.len > region.len() || last.len < 2 {
            return;
        }
        let half = last.len / 2;
        // Through a write pin like any engine: the read that filled these bytes has ended.
        if let Ok(mut target) = region.target(last.offset + half, last.len - half, "torn read") {
            let n = target.len();
            let _ = target.copy_from(0, &vec![0xA5; n]);
        }
    }
}

#[async_trait]
impl StorageBackend for FaultyBackend {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        let id = self.inner.register(region.clone())?;
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, region);
        Ok(id)
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        self.inner.deregister(id)
    }

    fn region_path(&self, id: RegionId) -> RegionPath {
        self.inner.region_path(id)
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        self.delay().await;
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let cut = self.cut(seq, batch.len());
        let align = self.inner.info().capability.io_alignment.max(1);
        let mut results: Vec<Option<Result<()>>> = Vec::with_capacity(batch.len());
        let mut forwarded: Vec<WriteItem<'_>> = Vec::new();
        let mut shortened: Vec<Vec<Slice>> = Vec::new();
        let mut forwarded_at = Vec::new();
        for (i, item) in batch.iter().enumerate() {
            let r = self.roll(seq, i, 1);
            if i >= cut {
                self.injected.cut_items.fetch_add(1, Ordering::Relaxed);
                results.push(Some(Err(self.os_error(libc_eio(), "write (batch cut)"))));
            } else if r < self.plan.eio {
                self.injected.eio.fetch_add(1, Ordering::Relaxed);
                results.push(Some(Err(self.os_error(libc_eio(), "write"))));
            } else if r < self.plan.eio + self.plan.enospc {
                self.injected.enospc.fetch_add(1, Ordering::Relaxed);
                results.push(Some(Err(self.os_error(28, "write"))));
            } else if r < self.plan.eio + self.plan.enospc + self.plan.short_write {
                // Keep an aligned prefix: drop the last segment, or halve a single one.
                let mut segs = item.segments.to_vec();
                if segs.len() > 1 {
                    segs.pop();
                } else if let Some(s) = segs.first_mut() {
                    s.len = (s.len / 2) / align * align;
                }
                if segs.iter().map(|s| s.len).sum::<u64>() == 0 {
                    results.push(Some(Err(self.os_error(libc_eio(), "write"))));
                    continue;
                }
                self.injected.short_writes.fetch_add(1, Ordering::Relaxed);
                shortened.push(segs);
                forwarded_at.push((i, Some(shortened.len() - 1)));
                results.push(None);
            } else {
                forwarded_at.push((i, None));
                results.push(None);
            }
        }
        for (i, short) in &forwarded_at {
            forwarded.push(WriteItem {
                key: batch[*i].key,
                segments: match short {
                    Some(k) => &shortened[*k],
                    None => batch[*i].segments,
                },
            });
        }
        let inner = self.inner.write(&forwarded).await;
        if inner.len() != forwarded.len() {
            return out_of_step(batch.len(), inner.len(), forwarded.len());
        }
        for ((i, _), r) in forwarded_at.iter().zip(inner) {
            results[*i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.expect("every item decided"))
            .collect()
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        self.delay().await;
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let cut = self.cut(seq, batch.len());
        let mut results: Vec<Option<Result<ReadOutcome>>> = Vec::with_capacity(batch.len());
        let mut forwarded = Vec::new();
        let mut forwarded_at = Vec::new();
        for (i, item) in batch.iter().enumerate() {
            let r = self.roll(seq, i, 2);
            if i >= cut {
                self.injected.cut_items.fetch_add(1, Ordering::Relaxed);
                results.push(Some(Err(self.os_error(libc_eio(), "read (batch cut)"))));
            } else if r < self.plan.eio {
                self.injected.eio.fetch_add(1, Ordering::Relaxed);
                results.push(Some(Err(self.os_error(libc_eio(), "read"))));
            } else {
                forwarded.push(*item);
                forwarded_at.push(i);
                results.push(None);
            }
        }
        let inner = self.inner.read(&forwarded).await;
        if inner.len() != forwarded.len() {
            return out_of_step(batch.len(), inner.len(), forwarded.len());
        }
        for (k, (i, r)) in forwarded_at.iter().zip(inner).enumerate() {
            let torn =
                matches!(r, Ok(ReadOutcome::Hit)) && self.roll(seq, *i, 3) < self.plan.short_read;
            if torn {
                self.injected.short_reads.fetch_add(1, Ordering::Relaxed);
                self.tear(forwarded[k].segments);
            }
            results[*i] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.expect("every item decided"))
            .collect()
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        self.delay().await;
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        let mut out = self.inner.exists(keys).await;
        for (i, r) in out.iter_mut().enumerate() {
            if self.roll(seq, i, 4) < self.plan.eio {
                self.injected.eio.fetch_add(1, Ordering::Relaxed);
                *r = Err(self.os_error(libc_eio(), "exists"));
            }
        }
        out
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        self.inner.remove(keys).await
    }

    async fn usage(&self) -> Result<Usage> {
        self.inner.usage().await
    }
}

/// The wrapped plugin answered `got` results for `sent` items: passed on as a batch whose
/// result count is wrong too (one more than its items), so the connector's own check sees it
/// instead of this wrapper guessing which items the answers belong to.
fn out_of_step<T>(items: usize, got: usize, sent: usize) -> Vec<Result<T>> {
    (0..=items)
        .map(|_| {
            Err(Error::backend(
                "FAULTY",
                format!("the wrapped plugin returned {got} results for {sent} items"),
            ))
        })
        .collect()
}

const fn libc_eio() -> i32 {
    5
}
