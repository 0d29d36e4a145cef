//! A case that cannot fail is a bug: run cases against deliberately broken backends and
//! check that they fail.

use std::sync::Arc;

use async_trait::async_trait;
use hicache_core::{
    BackendInfo, DynBackend, MemoryBackend, MemoryRegion, ObjectKey, ReadItem, ReadOutcome,
    RegionId, RegionTable, Result, StorageBackend, TargetSlice, Usage, WriteItem,
};
use hicache_testkit::{CaseError, Suite, per_trial};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bug {
    /// Reads report hits without delivering bytes.
    ReadsDeliverNothing,
    /// `exists` says yes to everything.
    ExistsAlwaysTrue,
    /// Writes store a truncated object and report success.
    TornWrites,
    /// A read of the wrong length is a hit.
    IgnoresSizeMismatch,
    /// Writes of bad slices are silently dropped instead of rejected.
    SwallowsBadSlices,
    /// A read dropped while pending keeps writing its target memory afterwards.
    WritesAfterDrop,
    /// A write dropped while pending still publishes, later, over newer writes.
    PublishesAfterDrop,
}

#[derive(Debug)]
struct Broken {
    inner: Arc<MemoryBackend>,
    /// The same registrations, so the late-I/O bugs can pin memory as a real engine would.
    regions: RegionTable,
    bug: Bug,
}

/// Runs `late` on another thread if dropped before `disarm`: the I/O a buggy engine leaves
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
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                late();
            });
        }
    }
}

#[async_trait]
impl StorageBackend for Broken {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }
    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        let id = self.inner.register(region.clone())?;
        assert_eq!(self.regions.insert(region), id, "ids stay in step");
        Ok(id)
    }
    fn deregister(&self, id: RegionId) -> Result<()> {
        self.inner.deregister(id)?;
        self.regions.remove(id).map(drop)
    }
    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        match self.bug {
            Bug::PublishesAfterDrop => {
                let late: Vec<(String, Vec<u8>)> = batch
                    .iter()
                    .filter_map(|i| {
                        Some((
                            i.key.as_str().to_string(),
                            self.regions.gather(i.segments).ok()?,
                        ))
                    })
                    .collect();
                let inner = self.inner.clone();
                let guard = Late(Some(Box::new(move || {
                    for (k, bytes) in late {
                        inner.put_raw_object(&k, bytes);
                    }
                })));
                tokio::task::yield_now().await;
                guard.disarm();
                self.inner.write(batch).await
            }
            Bug::TornWrites => {
                let short: Vec<Vec<hicache_core::Slice>> = batch
                    .iter()
                    .map(|i| {
                        let mut s = i.segments.to_vec();
                        if s.len() > 1 {
                            s.pop();
                        }
                        s
                    })
                    .collect();
                let items: Vec<WriteItem<'_>> = batch
                    .iter()
                    .zip(&short)
                    .map(|(i, s)| WriteItem {
                        key: i.key,
                        segments: s,
                    })
                    .collect();
                self.inner.write(&items).await
            }
            Bug::SwallowsBadSlices => self
                .inner
                .write(batch)
                .await
                .into_iter()
                .map(|_| Ok(()))
                .collect(),
            _ => self.inner.write(batch).await,
        }
    }
    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        match self.bug {
            Bug::WritesAfterDrop => {
                let mut pins: Vec<TargetSlice> = batch
                    .iter()
                    .flat_map(|i| i.segments.iter())
                    .filter_map(|s| self.regions.target(s).ok())
                    .collect();
                let guard = Late(Some(Box::new(move || {
                    for p in &mut pins {
                        let n = p.len();
                        let _ = p.copy_from(0, &vec![0xa5; n]);
                    }
                })));
                tokio::task::yield_now().await;
                guard.disarm();
                self.inner.read(batch).await
            }
            Bug::ReadsDeliverNothing => self
                .inner
                .exists(&batch.iter().map(|i| i.key.clone()).collect::<Vec<_>>())
                .await
                .into_iter()
                .map(|r| {
                    r.map(|e| {
                        if e {
                            ReadOutcome::Hit
                        } else {
                            ReadOutcome::Miss(hicache_core::MissReason::NotFound)
                        }
                    })
                })
                .collect(),
            Bug::IgnoresSizeMismatch => self
                .inner
                .read(batch)
                .await
                .into_iter()
                .map(|r| match r {
                    Ok(ReadOutcome::Miss(hicache_core::MissReason::SizeMismatch { .. })) => {
                        Ok(ReadOutcome::Hit)
                    }
                    other => other,
                })
                .collect(),
            _ => self.inner.read(batch).await,
        }
    }
    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        if self.bug == Bug::ExistsAlwaysTrue {
            return keys.iter().map(|_| Ok(true)).collect();
        }
        self.inner.exists(keys).await
    }
    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        self.inner.remove(keys).await
    }
    async fn usage(&self) -> Result<Usage> {
        self.inner.usage().await
    }
}

