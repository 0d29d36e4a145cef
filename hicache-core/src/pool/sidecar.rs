//! Sidecar pools: the named host pools a hybrid model keeps beside its KV pool (Mamba state,
//! sliding-window KV, DSA indexer keys, DeepSeek-V4 compressed pools), as SGLang's v2 storage
//! interface moves them.
//!
//! Their shapes differ from model to model, so a sidecar is described by where each page's
//! bytes lie rather than by a layout name: one or more **buffers** (separate allocations:
//! Mamba's temporal state and each conv state are separate tensors), each holding, for page
//! `p`, the spans of page 0 shifted by `p × page_stride`. That covers every pool SGLang 0.5.23
//! stores: page-major buffers (one span per page), `layer_first` buffers (one span per layer,
//! all shifted by the same stride) and K/V pairs (two spans). A page's stored bytes are its
//! spans in order, buffer by buffer.

use std::fmt;

use serde::Serialize;

use super::Span;
use crate::error::{Error, Result};
use crate::memory::MemoryRegion;

/// Longest pool name accepted, in bytes.
pub const MAX_POOL_NAME_LEN: usize = 48;

/// Most spans a sidecar page may have, over all its buffers (a layer-first K/V pool of 1024
/// layers has 2048).
pub const MAX_SIDECAR_SPANS: usize = 4096;

/// The name of a sidecar pool (SGLang's `PoolName` values: `mamba`, `swa`, `indexer`,
/// `deepseek_v4_c4`, …): 1 to 48 bytes of lowercase ASCII letters, digits and `_`, starting
/// with a letter. `kv` is the KV pool's name and is not a sidecar.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct PoolName(String);

impl PoolName {
    /// The name of the KV pool in SGLang's transfers.
    pub const KV: &'static str = "kv";

    /// Validates `name` as a sidecar pool's name.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let invalid = |why: &str| {
            Err(Error::InvalidPool {
                reason: format!(
                    "pool name {:?} {why}",
                    name.chars().take(64).collect::<String>()
                ),
            })
        };
        if name == Self::KV {
            return invalid(
                "is the KV pool's name: register the KV pool with register_pool, sidecars under their own names",
            );
        }
        if name.is_empty() || name.len() > MAX_POOL_NAME_LEN {
            return invalid(&format!("must be 1 to {MAX_POOL_NAME_LEN} bytes long"));
        }
        if !name.starts_with(|c: char| c.is_ascii_lowercase())
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return invalid(
                "must be lowercase ASCII letters, digits and '_', starting with a letter (as SGLang's pool names are)",
            );
        }
        Ok(PoolName(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is SGLang's Mamba pool, whose objects SGLang names per component.
    pub fn is_mamba(&self) -> bool {
        self.0 == "mamba"
    }
}

impl fmt::Debug for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for PoolName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        PoolName::new(s)
    }
}

/// Where one buffer of a sidecar pool holds each page: the spans of page 0 (offsets from the
/// buffer's start, in stored order), each shifted by `page × page_stride` for later pages.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct BufferLayout {
    page_stride: u64,
    spans: Vec<Span>,
}

impl BufferLayout {
    /// A buffer whose page `p` is the spans `spans` shifted by `p × page_stride`.
    pub fn new(page_stride: u64, spans: Vec<Span>) -> Result<Self> {
        let invalid = |reason: String| Err(Error::InvalidPool { reason });
        if spans.is_empty() {
            return invalid("a sidecar buffer needs at least one span per page".into());
        }
        if page_stride == 0 {
            return invalid("a sidecar buffer's page stride must be positive".into());
        }
        if let Some(s) = spans.iter().find(|s| s.len == 0) {
            return invalid(format!(
                "a sidecar buffer's span at offset {} is empty",
                s.offset
            ));
        }
        Ok(BufferLayout { page_stride, spans })
    }

    /// A page-major buffer: page `p` is the `page_bytes` bytes at `p × page_bytes`.
    pub fn page_major(page_bytes: u64) -> Result<Self> {
        BufferLayout::new(
            page_bytes,
            vec![Span {
                offset: 0,
                len: page_bytes,
            }],
        )
    }

    /// Bytes between one page's spans and the next page's.
    pub fn page_stride(&self) -> u64 {
        self.page_stride
    }

