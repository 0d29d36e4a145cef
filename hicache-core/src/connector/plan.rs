//! A registered pool's fixed state, how a chunk of pages becomes objects (names, segments,
//! staging), and the envelope framing each object gets.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::backend::{DynBackend, MissReason, StorageBackend};
use crate::envelope::{self, FLAG_ANCHOR, FLAG_UNCHECKED, HEADER_FIELDS_LEN, Header, PageFormat};
use crate::error::{Error, Result};
use crate::key::{Namespace, ObjectKey, ObjectNamer, PageKey};
use crate::memory::{MemoryRegion, RegionId, Slice, align_up};
use crate::pool::HostPool;

use super::shape::{BufSpan, PageShape};
use crate::staging::StagingPool;

use super::*;

/// One object of a page: which spans it holds, its name's tag and its payload's length.
#[derive(Clone, Debug)]
pub(super) struct Part {
    /// Appended to the page's name (SGLang zero-copy naming: `_k`, `_v`, `_conv_0`…).
    pub(super) tag: Option<String>,
    /// Indices into the page's spans (zero-copy); every span for bounce and anchor pools.
    pub(super) spans: Range<u64>,
    /// Payload bytes of the object (its spans, a whole page, or a marker).
    pub(super) payload_len: u64,
}

/// Everything fixed once a pool is registered.
pub(super) struct PoolState {
    pub(super) backend: DynBackend,
    /// Kept so the pool lives as long as its registration.
    pub(super) _pool: Option<Arc<dyn HostPool>>,
    pub(super) shape: PageShape,
    /// The pool's memory, one region per buffer (empty: anchor pool); the connector reaches
    /// it only through pins.
    pub(super) memory: Vec<MemoryRegion>,
    /// The pool is GPU memory: payloads move by DMA only, unchecksummed.
    pub(super) device: bool,
    /// The buffers' registrations with the backend (zero-copy pools only).
    pub(super) regions: Vec<RegionId>,
    pub(super) mode: TransferMode,
    pub(super) format: PageFormat,
    pub(super) namer: ObjectNamer,
    pub(super) namespace: Namespace,
    pub(super) parts: Vec<Part>,
    pub(super) align: u64,
    pub(super) header_len: u64,
    pub(super) write_staging: Option<StagingPool>,
    pub(super) read_staging: Option<StagingPool>,
    pub(super) objects_per_call: usize,
    pub(super) writer: bool,
    pub(super) report: PoolReport,
}

impl fmt::Debug for PoolState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolState")
            .field("report", &self.report)
            .finish()
    }
}

impl Drop for PoolState {
    fn drop(&mut self) {
        if self.regions.is_empty() {
            return;
        }
        // Backends end their I/O before a dropped call finishes dropping; a transfer that
        // still pins the pool (an HTTP body being sent) is waited for, so the memory is never
        // released under it.
        for memory in &self.memory {
            memory.wait_idle_blocking();
        }
        for id in self.regions.drain(..) {
            if let Err(e) = self.backend.deregister(id) {
                tracing::debug!(error = %e, "deregistering the pool failed");
            }
        }
    }
}

