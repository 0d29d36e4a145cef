//! The batch calls: pages in, pages out, existence, removal.

use std::sync::atomic::Ordering;

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
        let pages = host_pages(&state.geometry, keys.len(), slots)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        if !state.writer {
            return Ok((0..keys.len())
                .map(|_| Ok(SetOutcome::SkippedNotWriter))
                .collect());
        }
        let per_call = (state.objects_per_call / state.parts.len()).max(1);
        let mut results = Vec::with_capacity(keys.len());
        for (kchunk, pchunk) in keys.chunks(per_call).zip(pages.chunks(per_call)) {
            results.extend(self.set_chunk(&state, kchunk, pchunk).await);
        }
        Ok(results)
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
        let mut plan = st.plan_chunk(keys, pages, slot_len, |off, page, part, object, segs| {
            st.stage_write(chunk, off, page, part, object, segs)
        });
        let live = plan.live();
        let items: Vec<WriteItem<'_>> = live
            .iter()
            .map(|&j| WriteItem {
                key: &plan.objects[j],
                segments: plan.segments_of(j),
            })
            .collect();
        let outcomes = one_per_item(
            st.backend.as_ref(),
            "write",
            items.len(),
            st.backend.write(&items).await,
        );
        for (&j, outcome) in live.iter().zip(outcomes) {
            let page = plan.owners[j].0;
            if let Err(e) = outcome
                && plan.failed[page].is_none()
            {
                plan.failed[page] = Some(e);
            }
        }
        let page_bytes = st.geometry.page_bytes();
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
        let pages = host_pages(&state.geometry, keys.len(), slots)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let per_call = (state.objects_per_call / state.parts.len()).max(1);
        let mut results = Vec::with_capacity(keys.len());
        for (kchunk, pchunk) in keys.chunks(per_call).zip(pages.chunks(per_call)) {
            results.extend(self.get_chunk(&state, kchunk, pchunk).await);
        }
        Ok(results)
    }

    async fn get_chunk(
        &self,
        st: &PoolState,
        keys: &[PageKey],
        pages: &[u64],
    ) -> Vec<Result<ReadOutcome>> {
        if st.mode == TransferMode::ZeroCopy
            && let Some(memory) = &st.memory
        {
            // A write whose call was dropped may still read these pages (an HTTP body being
            // sent): wait for it instead of failing the read with MemoryBusy.
            for (&page, part) in pages.iter().zip(std::iter::repeat(&st.parts)) {
                for p in part {
                    for span in st.span_slices(page, p) {
                        memory
                            .wait_available(span.offset, span.len, Access::Write)
                            .await;
                    }
                }
            }
        }
        let lease = match lease(&st.read_staging).await {
            Ok(l) => l,
            Err(e) => return fail_all(keys.len(), &e),
        };
        let chunk = lease.as_ref().map(|l| l.chunk());
        let slot_len = st.read_staging.as_ref().map_or(0, StagingPool::slot_len);
        let mut plan = st.plan_chunk(keys, pages, slot_len, |off, page, part, _, segs| {
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
        let outcomes = one_per_item(
            st.backend.as_ref(),
            "read",
            items.len(),
            st.backend.read(&items).await,
        );
        for (&j, outcome) in live.iter().zip(outcomes) {
            let (i, p) = owners[j];
            if !matches!(page_results[i], Ok(ReadOutcome::Hit)) {
                continue;
            }
            let verdict = match outcome {
                Ok(ReadOutcome::Hit) => {
                    let slot = j as u64 * slot_len;
                    match st.verify(chunk, slot, pages[i], &st.parts[p], &object_keys[j]) {
                        Ok(()) => Ok(ReadOutcome::Hit),
                        Err(reason) => {
                            tracing::warn!(key = %object_keys[j], %reason, "stored object is invalid; treating it as a miss");
                            Ok(ReadOutcome::Miss(reason))
                        }
                    }
                }
                other => other,
            };
            page_results[i] = verdict;
        }
        // Bounce: copy verified pages into the host pool; a page that missed stays untouched.
        if st.mode == TransferMode::Bounce
            && let Some(chunk) = chunk
        {
            for (i, r) in page_results.iter_mut().enumerate() {
                if matches!(r, Ok(ReadOutcome::Hit)) {
                    let slot = first_slot[i] + st.header_len;
                    let res = st.memory.as_ref().map_or(Ok(()), |memory| {
                        let payload = chunk.memory.source(
                            slot,
                            st.geometry.page_bytes(),
                            "connector staging slot",
                        )?;
                        crate::pool::scatter_into(
                            memory,
                            &st.geometry,
                            pages[i],
                            payload.host_bytes()?,
                        )
                    });
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
                        .fetch_add(st.geometry.page_bytes(), Ordering::Relaxed);
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
        let state = self.current()?;
        let nparts = state.parts.len();
        let per_call = (state.objects_per_call / nparts).max(1);
        let mut prefix = 0;
        for chunk in keys.chunks(per_call) {
            let mut objects = Vec::with_capacity(chunk.len() * nparts);
            for key in chunk {
                for part in &state.parts {
                    match state.object_key(key, part) {
                        Ok(k) => objects.push(k),
                        Err(e) => {
                            tracing::warn!(%key, error = %e, "existence check of an invalid key");
                            return Ok(prefix);
                        }
                    }
                }
            }
            let found = one_per_item(
                self.backend.as_ref(),
                "exists",
                objects.len(),
                self.backend.exists(&objects).await,
            );
            for page in found.chunks(nparts) {
                let mut all = true;
                for r in page {
                    match r {
                        Ok(true) => {}
                        Ok(false) => all = false,
                        Err(e) => {
                            tracing::warn!(error = %e, "existence check failed; ending the prefix there");
                            all = false;
                        }
                    }
                }
                if !all {
                    return Ok(prefix);
                }
                prefix += 1;
            }
        }
        Ok(prefix)
    }

    /// Whether one page exists.
    pub async fn exists(&self, key: &PageKey) -> Result<bool> {
        Ok(self.batch_exists(std::slice::from_ref(key)).await? == 1)
    }

    /// Removes pages (every object of each); a missing page is not an error.
    pub async fn batch_remove(&self, keys: &[PageKey]) -> Result<Vec<Result<()>>> {
        let state = self.current()?;
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