    /// The spans of page 0, in stored order.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Bytes of one page in this buffer.
    pub fn page_bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// Bytes the buffer must hold for `pages` pages, or `None` on overflow.
    fn bytes_for(&self, pages: u64) -> Option<u64> {
        let last = (pages - 1).checked_mul(self.page_stride)?;
        self.spans
            .iter()
            .map(|s| s.offset.checked_add(s.len)?.checked_add(last))
            .try_fold(0u64, |acc, end| Some(acc.max(end?)))
    }

    /// Whether any two spans of any two pages (of `pages`) share a byte.
    fn overlaps(&self, pages: u64) -> bool {
        // Span j of page p and span k of page p + d meet iff
        //   o_k + d·s < o_j + l_j  and  o_j < o_k + d·s + l_k,
        // i.e. d·s lies in the open interval (o_j − o_k − l_k, o_j + l_j − o_k): check the
        // integers d in it against |d| < pages (d = 0 only between different spans).
        let s = i128::from(self.page_stride);
        let max_d = i128::from(pages) - 1;
        for (j, a) in self.spans.iter().enumerate() {
            for (k, b) in self.spans.iter().enumerate() {
                let (oa, la, ob, lb) = (
                    i128::from(a.offset),
                    i128::from(a.len),
                    i128::from(b.offset),
                    i128::from(b.len),
                );
                let low = oa - ob - lb; // exclusive
                let high = oa + la - ob; // exclusive
                // Smallest d with d·s > low, largest with d·s < high.
                let first = low.div_euclid(s) + 1;
                let last = (high - 1).div_euclid(s);
                let (first, last) = (first.max(-max_d), last.min(max_d));
                for d in first..=last {
                    if d != 0 || j != k {
                        return true;
                    }
                }
            }
        }
        false
    }
}

/// The shape of a sidecar pool: page size in tokens, page count, and each buffer's layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct SidecarGeometry {
    page_tokens: u64,
    pages: u64,
    buffers: Vec<BufferLayout>,
    rank_replicated: bool,
    format: String,
}

impl SidecarGeometry {
    /// A validated sidecar geometry.
    ///
    /// - `page_tokens`: tokens per page of this pool (host indices come in runs of it);
    /// - `pages`: pages the pool holds;
    /// - `buffers`: each buffer's layout, in stored order;
    /// - `rank_replicated`: whether every TP rank holds the same bytes (then only TP rank 0
    ///   writes, and the namespace leaves the TP rank out); TP-sharded state (Mamba) is not;
    /// - `format`: what the bytes are (dtypes, shapes), in the caller's words. It goes into
    ///   the pool's namespace, so a reader whose pages mean something else misses instead of
    ///   reading them.
    pub fn new(
        page_tokens: u64,
        pages: u64,
        buffers: Vec<BufferLayout>,
        rank_replicated: bool,
        format: impl Into<String>,
    ) -> Result<Self> {
        let format = format.into();
        let invalid = |reason: String| Err(Error::InvalidPool { reason });
        if page_tokens == 0 || pages == 0 {
            return invalid(format!(
                "a sidecar pool needs positive page_tokens ({page_tokens}) and pages ({pages})"
            ));
        }
        if buffers.is_empty() {
            return invalid("a sidecar pool needs at least one buffer".into());
        }
        let spans: usize = buffers.iter().map(|b| b.spans.len()).sum();
        if spans > MAX_SIDECAR_SPANS {
            return invalid(format!(
                "a sidecar page of {spans} spans is more than the {MAX_SIDECAR_SPANS} accepted"
            ));
        }
        if format.len() > 1024 || format.chars().any(char::is_control) {
            return invalid(
                "a sidecar pool's format description must be at most 1024 bytes without control characters"
                    .into(),
            );
        }
        for (i, b) in buffers.iter().enumerate() {
            match b.bytes_for(pages) {
                Some(n) if n <= isize::MAX as u64 => {}
                _ => {
                    return invalid(format!(
                        "sidecar buffer {i} of {pages} pages overflows the address space"
                    ));
                }
            }
            if b.overlaps(pages) {
                return invalid(format!(
                    "sidecar buffer {i}: two spans of its pages overlap (stride {}, spans {:?})",
                    b.page_stride, b.spans
                ));
            }
        }
        let page_bytes = buffers
            .iter()
            .try_fold(0u64, |acc, b| acc.checked_add(b.page_bytes()));
        if page_bytes.is_none_or(|n| n > isize::MAX as u64) {
            return invalid("a sidecar page's bytes overflow the address space".into());
        }
        Ok(SidecarGeometry {
            page_tokens,
            pages,
            buffers,
            rank_replicated,
            format,
        })
    }