impl PoolState {
    /// Names every object of `keys` and lets `stage` prepare its segments at its staging
    /// offset; `stage` also gets (page index in the chunk, part index). A page whose name or
    /// staging fails is marked failed and contributes no object.
    pub(super) fn plan_chunk(
        &self,
        keys: &[PageKey],
        pages: &[u64],
        slot_len: u64,
        mut stage: impl FnMut(
            (usize, usize),
            u64,
            u64,
            &Part,
            &ObjectKey,
            &mut Vec<Slice>,
        ) -> Result<()>,
    ) -> ChunkPlan {
        let n = keys.len() * self.parts.len();
        let mut plan = ChunkPlan {
            objects: Vec::with_capacity(n),
            owners: Vec::with_capacity(n),
            segments: Vec::with_capacity(n * 3),
            ranges: Vec::with_capacity(n),
            failed: (0..keys.len()).map(|_| None).collect(),
            first_slot: vec![0; keys.len()],
        };
        for (i, (key, &page)) in keys.iter().zip(pages).enumerate() {
            plan.first_slot[i] = plan.objects.len() as u64 * slot_len;
            let first_object = plan.objects.len();
            for (p, part) in self.parts.iter().enumerate() {
                let start = plan.segments.len();
                let staged = self.object_key(key, part).and_then(|object| {
                    let offset = plan.objects.len() as u64 * slot_len;
                    stage((i, p), offset, page, part, &object, &mut plan.segments).map(|()| object)
                });
                match staged {
                    Ok(object) => {
                        plan.ranges.push(start..plan.segments.len());
                        plan.objects.push(object);
                        plan.owners.push((i, p));
                    }
                    Err(e) => {
                        // Drop the page's objects staged so far; they are not transferred.
                        plan.segments
                            .truncate(plan.ranges.get(first_object).map_or(start, |r| r.start));
                        plan.ranges.truncate(first_object);
                        plan.objects.truncate(first_object);
                        plan.owners.truncate(first_object);
                        plan.failed[i] = Some(e);
                        break;
                    }
                }
            }
        }
        plan
    }

    pub(super) fn object_key(&self, key: &PageKey, part: &Part) -> Result<ObjectKey> {
        match &part.tag {
            None => self.namer.page_object(key),
            Some(tag) => self.namer.part_object(key, tag),
        }
    }

