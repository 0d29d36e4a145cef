//! Pool geometry: dtypes, attention kinds, SGLang's four layouts and their offset arithmetic,
//! and one page's spans. A layout's byte order is defined here once; every pool, copy and
//! transfer reads it from here.

use std::fmt;

use serde::Serialize;

use crate::error::{Error, Result};

/// Element type of the KV buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float, e4m3.
    Fp8E4m3,
    /// 8-bit float, e5m2.
    Fp8E5m2,
    /// 8-bit integer.
    Int8,
}

impl Dtype {
    /// Size of one element in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Fp8E4m3 | Dtype::Fp8E5m2 | Dtype::Int8 => 1,
        }
    }

    /// Parses the names torch and the CLI use (`bf16`, `bfloat16`, `fp8_e4m3`, …); an
    /// unknown name is an error that lists the accepted ones.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Dtype::F32,
            "f16" | "fp16" | "float16" | "half" => Dtype::F16,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "fp8" | "fp8_e4m3" | "float8_e4m3fn" | "e4m3" => Dtype::Fp8E4m3,
            "fp8_e5m2" | "float8_e5m2" | "e5m2" => Dtype::Fp8E5m2,
            "int8" | "i8" => Dtype::Int8,
            _ => {
                return Err(Error::InvalidPool {
                    reason: format!(
                        "`{s}` is not a dtype; accepted: f32 (fp32, float32), f16 (fp16, float16, \
                         half), bf16 (bfloat16), fp8_e4m3 (fp8, float8_e4m3fn, e4m3), fp8_e5m2 \
                         (float8_e5m2, e5m2), int8 (i8)"
                    ),
                });
            }
        })
    }
}

impl std::str::FromStr for Dtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Dtype::parse(s)
    }
}

impl std::str::FromStr for Layout {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Layout::parse(s)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8E4m3 => "fp8_e4m3",
            Dtype::Fp8E5m2 => "fp8_e5m2",
            Dtype::Int8 => "int8",
        })
    }
}

/// Attention kind: separate K and V per head (MHA/GQA) or one shared latent (MLA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum AttentionKind {
    /// K and V buffers of `kv_heads × head_dim` per token and layer.
    Mha {
        /// KV heads on this rank.
        kv_heads: u64,
        /// Head dimension.
        head_dim: u64,
    },
    /// One latent of `kv_cache_dim` per token and layer, the same on every TP rank.
    Mla {
        /// Latent width (kv_lora_rank + rope dim).
        kv_cache_dim: u64,
    },
}

impl AttentionKind {
    /// MLA latents are replicated across TP ranks (only one rank needs to write them).
    pub const fn is_rank_replicated(&self) -> bool {
        matches!(self, AttentionKind::Mla { .. })
    }

    /// Elements per token per layer per K/V buffer; `None` when the shape overflows.
    const fn checked_token_elems(&self) -> Option<u64> {
        match *self {
            AttentionKind::Mha { kv_heads, head_dim } => kv_heads.checked_mul(head_dim),
            AttentionKind::Mla { kv_cache_dim } => Some(kv_cache_dim),
        }
    }

    /// Elements per token per layer per K/V buffer (exact for validated geometries, whose
    /// shape cannot overflow).
    const fn token_elems(&self) -> u64 {
        match self.checked_token_elems() {
            Some(n) => n,
            None => u64::MAX,
        }
    }

    /// Number of K/V buffers (2 for MHA, 1 for MLA).
    const fn buffers(&self) -> u64 {
        match self {
            AttentionKind::Mha { .. } => 2,
            AttentionKind::Mla { .. } => 1,
        }
    }
}

/// Memory layout of the host KV buffer (SGLang `--hicache-mem-layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Layer-major; a page is scattered over every layer.
    LayerFirst,
    /// Token-major; a page's K (and V) are contiguous.
    PageFirst,
    /// Page-major with layers inside the page; contiguous per page.
    PageFirstDirect,
    /// Page-major with heads outermost (MHA only); contiguous per page.
    PageHead,
}

impl Layout {
    /// All layouts.
    pub const ALL: [Layout; 4] = [
        Layout::LayerFirst,
        Layout::PageFirst,
        Layout::PageFirstDirect,
        Layout::PageHead,
    ];

    /// Parses SGLang's spelling; an unknown name is an error that lists the accepted ones.
    pub fn parse(s: &str) -> Result<Self> {
        Layout::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| Error::InvalidPool {
                reason: format!(
                    "`{s}` is not a layout; accepted: layer_first, page_first, page_first_direct, \
                     page_head"
                ),
            })
    }

    /// SGLang's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Layout::LayerFirst => "layer_first",
            Layout::PageFirst => "page_first",
            Layout::PageFirstDirect => "page_first_direct",
            Layout::PageHead => "page_head",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One contiguous byte range of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Span {
    /// Offset from the pool's base.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Shape and layout of a host KV pool.
///
/// Built only through [`PoolGeometry::new`], which validates every dimension and proves
/// that every size derived from it fits the address space; the fields are read through
/// accessors, so a geometry can never be invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct PoolGeometry {
    attention: AttentionKind,
    layers: u64,
    dtype: Dtype,
    page_tokens: u64,
    layout: Layout,
    pages: u64,
}

impl PoolGeometry {
    /// A validated geometry: every dimension non-zero, no overflow, layout fits attention kind.
    pub fn new(
        attention: AttentionKind,
        layers: u64,
        dtype: Dtype,
        page_tokens: u64,
        layout: Layout,
        pages: u64,
    ) -> Result<Self> {
        let g = PoolGeometry {
            attention,
            layers,
            dtype,
            page_tokens,
            layout,
            pages,
        };
        g.validate()?;
        Ok(g)
    }