    /// Tokens per page.
    pub fn page_tokens(&self) -> u64 {
        self.page_tokens
    }

    /// Pages in the pool.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The buffers' layouts.
    pub fn buffers(&self) -> &[BufferLayout] {
        &self.buffers
    }

    /// Whether every TP rank holds the same bytes.
    pub fn rank_replicated(&self) -> bool {
        self.rank_replicated
    }

    /// The caller's description of the bytes.
    pub fn format(&self) -> &str {
        &self.format
    }

    /// Bytes of one page (all buffers).
    pub fn page_bytes(&self) -> u64 {
        self.buffers.iter().map(BufferLayout::page_bytes).sum()
    }

    /// Spans per page (all buffers).
    pub fn spans_per_page(&self) -> u64 {
        self.buffers.iter().map(|b| b.spans.len() as u64).sum()
    }

    /// Bytes buffer `i` must hold (`None`: the pool has no buffer `i`).
    pub fn buffer_bytes(&self, i: usize) -> Option<u64> {
        // Validated in `new`: no overflow for a buffer that exists.
        self.buffers.get(i)?.bytes_for(self.pages)
    }
}

/// A sidecar pool: its name, its geometry, and one memory region per buffer.
#[derive(Clone, Debug)]
pub struct SidecarPool {
    name: PoolName,
    geometry: SidecarGeometry,
    memory: Vec<MemoryRegion>,
}

impl SidecarPool {
    /// A pool named `name` of `geometry` over `memory` (one region per buffer, each at least
    /// as long as the buffer needs).
    pub fn new(
        name: PoolName,
        geometry: SidecarGeometry,
        memory: Vec<MemoryRegion>,
    ) -> Result<Self> {
        if memory.len() != geometry.buffers.len() {
            return Err(Error::InvalidPool {
                reason: format!(
                    "sidecar pool {name} has {} buffers but {} memory regions",
                    geometry.buffers.len(),
                    memory.len()
                ),
            });
        }
        for (i, m) in memory.iter().enumerate() {
            let need = geometry.buffer_bytes(i).unwrap_or(u64::MAX);
            if m.len() < need {
                return Err(Error::InvalidPool {
                    reason: format!(
                        "sidecar pool {name}: buffer {i} is {} bytes but its layout needs {need}",
                        m.len()
                    ),
                });
            }
        }
        if let Some(m) = memory.iter().find(|m| m.kind() != memory[0].kind()) {
            return Err(Error::InvalidPool {
                reason: format!(
                    "sidecar pool {name} mixes {} and {} memory in its buffers",
                    memory[0].kind(),
                    m.kind()
                ),
            });
        }
        Ok(SidecarPool {
            name,
            geometry,
            memory,
        })
    }

    /// The pool's name.
    pub fn name(&self) -> &PoolName {
        &self.name
    }

    /// The pool's geometry.
    pub fn geometry(&self) -> &SidecarGeometry {
        &self.geometry
    }

