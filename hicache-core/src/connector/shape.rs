//! Where a registered pool's pages lie, in one form for KV pools and sidecars: buffers whose
//! page `p` is page 0's spans shifted by `p × stride`. Every layout of
//! [`PoolGeometry`] has that form (checked by a test against its own arithmetic), so the
//! connector's span, gather and scatter code is the same for both kinds of pool.

use crate::error::{Error, Result};
use crate::pool::{BufferLayout, PoolGeometry, SidecarGeometry, Span};

/// One span of a page: which buffer, where in it, how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BufSpan {
    pub(super) buf: usize,
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// A pool's pages as buffers of strided spans.
#[derive(Clone, Debug)]
pub(super) struct PageShape {
    pages: u64,
    page_tokens: u64,
    page_bytes: u64,
    buffers: Vec<BufferLayout>,
}

impl PageShape {
    /// The shape of a KV pool: one buffer.
    pub(super) fn of_kv(g: &PoolGeometry) -> Result<Self> {
        let first: Vec<Span> = g.page_spans(0)?.collect();
        // Every layout shifts all of a page's spans by one stride per page.
        let stride = match g.pages() {
            1 => g.page_bytes(),
            _ => g.page_spans(1)?.next().map_or(0, |s| s.offset) - first[0].offset,
        };
        Ok(PageShape {
            pages: g.pages(),
            page_tokens: g.page_tokens(),
            page_bytes: g.page_bytes(),
            buffers: vec![BufferLayout::new(stride, first)?],
        })
    }

    /// The shape of a sidecar pool.
    pub(super) fn of_sidecar(g: &SidecarGeometry) -> Self {
        PageShape {
            pages: g.pages(),
            page_tokens: g.page_tokens(),
            page_bytes: g.page_bytes(),
            buffers: g.buffers().to_vec(),
        }
    }

    pub(super) fn pages(&self) -> u64 {
        self.pages
    }

    pub(super) fn page_tokens(&self) -> u64 {
        self.page_tokens
    }

    /// Bytes of one page (its flat form).
    pub(super) fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    pub(super) fn spans_per_page(&self) -> u64 {
        self.buffers.iter().map(|b| b.spans().len() as u64).sum()
    }

    /// The spans of `page` (validated by the caller) in stored order, without allocating.
    pub(super) fn spans(&self, page: u64) -> impl Iterator<Item = BufSpan> + '_ {
        self.buffers.iter().enumerate().flat_map(move |(buf, b)| {
            let shift = page * b.page_stride();
            b.spans().iter().map(move |s| BufSpan {
                buf,
                offset: s.offset + shift,
                len: s.len,
            })
        })
    }

    /// Whether every span of every page, at buffer bases `bases`, is `align`-aligned.
    pub(super) fn aligned(&self, bases: &[u64], align: u64) -> bool {
        align <= 1
            || self.buffers.iter().zip(bases).all(|(b, base)| {
                base.is_multiple_of(align)
                    && (self.pages == 1 || b.page_stride().is_multiple_of(align))
                    && b.spans()
                        .iter()
                        .all(|s| s.offset.is_multiple_of(align) && s.len.is_multiple_of(align))
            })
    }

    /// Copies `page` into `dst` (flat order) from the buffers' memory, under pins.
    pub(super) fn gather(
        &self,
        memory: &[crate::memory::MemoryRegion],
        page: u64,
        dst: &mut [u8],
    ) -> Result<()> {
        self.check_flat(dst.len())?;
        let mut at = 0usize;
        for s in self.spans(page) {
            let src = memory[s.buf].source(s.offset, s.len, "host pool")?;
            let bytes = src.host_bytes()?;
            dst[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        }
        Ok(())
    }

    /// Copies a flat page from `src` into `page` of the buffers' memory, under pins.
    pub(super) fn scatter(
        &self,
        memory: &[crate::memory::MemoryRegion],
        page: u64,
        src: &[u8],
    ) -> Result<()> {
        self.check_flat(src.len())?;
        let mut at = 0usize;
        for s in self.spans(page) {
            let mut dst = memory[s.buf].target(s.offset, s.len, "host pool")?;
            let n = dst.len();
            dst.copy_from(0, &src[at..at + n])?;
            at += n;
        }
        Ok(())
    }

    fn check_flat(&self, len: usize) -> Result<()> {
        if len as u64 != self.page_bytes {
            return Err(Error::InvalidBatch {
                reason: format!(
                    "flat page buffer is {len} bytes, a page is {}",
                    self.page_bytes
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{AttentionKind, Dtype, Layout};

    #[test]
    fn every_kv_layout_is_strided_spans() {
        let attentions = [
            AttentionKind::Mha {
                kv_heads: 3,
                head_dim: 8,
            },
            AttentionKind::Mla { kv_cache_dim: 24 },
        ];
        for attention in attentions {
            for layout in Layout::ALL {
                for pages in [1, 2, 7] {
                    let Ok(g) = PoolGeometry::new(attention, 5, Dtype::Bf16, 4, layout, pages)
                    else {
                        continue;
                    };
                    let shape = PageShape::of_kv(&g).unwrap();
                    assert_eq!(shape.page_bytes(), g.page_bytes());
                    assert_eq!(shape.spans_per_page(), g.spans_per_page());
                    for p in 0..pages {
                        let ours: Vec<(u64, u64)> =
                            shape.spans(p).map(|s| (s.offset, s.len)).collect();
                        let theirs: Vec<(u64, u64)> = g
                            .page_spans(p)
                            .unwrap()
                            .map(|s| (s.offset, s.len))
                            .collect();
                        assert_eq!(ours, theirs, "{attention:?} {layout} page {p} of {pages}");
                    }
                }
            }
        }
    }

    #[test]
    fn flat_pages_of_the_wrong_length_are_refused() {
        let g = PoolGeometry::new(
            AttentionKind::Mla { kv_cache_dim: 8 },
            1,
            Dtype::Int8,
            2,
            Layout::PageFirst,
            2,
        )
        .unwrap();
        let shape = PageShape::of_kv(&g).unwrap();
        let region = crate::memory::MemoryRegion::from_aligned(
            crate::memory::AlignedBuf::zeroed(32, 8).unwrap(),
        );
        let memory = [region];
        let flat = [7u8; 16];
        shape.scatter(&memory, 1, &flat).unwrap();
        let mut back = [0u8; 16];
        shape.gather(&memory, 1, &mut back).unwrap();
        assert_eq!(back, flat);
        for len in [15, 17] {
            let mut wrong = vec![0u8; len];
            assert!(shape.gather(&memory, 0, &mut wrong).is_err());
            assert!(shape.scatter(&memory, 0, &wrong).is_err());
        }
    }
}