    /// The spans of a part of `page` (validated by `host_pages`).
    pub(super) fn span_slices<'a>(
        &'a self,
        page: u64,
        part: &Part,
    ) -> impl Iterator<Item = BufSpan> + 'a {
        self.shape
            .spans(page)
            .skip(part.spans.start as usize)
            .take((part.spans.end - part.spans.start) as usize)
    }

    /// A span as a slice of the buffer's registration (zero-copy pools only).
    fn registered(&self, s: BufSpan) -> Slice {
        Slice::new(self.regions[s.buf], s.offset, s.len)
    }

    /// Checksum of a part's spans in the host pool, read under pins.
    pub(super) fn pool_checksum(&self, page: u64, part: &Part) -> Result<u64> {
        if self.memory.is_empty() {
            return Err(Error::InvalidPool {
                reason: "a pool without memory has no spans to checksum".into(),
            });
        }
        // Span by span, each pinned while it is hashed: no allocation per page.
        let mut hasher = envelope::PayloadHasher::default();
        for span in self.span_slices(page, part) {
            let pinned =
                self.memory[span.buf].source(span.offset, span.len, "connector checksum")?;
            hasher.update(pinned.host_bytes()?);
        }
        Ok(hasher.finish())
    }

    pub(super) fn expected_header(&self, object: &ObjectKey, part: &Part, checksum: u64) -> Header {
        Header {
            flags: match (self.mode, self.device) {
                (TransferMode::Anchor, _) => FLAG_ANCHOR,
                (_, true) => FLAG_UNCHECKED,
                (_, false) => 0,
            },
            header_len: self.header_len,
            namespace: self.namespace,
            key_hash: object.hash(),
            payload_len: part.payload_len,
            checksum,
        }
    }

    /// Prepares one object for writing: header and/or payload in the staging slot at
    /// `slot_off`, and its segments. `sum` is the part's pool checksum when the caller
    /// computed it already (zero-copy envelopes).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_write(
        &self,
        chunk: Option<&crate::staging::Chunk>,
        slot_off: u64,
        page: u64,
        part: &Part,
        object: &ObjectKey,
        segments: &mut Vec<Slice>,
        sum: Option<&Result<u64>>,
    ) -> Result<()> {
        let enveloped = self.format == PageFormat::Envelope;
        match self.mode {
            TransferMode::ZeroCopy => {
                if enveloped {
                    let sum = match sum {
                        // Device pages are not checksummed (`FLAG_UNCHECKED`).
                        _ if self.device => 0,
                        Some(sum) => sum.clone()?,
                        None => self.pool_checksum(page, part)?,
                    };
                    let chunk = chunk.expect("enveloped zero-copy pools stage headers");
                    self.put_header(chunk, slot_off, object, part, sum)?;
                    segments.push(Slice::new(chunk.region, slot_off, self.header_len));
                }
                segments.extend(self.span_slices(page, part).map(|s| self.registered(s)));
            }
            TransferMode::Bounce | TransferMode::Anchor => {
                let chunk = chunk.expect("bounce and anchor pools stage pages");
                let payload_off = slot_off + self.header_len;
                let mut slot =
                    chunk
                        .memory
                        .target(payload_off, part.payload_len, "connector staging slot")?;
                let payload = slot.host_bytes_mut()?;
                match self.mode {
                    TransferMode::Bounce => self.shape.gather(&self.memory, page, payload)?,
                    _ => payload.fill(0x01),
                }
                if enveloped {
                    let sum = envelope::checksum([&*payload]);
                    drop(slot);
                    self.put_header(chunk, slot_off, object, part, sum)?;
                }
                let slot_len = self.header_len + align_up(part.payload_len, self.align);
                segments.push(Slice::new(chunk.region, slot_off, slot_len));
            }
        }
        Ok(())
    }

    pub(super) fn put_header(
        &self,
        chunk: &crate::staging::Chunk,
        slot_off: u64,
        object: &ObjectKey,
        part: &Part,
        sum: u64,
    ) -> Result<()> {
        let fields = self.expected_header(object, part, sum).encode();
        chunk
            .memory
            .target(slot_off, HEADER_FIELDS_LEN as u64, "connector header slot")?
            .copy_from(0, &fields)
    }

    pub(super) fn stage_read(
        &self,
        chunk: Option<&crate::staging::Chunk>,
        slot_off: u64,
        page: u64,
        part: &Part,
        segments: &mut Vec<Slice>,
    ) {
        match self.mode {
            TransferMode::ZeroCopy => {
                if self.format == PageFormat::Envelope
                    && let Some(chunk) = chunk
                {
                    segments.push(Slice::new(chunk.region, slot_off, self.header_len));
                }
                segments.extend(self.span_slices(page, part).map(|s| self.registered(s)));
            }
            TransferMode::Bounce | TransferMode::Anchor => {
                let chunk = chunk.expect("bounce and anchor pools stage pages");
                let slot_len = self.header_len + align_up(part.payload_len, self.align);
                segments.push(Slice::new(chunk.region, slot_off, slot_len));
            }
        }
    }

    /// Completes an object's header for a backend that seals its writes
    /// ([`write_sealed`](StorageBackend::write_sealed)): the payload's checksum and the
    /// header's fields go into `header`, the copy of the object's staged header block.
    pub(super) fn seal(
        &self,
        object: &ObjectKey,
        part: &Part,
        payload: &[std::io::IoSlice<'_>],
        header: &mut [u8],
    ) -> Result<()> {
        let plugin = || self.backend.info().name;
        let len: u64 = payload.iter().map(|s| s.len() as u64).sum();
        if len != part.payload_len {
            return Err(Error::backend(
                plugin(),
                format!(
                    "sealed {len} payload bytes of {object}, which holds {} (a plugin bug: the payload is every segment after the first)",
                    part.payload_len
                ),
            ));
        }
        let room = header.len();
        let fields = header.get_mut(..HEADER_FIELDS_LEN).ok_or_else(|| {
            Error::backend(
                plugin(),
                format!(
                    "sealed a header of {object} in {} bytes, fewer than its {HEADER_FIELDS_LEN} (a plugin bug: the header is a copy of the first segment)",
                    room
                ),
            )
        })?;
        let mut hasher = envelope::PayloadHasher::default();
        for s in payload {
            hasher.update(s);
        }
        fields.copy_from_slice(&self.expected_header(object, part, hasher.finish()).encode());
        Ok(())
    }

    /// [`verify`](Self::verify) of an object given its bytes as it was read (header first,
    /// then the payload), as a backend's [`read_checked`](StorageBackend::read_checked)
    /// lends them.
    pub(super) fn verify_bytes(
        &self,
        bytes: &[std::io::IoSlice<'_>],
        object: &ObjectKey,
        part: &Part,
    ) -> Result<(), MissReason> {
        if self.format == PageFormat::Raw {
            return Ok(());
        }
        // The header's fields: the first bytes, over as many pieces as they span.
        let mut fields = [0u8; HEADER_FIELDS_LEN];
        let mut got = 0;
        for s in bytes {
            let take = s.len().min(HEADER_FIELDS_LEN - got);
            fields[got..got + take].copy_from_slice(&s[..take]);
            got += take;
            if got == HEADER_FIELDS_LEN {
                break;
            }
        }
        if got < HEADER_FIELDS_LEN {
            return Err(MissReason::BadHeader {
                detail: format!(
                    "the object holds {got} bytes, fewer than a header's {HEADER_FIELDS_LEN}"
                ),
            });
        }
        let header = Header::decode(&fields)?;
        header.check_identity(&self.expected_header(object, part, 0))?;
        if self.device || !header.has_checksum() {
            return Ok(());
        }
        // The payload: `payload_len` bytes after the header's `header_len`, over the segments
        // (an object padded to the direct-I/O alignment ends in bytes no checksum covers).
        let mut hasher = envelope::PayloadHasher::default();
        let mut skip = self.header_len as usize;
        let mut left = part.payload_len as usize;
        for s in bytes {
            let s: &[u8] = s;
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            let take = (s.len() - skip).min(left);
            hasher.update(&s[skip..skip + take]);
            left -= take;
            skip = 0;
            if left == 0 {
                break;
            }
        }
        if left > 0 {
            return Err(MissReason::SizeMismatch {
                expected: self.header_len + part.payload_len,
                found: bytes.iter().map(|s| s.len() as u64).sum(),
            });
        }
        if hasher.finish() != header.checksum {
            return Err(MissReason::ChecksumMismatch);
        }
        Ok(())
    }

    /// Checks a read object: header identity and payload checksum (envelope), or nothing more
    /// than the length the backend already checked (raw).
    pub(super) fn verify(
        &self,
        chunk: Option<&crate::staging::Chunk>,
        slot_off: u64,
        page: u64,
        part: &Part,
        object: &ObjectKey,
    ) -> Result<(), MissReason> {
        if self.format == PageFormat::Raw {
            return Ok(());
        }
        let chunk = chunk.expect("enveloped pools stage headers");
        let unreadable = |e: Error| MissReason::BadHeader {
            detail: e.to_string(),
        };
        let mut fields = [0u8; HEADER_FIELDS_LEN];
        {
            let head = chunk
                .memory
                .source(slot_off, HEADER_FIELDS_LEN as u64, "connector header slot")
                .map_err(unreadable)?;
            fields.copy_from_slice(head.host_bytes().map_err(unreadable)?);
        }
        let header = Header::decode(&fields)?;
        header.check_identity(&self.expected_header(object, part, 0))?;
        if self.device || !header.has_checksum() {
            // Device pages never touch host memory, where a checksum could be computed;
            // an object written from one carries none.
            return Ok(());
        }
        let sum = match self.mode {
            TransferMode::ZeroCopy => self.pool_checksum(page, part).map_err(unreadable)?,
            TransferMode::Bounce | TransferMode::Anchor => {
                let payload = chunk
                    .memory
                    .source(
                        slot_off + self.header_len,
                        part.payload_len,
                        "connector staging slot",
                    )
                    .map_err(unreadable)?;
                envelope::checksum([payload.host_bytes().map_err(unreadable)?])
            }
        };
        if sum != header.checksum {
            return Err(MissReason::ChecksumMismatch);
        }
        Ok(())
    }
}

/// The objects of one chunk of pages: names, segments, and which page each belongs to.
pub(super) struct ChunkPlan {
    pub(super) objects: Vec<ObjectKey>,
    /// (page index in the chunk, part index) of each object.
    pub(super) owners: Vec<(usize, usize)>,
    pub(super) segments: Vec<Slice>,
    pub(super) ranges: Vec<Range<usize>>,
    /// Per page: why it cannot be transferred (bad name, staging failed).
    pub(super) failed: Vec<Option<Error>>,
    /// Staging offset of each page's first object (bounce pages have exactly one).
    pub(super) first_slot: Vec<u64>,
}

impl ChunkPlan {
    /// Objects whose page has not failed.
    pub(super) fn live(&self) -> Vec<usize> {
        (0..self.objects.len())
            .filter(|j| self.failed[self.owners[*j].0].is_none())
            .collect()
    }

    pub(super) fn segments_of(&self, object: usize) -> &[Slice] {
        &self.segments[self.ranges[object].clone()]
    }
}

/// Leases a staging chunk when the pool stages anything.
pub(super) async fn lease(
    staging: &Option<StagingPool>,
) -> Result<Option<crate::staging::Lease<'_>>> {
    match staging {
        Some(s) => s.lease().await.map(Some),
        None => Ok(None),
    }
}