    /// The buffers' memory, in buffer order.
    pub fn memory(&self) -> &[MemoryRegion] {
        &self.memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(offset: u64, len: u64) -> Span {
        Span { offset, len }
    }

    #[test]
    fn pool_names_are_sglangs_spelling_and_never_kv() {
        for ok in [
            "mamba",
            "swa",
            "deepseek_v4_c4_indexer_scale",
            "draft_swa",
            "a1",
        ] {
            assert_eq!(PoolName::new(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "kv",
            "",
            "Mamba",
            "1abc",
            "_x",
            "a-b",
            "a.b",
            "a/b",
            "é",
            &"a".repeat(49),
        ] {
            let e = PoolName::new(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidPool { .. }), "{bad}: {e}");
        }
        assert!(
            PoolName::new("kv")
                .unwrap_err()
                .to_string()
                .contains("register_pool")
        );
        let name: PoolName = "swa".parse().unwrap();
        assert_eq!(
            (format!("{name}"), format!("{name:?}")),
            ("swa".into(), "\"swa\"".into())
        );
    }

    #[test]
    fn overlapping_spans_are_refused_in_every_form() {
        let g = |stride, spans: Vec<Span>, pages| {
            SidecarGeometry::new(
                1,
                pages,
                vec![BufferLayout::new(stride, spans)?],
                false,
                "t",
            )
        };
        // Page-major, K/V halves, layer-first: disjoint.
        assert!(g(64, vec![span(0, 64)], 10).is_ok());
        assert!(g(32, vec![span(0, 32), span(320, 32)], 10).is_ok());
        assert!(g(16, vec![span(0, 16), span(160, 16), span(320, 16)], 10).is_ok());
        // Interleaved components within one stride.
        assert!(g(48, vec![span(0, 16), span(16, 32)], 10).is_ok());
        // A span longer than the stride meets the next page's.
        assert!(g(32, vec![span(0, 33)], 2).is_err());
        // ... but not with one page.
        assert!(g(32, vec![span(0, 33)], 1).is_ok());
        // Two spans of one page overlap.
        assert!(g(64, vec![span(0, 16), span(8, 16)], 1).is_err());
        // Page 5's first span runs into page 0's second (offset 160).
        assert!(g(32, vec![span(0, 32), span(160, 32)], 6).is_err());
        assert!(g(32, vec![span(0, 32), span(160, 32)], 5).is_ok());
        // Empty spans, no spans, zero stride, overflow.
        assert!(BufferLayout::new(8, vec![span(0, 0)]).is_err());
        assert!(BufferLayout::new(8, vec![]).is_err());
        assert!(BufferLayout::new(0, vec![span(0, 8)]).is_err());
        assert!(g(u64::MAX / 2, vec![span(0, 8)], 4).is_err());
        assert!(g(8, vec![span(u64::MAX - 4, 8)], 1).is_err());
        // Too many spans to check pairwise.
        let many: Vec<Span> = (0..=MAX_SIDECAR_SPANS as u64)
            .map(|i| span(i * 8, 8))
            .collect();
        let e = g(1 << 20, many, 1).unwrap_err();
        assert!(e.to_string().contains("4097 spans"), "{e}");
    }

    /// The arithmetic overlap check agrees with marking every byte, on 20,000 random small
    /// layouts.
    #[test]
    fn the_overlap_check_agrees_with_marking_every_byte() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut overlapping, mut disjoint) = (0, 0);
        for _ in 0..20_000 {
            let stride = 1 + next(24);
            let pages = 1 + next(6);
            let spans: Vec<Span> = (0..1 + next(4))
                .map(|_| span(next(64), 1 + next(16)))
                .collect();
            let layout = BufferLayout::new(stride, spans.clone()).unwrap();
            let mut seen = vec![false; (64 + 16 + 6 * 24) as usize];
            let mut marked_twice = false;
            for p in 0..pages {
                for s in &spans {
                    for b in s.offset + p * stride..s.offset + p * stride + s.len {
                        marked_twice |= std::mem::replace(&mut seen[b as usize], true);
                    }
                }
            }
            assert_eq!(
                layout.overlaps(pages),
                marked_twice,
                "stride {stride}, pages {pages}, spans {spans:?}"
            );
            if marked_twice {
                overlapping += 1;
            } else {
                disjoint += 1;
            }
        }
        assert!(
            overlapping > 1000 && disjoint > 1000,
            "{overlapping} / {disjoint}"
        );
    }

    #[test]
    fn the_geometry_sums_its_buffers() {
        let g = SidecarGeometry::new(
            4,
            3,
            vec![
                BufferLayout::page_major(100).unwrap(),
                BufferLayout::new(10, vec![span(0, 10), span(30, 10)]).unwrap(),
            ],
            false,
            "mamba",
        )
        .unwrap();
        assert_eq!(g.page_bytes(), 120);
        assert_eq!(g.spans_per_page(), 3);
        assert_eq!(g.buffer_bytes(0), Some(300));
        assert_eq!(g.buffer_bytes(1), Some(60));
        assert_eq!(g.buffer_bytes(2), None, "no buffer 2");
        assert!(SidecarGeometry::new(0, 3, g.buffers().to_vec(), false, "x").is_err());
        assert!(SidecarGeometry::new(4, 0, g.buffers().to_vec(), false, "x").is_err());
        assert!(SidecarGeometry::new(4, 3, vec![], false, "x").is_err());
        assert!(SidecarGeometry::new(4, 3, g.buffers().to_vec(), false, "a\nb").is_err());
    }
}
