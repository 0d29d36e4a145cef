//! The batch calls: pages in, pages out, existence, removal.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::backend::{MissReason, ReadItem, ReadOutcome, WriteItem};
use crate::error::Result;
use crate::key::{ObjectKey, PageKey};
use crate::memory::Access;

use crate::staging::StagingPool;

use super::plan::{fail_all, host_pages, lease, one_per_item};
use super::*;

impl HiCache {
    /// Writes pages. One result per key.
    ///
    /// Errors of the whole call (no pool registered, keys and slots that do not fit) come
    /// back as `Err` before any I/O.
    pub async fn batch_set(
        &self,
        keys: &[PageKey],
        slots: HostSlots<'_>,
    ) -> Result<Vec<Result<SetOutcome>>> {
        let state = self.current()?;
        let pages = host_pages(&state.shape, keys.len(), slots)?;
        Ok(self.set_pages(&state, keys, &pages).await)
    }

    /// Writes `keys` from the pool's `pages` (validated), in chunks of what one backend
    /// call and one staging chunk take.
    pub(super) async fn set_pages(
        &self,
        state: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<SetOutcome>> {
        if keys.is_empty() {
            return Vec::new();
        }
        if !state.writer {
            return (0..keys.len())
                .map(|_| Ok(SetOutcome::SkippedNotWriter))
                .collect();
        }
        let started = Instant::now();
        let per_call = (state.objects_per_call / state.parts.len()).max(1);
        let mut results = Vec::with_capacity(keys.len());
        for (kchunk, pchunk) in keys.chunks(per_call).zip(pages.chunks(per_call)) {
            results.extend(self.set_chunk(state, kchunk, pchunk).await);
        }
        let written = results
            .iter()
            .filter(|r| matches!(r, Ok(SetOutcome::Written)))
            .count();
        self.meters.set(
            started.elapsed(),
            written as u64,
            state.shape.page_bytes(),
            results.iter().filter_map(|r| r.as_ref().err()),
        );
        results
    }

    async fn set_chunk(
        &self,
        st: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<SetOutcome>> {
        let lease = match lease(&st.write_staging).await {
            Ok(l) => l,
            Err(e) => return fail_all(keys.len(), &e),
        };
        let chunk = lease.as_ref().map(|l| l.chunk());
        let slot_len = st.write_staging.as_ref().map_or(0, StagingPool::slot_len);
        // Zero-copy envelopes checksum the pool's spans. A backend that seals does it on the
        // thread that writes each object (its bytes are then still in cache for the write);
        // the headers are staged without their checksum until then.
        let sealed =
            st.mode == TransferMode::ZeroCopy && st.format == PageFormat::Envelope && !st.device;
        let unsummed: Result<u64> = Ok(0);
        let mut plan = st.plan_chunk(keys, pages, slot_len, |_, off, page, part, object, segs| {
            let sum = sealed.then_some(&unsummed);
            st.stage_write(chunk, off, page, part, object, segs, sum)
        });
        let live = plan.live();
        let items: Vec<WriteItem<'_>> = live
            .iter()
            .map(|&j| WriteItem {
                key: &plan.objects[j],
                segments: plan.segments_of(j),
            })
            .collect();
        let seal = |k: usize, payload: &[std::io::IoSlice<'_>], header: &mut [u8]| {
            let j = live.get(k).copied().ok_or_else(|| {
                Error::backend(
                    st.backend.info().name,
                    format!(
                        "sealed item {k} of a batch of {} (a plugin bug)",
                        live.len()
                    ),
                )
            })?;
            let part = &st.parts[plan.owners[j].1];
            st.seal(&plan.objects[j], part, payload, header)
        };
        let written = match sealed {
            true => st.backend.write_sealed(&items, &seal).await,
            false => None,
        };
        let outcomes = match written {
            Some(outcomes) => one_per_item(st.backend.as_ref(), "write", items.len(), outcomes),
            None if sealed => {
                // The backend does not seal: the checksums are taken here, on two threads
                // for a large chunk, and the headers completed before the write.
                let chunk = chunk.expect("enveloped zero-copy pools stage headers");
                let sums = split_over_two_threads(&live, st.parts[0].payload_len, |&j| {
                    let (i, p) = plan.owners[j];
                    st.pool_checksum(pages[i], &st.parts[p])
                });
                let mut outcomes: Vec<Option<Result<()>>> = Vec::with_capacity(live.len());
                let mut ready = Vec::with_capacity(live.len());
                for (k, (&j, sum)) in live.iter().zip(sums).enumerate() {
                    let slot = j as u64 * slot_len;
                    let part = &st.parts[plan.owners[j].1];
                    match sum
                        .and_then(|sum| st.put_header(chunk, slot, &plan.objects[j], part, sum))
                    {
                        Ok(()) => {
                            ready.push(items[k]);
                            outcomes.push(None);
                        }
                        Err(e) => outcomes.push(Some(Err(e))),
                    }
                }
                let written = st.backend.write(&ready).await;
                let mut written =
                    one_per_item(st.backend.as_ref(), "write", ready.len(), written).into_iter();
                outcomes
                    .into_iter()
                    .map(|o| o.or_else(|| written.next()).unwrap_or(Ok(())))
                    .collect()
            }
            None => {
                let written = st.backend.write(&items).await;
                one_per_item(st.backend.as_ref(), "write", items.len(), written)
            }
        };
        for (&j, outcome) in live.iter().zip(outcomes) {
            let page = plan.owners[j].0;
            if let Err(e) = outcome
                && plan.failed[page].is_none()
            {
                plan.failed[page] = Some(e);
            }
        }
        let page_bytes = st.shape.page_bytes();
        plan.failed
            .into_iter()
            .map(|failed| match failed {
                None => {
                    self.counters.pages_written.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .bytes_written
                        .fetch_add(page_bytes, Ordering::Relaxed);
                    Ok(SetOutcome::Written)
                }
                Some(e) => {
                    self.counters.page_errors.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
            })
            .collect()
    }

    /// Reads pages into host slots. One result per key: `Hit`, `Miss(reason)`, or an error.
    ///
    /// A miss in zero-copy mode may leave the target host page partly overwritten (the bytes
    /// land in place before they can be verified); in bounce and anchor mode the host page is
    /// untouched unless the read is a verified hit.
    pub async fn batch_get(
        &self,
        keys: &[PageKey],
        slots: HostSlots<'_>,
    ) -> Result<Vec<Result<ReadOutcome>>> {
        let state = self.current()?;
        let pages = host_pages(&state.shape, keys.len(), slots)?;
        Ok(self.get_pages(&state, keys, &pages).await)
    }

    /// Reads `keys` into the pool's `pages` (validated), in chunks of what one backend call
    /// and one staging chunk take.
    pub(super) async fn get_pages(
        &self,
        state: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<ReadOutcome>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let started = Instant::now();
        let per_call = (state.objects_per_call / state.parts.len()).max(1);
        let mut results = Vec::with_capacity(keys.len());
        for (kchunk, pchunk) in keys.chunks(per_call).zip(pages.chunks(per_call)) {
            results.extend(self.get_chunk(state, kchunk, pchunk).await);
        }
        self.meters
            .get(started.elapsed(), &results, state.shape.page_bytes());
        results
    }

    async fn get_chunk(
        &self,
        st: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<ReadOutcome>> {
        if st.mode == TransferMode::ZeroCopy && !st.memory.is_empty() {
            // A write whose call was dropped may still read these pages (an HTTP body being
            // sent): wait for it instead of failing the read with MemoryBusy.
            for &page in pages {
                for span in st.shape.spans(page) {
                    st.memory[span.buf]
                        .wait_available(span.offset, span.len, Access::Write)
                        .await;
                }
            }
        }
        let lease = match lease(&st.read_staging).await {
            Ok(l) => l,
            Err(e) => return fail_all(keys.len(), &e),
        };
        let chunk = lease.as_ref().map(|l| l.chunk());
        let slot_len = st.read_staging.as_ref().map_or(0, StagingPool::slot_len);
        let mut plan = st.plan_chunk(keys, pages, slot_len, |_, off, page, part, _, segs| {
            st.stage_read(chunk, off, page, part, segs);
            Ok(())
        });
        let live = plan.live();
        let mut page_results: Vec<Result<ReadOutcome>> = std::mem::take(&mut plan.failed)
            .into_iter()
            .map(|f| f.map_or(Ok(ReadOutcome::Hit), Err))
            .collect();
        let (object_keys, owners, first_slot) = (&plan.objects, &plan.owners, &plan.first_slot);
        let items: Vec<ReadItem<'_>> = live
            .iter()
            .map(|&j| ReadItem {
                key: &object_keys[j],
                segments: plan.segments_of(j),
            })
            .collect();
        // Enveloped host pages are checked by the backend where it read them, if it can (on
        // its I/O threads, the bytes still in cache); else here, after the whole chunk.
        let check = |k: usize, bytes: &[std::io::IoSlice<'_>]| {
            let object = live
                .get(k)
                .map(|&j| (&object_keys[j], &st.parts[owners[j].1]));
            let verdict = object.map_or(Err(MissReason::ChecksumMismatch), |(o, part)| {
                st.verify_bytes(bytes, o, part)
            });
            let object = object.map(|(o, _)| o);
            if let (Err(reason), Some(key)) = (&verdict, object) {
                tracing::warn!(%key, %reason, "stored object is invalid; treating it as a miss");
            }
            verdict
        };
        let checked = if st.format == PageFormat::Envelope && !st.device {
            st.backend.read_checked(&items, &check).await
        } else {
            None
        };
        let verified = checked.is_some();
        let outcomes = one_per_item(
            st.backend.as_ref(),
            "read",
            items.len(),
            match checked {
                Some(outcomes) => outcomes,
                None => st.backend.read(&items).await,
            },
        );
        // The objects read whole, verified (on two threads for a large chunk) before any
        // page's verdict is set, unless the backend checked them.
        let mut hits = Vec::with_capacity(if verified { 0 } else { live.len() });
        hits.extend(
            live.iter()
                .zip(&outcomes)
                .filter(|(_, o)| !verified && matches!(o, Ok(ReadOutcome::Hit)))
                .map(|(&j, _)| j),
        );
        let verify = |&j: &usize| {
            let (i, p) = owners[j];
            st.verify(
                chunk,
                j as u64 * slot_len,
                pages[i],
                &st.parts[p],
                &object_keys[j],
            )
        };
        let mut verdicts =
            split_over_two_threads(&hits, st.parts[0].payload_len, verify).into_iter();
        for (&j, outcome) in live.iter().zip(outcomes) {
            let (i, _) = owners[j];
            let verdict = match outcome {
                Ok(ReadOutcome::Hit) if verified => Ok(ReadOutcome::Hit),
                Ok(ReadOutcome::Hit) => match verdicts.next() {
                    Some(Ok(())) => Ok(ReadOutcome::Hit),
                    Some(Err(reason)) => {
                        tracing::warn!(key = %object_keys[j], %reason, "stored object is invalid; treating it as a miss");
                        Ok(ReadOutcome::Miss(reason))
                    }
                    None => Ok(ReadOutcome::Miss(MissReason::ChecksumMismatch)),
                },
                other => other,
            };
            if matches!(page_results[i], Ok(ReadOutcome::Hit)) {
                page_results[i] = verdict;
            }
        }
        // Bounce: copy verified pages into the host pool; a page that missed stays untouched.
        if st.mode == TransferMode::Bounce
            && let Some(chunk) = chunk
        {
            for (i, r) in page_results.iter_mut().enumerate() {
                if matches!(r, Ok(ReadOutcome::Hit)) {
                    let slot = first_slot[i] + st.header_len;
                    let res = if st.memory.is_empty() {
                        Ok(())
                    } else {
                        chunk
                            .memory
                            .source(slot, st.shape.page_bytes(), "connector staging slot")
                            .and_then(|payload| {
                                st.shape
                                    .scatter(&st.memory, pages[i], payload.host_bytes()?)
                            })
                    };
                    if let Err(e) = res {
                        *r = Err(e);
                    }
                }
            }
        }
        for r in &page_results {
            let counter = match r {
                Ok(ReadOutcome::Hit) => {
                    self.counters
                        .bytes_read
                        .fetch_add(st.shape.page_bytes(), Ordering::Relaxed);
                    &self.counters.pages_hit
                }
                Ok(ReadOutcome::Miss(MissReason::NotFound)) => &self.counters.pages_not_found,
                Ok(ReadOutcome::Miss(_)) => &self.counters.pages_invalid,
                Err(_) => &self.counters.page_errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        page_results
    }

    /// Number of leading keys whose pages exist (the longest stored prefix).
    ///
    /// A key whose existence check fails with an error ends the prefix (and is logged).
    pub async fn batch_exists(&self, keys: &[PageKey]) -> Result<usize> {
        let started = Instant::now();
        let found = self.exists_prefix(keys).await?;
        self.meters.exists(started.elapsed(), keys.len(), found);
        Ok(found)
    }

    async fn exists_prefix(&self, keys: &[PageKey]) -> Result<usize> {
        let state = self.current()?;
        Ok(self.presence(&state, keys, true).await.len())
    }

    /// Whether each page of `keys` is stored (every object of it, named as the pool's
    /// transfers name them). With `stop_at_miss` the answer ends before the first page that
    /// is not (its length is then the stored prefix). A key that cannot be named, or whose
    /// check fails, counts as not stored (and is logged).
    pub(super) async fn presence(
        &self,
        state: &PoolState,
        keys: &[PageKey],
        stop_at_miss: bool,
    ) -> Vec<bool> {
        let nparts = state.parts.len();
        let per_call = (state.objects_per_call / nparts).max(1);
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(per_call) {
            let mut objects = Vec::with_capacity(chunk.len() * nparts);
            // Pages whose names are all valid, in order; an invalid one is absent.
            let mut named = Vec::with_capacity(chunk.len());
            for key in chunk {
                let before = objects.len();
                let names = state
                    .parts
                    .iter()
                    .try_for_each(|p| state.object_key(key, p).map(|k| objects.push(k)));
                if let Err(e) = names {
                    tracing::warn!(%key, error = %e, "existence check of an invalid key");
                    objects.truncate(before);
                }
                named.push(objects.len() > before);
            }
            let found = one_per_item(
                self.backend.as_ref(),
                "exists",
                objects.len(),
                self.backend.exists(&objects).await,
            );
            let mut pages = found.chunks(nparts);
            for named in named {
                let stored = named
                    && pages.next().is_some_and(|page| {
                        page.iter().all(|r| match r {
                            Ok(found) => *found,
                            Err(e) => {
                                tracing::warn!(error = %e, "existence check failed; counting the page as absent");
                                false
                            }
                        })
                    });
                if !stored && stop_at_miss {
                    return out;
                }
                out.push(stored);
            }
        }
        out
    }

    /// Whether one page exists.
    pub async fn exists(&self, key: &PageKey) -> Result<bool> {
        Ok(self.batch_exists(std::slice::from_ref(key)).await? == 1)
    }

    /// Removes every stored object of the registered pools' namespaces (what SGLang's
    /// `clear()` asks for): the pages written under this identity and geometry, by this
    /// connector or any other, in the KV pool and in every sidecar this rank writes. Other
    /// namespaces, other models and anything not named by hicache stay. Returns how many
    /// objects were removed; a rank that writes no pool (MLA ranks above 0 without sharded
    /// sidecars) removes nothing and returns 0.
    ///
    /// Refused under `naming = "sglang"`: those names carry only the model and rank, and
    /// one model's suffix can end another's name (`_m` ends `_big_m`), so a store shared
    /// with other models could lose their pages.
    pub async fn clear(&self) -> Result<u64> {
        let state = self.current()?;
        let sidecars: Vec<Arc<PoolState>> = self
            .sidecars
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let suffixes: Vec<String> = std::iter::once(&state)
            .chain(&sidecars)
            .filter(|s| s.writer)
            .map(|s| format!(".{}", s.namespace.short_hex()))
            .collect();
        if suffixes.is_empty() {
            return Ok(0);
        }
        if self.config.naming.value == crate::key::NamingScheme::Sglang {
            return Err(Error::Unsupported {
                component: crate::error::Component::Connector,
                operation: "clearing a namespace under naming = \"sglang\" (those names cannot tell this model's pages from another model's); remove the files yourself, or use hicache naming".into(),
            });
        }
        let mut walk = crate::backend::ListWalk::new(self.backend.as_ref(), "", 1024);
        let mut removed = 0;
        while let Some(page) = walk.next_page().await? {
            let ours: Vec<ObjectKey> = page
                .into_iter()
                .filter(|l| {
                    suffixes
                        .iter()
                        .any(|s| l.key.as_str().ends_with(s.as_str()))
                })
                .map(|l| l.key)
                .collect();
            let results = one_per_item(
                self.backend.as_ref(),
                "remove",
                ours.len(),
                self.backend.remove(&ours).await,
            );
            for r in results {
                r?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes pages (every object of each); a missing page is not an error.
    pub async fn batch_remove(&self, keys: &[PageKey]) -> Result<Vec<Result<()>>> {
        let state = self.current()?;
        let started = Instant::now();
        let mut results = Vec::with_capacity(keys.len());
        for key in keys {
            let mut objects = Vec::with_capacity(state.parts.len());
            let mut res = Ok(());
            for part in &state.parts {
                match state.object_key(key, part) {
                    Ok(k) => objects.push(k),
                    Err(e) => res = Err(e),
                }
            }
            if res.is_ok() {
                let removed = one_per_item(
                    self.backend.as_ref(),
                    "remove",
                    objects.len(),
                    self.backend.remove(&objects).await,
                );
                for r in removed {
                    if let Err(e) = r {
                        res = Err(e);
                    }
                }
            }
            results.push(res);
        }
        self.meters.remove(started.elapsed(), &results);
        Ok(results)
    }

    /// The object names a page is stored under (for tools and tests).
    pub fn object_names(&self, key: &PageKey) -> Result<Vec<ObjectKey>> {
        let state = self.current()?;
        state
            .parts
            .iter()
            .map(|p| state.object_key(key, p))
            .collect()
    }
}

/// Bytes of payload from which a chunk's checksums run on two threads.
///
/// A call's checksum pass (before its writes) or verification (after its reads) otherwise
/// runs on one thread while the call's I/O waits. Measured with `hicache bench` (2 calls of
/// 32 pages in flight, 6 interleaved pairs, median GB/s write / read): tmpfs 8 MiB pages
/// 3.59 / 4.38 → 5.19 / 5.51, tmpfs 1 MiB 4.44 / 4.79 → 4.78 / 5.01, ext4 8 MiB
/// 1.81 / 1.51 → 1.90 / 1.61. Smaller calls stay on the calling thread: split from 2 MiB
/// on, calls of 32 pages of 64 KiB ran 10 % slower on tmpfs (6 of 6 pairs lost).
const PARALLEL_CHECKSUM_BYTES: u64 = 4 << 20;

/// `f` of every item, in order; split over two threads when the items carry at least
/// [`PARALLEL_CHECKSUM_BYTES`] of payload.
fn split_over_two_threads<T: Sync, R: Send>(
    items: &[T],
    payload_len: u64,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() < 2 || (items.len() as u64).saturating_mul(payload_len) < PARALLEL_CHECKSUM_BYTES
    {
        return items.iter().map(&f).collect();
    }
    let (first, second) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        let other = s.spawn(|| second.iter().map(&f).collect::<Vec<R>>());
        let mut out = Vec::with_capacity(items.len());
        out.extend(first.iter().map(&f));
        match other.join() {
            Ok(rest) => out.extend(rest),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::split_over_two_threads;

    #[test]
    fn split_work_keeps_its_order_on_either_path() {
        let items: Vec<u64> = (0..101).collect();
        let on = |payload| split_over_two_threads(&items, payload, |&x| x * 3);
        let expected: Vec<u64> = items.iter().map(|x| x * 3).collect();
        // 101 items of 1 KiB stay on this thread; of 1 MiB they are split.
        assert_eq!(on(1 << 10), expected);
        assert_eq!(on(1 << 20), expected);
        let threads = std::sync::Mutex::new(std::collections::HashSet::new());
        split_over_two_threads(&items, 1 << 20, |_| {
            threads.lock().unwrap().insert(std::thread::current().id());
        });
        assert_eq!(threads.lock().unwrap().len(), 2);
        assert!(split_over_two_threads(&[] as &[u64], 1 << 30, |&x| x).is_empty());
    }
}