fn suite(bug: Bug) -> Suite {
    Suite::new(format!("{bug:?}")).variant(
        "broken",
        None,
        per_trial(move || {
            Ok(Arc::new(Broken {
                inner: Arc::new(MemoryBackend::with_alignment(4096)),
                regions: RegionTable::new("BROKEN"),
                bug,
            }) as DynBackend)
        }),
    )
}

fn must_fail(bug: Bug, cases: &[&str]) {
    let s = suite(bug);
    for case in cases {
        match s.run_case(case) {
            Err(CaseError::Failed(_)) => {}
            other => panic!("{case} did not catch {bug:?}: {other:?}"),
        }
    }
}

#[test]
fn reads_that_deliver_nothing_are_caught() {
    must_fail(
        Bug::ReadsDeliverNothing,
        &[
            "backend_round_trip",
            "backend_multi_segment_gather_scatter",
            "backend_large_batch",
            "connector_round_trip_mha_page_first",
            "connector_round_trip_mla_layer_first",
            "connector_round_trip_bounce",
            "connector_batches_above_128_pages",
        ],
    );
}

#[test]
fn exists_that_lies_is_caught() {
    must_fail(
        Bug::ExistsAlwaysTrue,
        &[
            "backend_exists_reports_written_only",
            "backend_exists_creates_nothing",
            "connector_exists_stops_at_a_hole",
            "connector_exists_missing_first_is_zero",
            "connector_mha_pages_are_rank_specific",
            "connector_other_layout_misses",
        ],
    );
}

#[test]
fn torn_writes_are_caught() {
    must_fail(
        Bug::TornWrites,
        &[
            "backend_multi_segment_gather_scatter",
            "connector_round_trip_mha_page_first",
        ],
    );
}

#[test]
fn ignoring_size_mismatch_is_caught() {
    must_fail(
        Bug::IgnoresSizeMismatch,
        &["backend_size_mismatch_is_a_miss"],
    );
}

#[test]
fn swallowed_bad_slices_are_caught() {
    must_fail(
        Bug::SwallowsBadSlices,
        &[
            "backend_unregistered_region_rejected",
            "backend_out_of_range_slice_rejected",
            "backend_misaligned_slice_rejected",
            "backend_bad_item_does_not_fail_others",
        ],
    );
}

#[test]
fn io_after_a_dropped_read_is_caught() {
    must_fail(
        Bug::WritesAfterDrop,
        &[
            "cancel_dropped_read_moves_no_byte_afterwards",
            "cancel_dropped_calls_raw_zero_copy",
            "cancel_dropped_calls_envelope_zero_copy",
        ],
    );
}

#[test]
fn a_dropped_write_that_publishes_later_is_caught() {
    must_fail(
        Bug::PublishesAfterDrop,
        &[
            "cancel_dropped_calls_raw_zero_copy",
            "cancel_dropped_calls_raw_bounce",
        ],
    );
}

#[test]
fn the_suite_has_at_least_sixty_cases_with_unique_names() {
    let names = Suite::new("X").case_names();
    assert!(names.len() >= 60, "{} cases", names.len());
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len());
}