/// A plugin owes one result per item, in order. Any other count leaves every item's fate
/// unknown (zipping would count an unanswered write as written, or an unanswered read as a
/// hit), so every item fails.
pub(super) fn one_per_item<T>(
    backend: &dyn StorageBackend,
    op: &str,
    items: usize,
    results: Vec<Result<T>>,
) -> Vec<Result<T>> {
    if results.len() == items {
        return results;
    }
    let name = backend.info().name;
    let e = Error::backend(
        name.clone(),
        format!(
            "{op} returned {} results for {items} items (a plugin bug: one result per item)",
            results.len()
        ),
    );
    tracing::error!(plugin = %name, error = %e, "plugin broke the one-result-per-item rule");
    (0..items).map(|_| Err(e.clone())).collect()
}

/// The error of a call that failed as a whole, for each of its `n` items.
pub(super) fn fail_all<T>(n: usize, e: &Error) -> Vec<Result<T>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

/// Validates host slots against the keys and the pool and returns one page index per key.
pub(super) fn host_pages(
    geometry: &PageShape,
    keys: usize,
    slots: HostSlots<'_>,
) -> Result<Vec<u64>> {
    let out_of_pool = |what: String| Error::InvalidBatch {
        reason: format!("{what} is outside the pool of {} pages", geometry.pages()),
    };
    match slots {
        HostSlots::Pages(pages) => {
            if pages.len() != keys {
                return Err(Error::InvalidBatch {
                    reason: format!("{keys} keys but {} host pages", pages.len()),
                });
            }
            if let Some(p) = pages.iter().find(|p| **p >= geometry.pages()) {
                return Err(out_of_pool(format!("host page {p}")));
            }
            Ok(pages.to_vec())
        }
        HostSlots::Tokens(tokens) => {
            let ps = geometry.page_tokens();
            if tokens.len() as u64 != keys as u64 * ps {
                return Err(Error::InvalidBatch {
                    reason: format!(
                        "{keys} keys need {} host token indices ({ps} per page), got {}",
                        keys as u64 * ps,
                        tokens.len()
                    ),
                });
            }
            tokens
                .chunks(ps as usize)
                .enumerate()
                .map(|(i, page)| {
                    let first = page[0];
                    if first % ps != 0 || page.iter().enumerate().any(|(j, t)| *t != first + j as u64) {
                        return Err(Error::InvalidBatch {
                            reason: format!(
                                "token indices of key {i} are not one whole page (they must be {ps} contiguous indices starting at a multiple of {ps}); got {first}.."
                            ),
                        });
                    }
                    let p = first / ps;
                    if p >= geometry.pages() {
                        return Err(out_of_pool(format!("token index {first} (page {p})")));
                    }
                    Ok(p)
                })
                .collect()
        }
    }
}