    /// MHA or MLA, with head shape.
    pub fn attention(&self) -> AttentionKind {
        self.attention
    }

    /// Layers held by this rank.
    pub fn layers(&self) -> u64 {
        self.layers
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Tokens per page.
    pub fn page_tokens(&self) -> u64 {
        self.page_tokens
    }

    /// Byte order of the buffer.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Pages in the pool.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The same geometry with another page count (validated again).
    pub fn with_pages(&self, pages: u64) -> Result<Self> {
        self.changed(|g| g.pages = pages)
    }

    /// The same geometry with another element type (validated again).
    pub fn with_dtype(&self, dtype: Dtype) -> Result<Self> {
        self.changed(|g| g.dtype = dtype)
    }

    /// The same geometry with another page size in tokens (validated again).
    pub fn with_page_tokens(&self, page_tokens: u64) -> Result<Self> {
        self.changed(|g| g.page_tokens = page_tokens)
    }

    fn changed(&self, change: impl FnOnce(&mut PoolGeometry)) -> Result<Self> {
        let mut g = *self;
        change(&mut g);
        g.validate()?;
        Ok(g)
    }

    /// Checks the geometry. [`PoolGeometry::new`] runs it; it stays public for callers that
    /// want to re-check one that crossed an API boundary.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidPool { reason });
        if self.layers == 0 || self.page_tokens == 0 || self.pages == 0 {
            return invalid(format!(
                "layers ({}), page_tokens ({}) and pages ({}) must be positive",
                self.layers, self.page_tokens, self.pages
            ));
        }
        let Some(token_elems) = self.attention.checked_token_elems() else {
            return invalid(format!(
                "attention shape {:?} overflows 64 bits",
                self.attention
            ));
        };
        if token_elems == 0 {
            return invalid(format!(
                "attention shape {:?} has no elements",
                self.attention
            ));
        }
        if self.layout == Layout::PageHead && self.attention.is_rank_replicated() {
            return invalid("page_head layout exists for MHA pools only (MLA has no heads)".into());
        }
        let total = [
            self.attention.buffers(),
            self.layers,
            self.page_tokens,
            self.pages,
            self.attention.token_elems(),
            self.dtype.bytes(),
        ]
        .iter()
        .try_fold(1u64, |acc, x| acc.checked_mul(*x));
        if total.is_none_or(|t| t > isize::MAX as u64) {
            return invalid(format!(
                "pool size ({} buffers x {} layers x page_tokens {} x {} pages x {} elements x {} \
                 bytes) overflows the address space",
                self.attention.buffers(),
                self.layers,
                self.page_tokens,
                self.pages,
                self.attention.token_elems(),
                self.dtype.bytes()
            ));
        }
        Ok(())
    }

    /// Bytes of one token of one layer of one K/V buffer.
    fn token_bytes(&self) -> u64 {
        self.attention.token_elems() * self.dtype.bytes()
    }

    /// Tokens in the pool.
    pub fn tokens(&self) -> u64 {
        self.pages * self.page_tokens
    }

    /// Bytes of the whole pool buffer.
    pub fn pool_bytes(&self) -> u64 {
        self.attention.buffers() * self.layers * self.tokens() * self.token_bytes()
    }

    /// Bytes of one page (its flat form; the object payload).
    pub fn page_bytes(&self) -> u64 {
        self.attention.buffers() * self.layers * self.page_tokens * self.token_bytes()
    }

    /// Number of spans per page.
    pub fn spans_per_page(&self) -> u64 {
        match self.layout {
            Layout::LayerFirst => self.attention.buffers() * self.layers,
            _ => self.attention.buffers(),
        }
    }

    /// Length of every span (all spans of a layout have the same length).
    pub fn span_len(&self) -> u64 {
        self.page_bytes() / self.spans_per_page()
    }

    /// The spans of `page`, in flat-page (object) order.
    pub fn page_spans(&self, page: u64) -> Result<PageSpans> {
        if page >= self.pages {
            return Err(Error::InvalidBatch {
                reason: format!(
                    "host page {page} is outside the pool of {} pages",
                    self.pages
                ),
            });
        }
        Ok(PageSpans {
            geometry: *self,
            page,
            next: 0,
            count: self.spans_per_page(),
        })
    }

    /// Whether a pool at `base` can move pages in place under an alignment of `align` bytes:
    /// base and every span (offset and length) are multiples of `align`.
    pub fn spans_aligned(&self, base: u64, align: u64) -> bool {
        // Every span offset is a multiple of the span length (see page_spans), so checking the
        // base and the length covers all of them.
        align <= 1 || (base.is_multiple_of(align) && self.span_len().is_multiple_of(align))
    }

    fn span(&self, page: u64, index: u64) -> Span {
        let e = self.token_bytes();
        let ps = self.page_tokens;
        let l = self.layers;
        let s = self.tokens();
        let span_len = self.span_len();
        let offset = match self.layout {
            Layout::LayerFirst => {
                // index = kv * L + layer; buffer [kv][layer][S] of e-byte tokens.
                (index * s + page * ps) * e
            }
            Layout::PageFirst | Layout::PageFirstDirect | Layout::PageHead => {
                // index = kv; each K/V buffer holds P pages of ps·L tokens back to back.
                index * l * s * e + page * span_len
            }
        };
        Span {
            offset,
            len: span_len,
        }
    }
}

/// Iterator over one page's spans.
#[derive(Clone, Debug)]
pub struct PageSpans {
    geometry: PoolGeometry,
    page: u64,
    next: u64,
    count: u64,
}

impl Iterator for PageSpans {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        if self.next == self.count {
            return None;
        }
        let s = self.geometry.span(self.page, self.next);
        self.next += 1;
        Some(s)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.count - self.next) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for PageSpans {}
