//! Host KV pools: geometry, SGLang's four layouts, per-page spans, gather/scatter.
//!
//! Byte orders follow SGLang's host pools exactly (`MHATokenToKVPoolHost` and
//! `MLATokenToKVPoolHost` in its `mem_cache` package), with `S` = tokens in the pool
//! (`pages × page_tokens`), `L` layers, `H` KV heads, `D` head dim, `C` MLA latent dim:
//!
//! | layout | MHA buffer | MLA buffer | a page's object bytes (flat page) |
//! |---|---|---|---|
//! | `layer_first` | `[2][L][S][H][D]` | `[L][S][C]` | `[2][L][ps][H][D]` / `[L][ps][C]` |
//! | `page_first` | `[2][S][L][H][D]` | `[S][L][C]` | `[2][ps][L][H][D]` / `[ps][L][C]` |
//! | `page_first_direct` | `[2][P][L][ps][H][D]` | `[P][L][ps][C]` | `[2][L][ps][H][D]` / `[L][ps][C]` |
//! | `page_head` | `[2][P][H][ps][L][D]` | — | `[2][H][ps][L][D]` |
//!
//! [`PoolGeometry::page_spans`] lists a page's `(offset, len)` spans **in flat-page order**, so
//! an object's bytes are the same whether a page moved zero-copy (spans gathered by the
//! backend) or through a bounce buffer (spans copied by the CPU). For `layer_first` MHA that is
//! all K layers then all V layers (SGLang's `get_page_buffer_meta` interleaves `k_l0, v_l0, …`
//! but its flat page does not; the object follows the flat page).
//!
//! The geometry, the four layouts' offset arithmetic and the pools that use it stay in one
//! file (about 700 lines): a layout's byte order is defined once and every pool and
//! gather/scatter reads it from here.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::memory::{MemKind, MemoryRegion};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// A host buffer of KV pages that hicache moves to and from storage.
pub trait HostPool: Send + Sync + fmt::Debug {
    /// Shape and layout.
    fn geometry(&self) -> &PoolGeometry;

    /// The memory holding the pool's bytes (`pool_bytes()` long), or `None` for a logical
    /// anchor pool that has no KV bytes. Every call returns a clone of the same region, so
    /// pins taken through one handle guard the bytes for all.
    fn memory(&self) -> Option<MemoryRegion>;
}

/// Checks that the pool's memory is big enough for its geometry and is host memory.
fn checked_memory(region: Option<MemoryRegion>, geometry: &PoolGeometry) -> Result<MemoryRegion> {
    let region = region.ok_or_else(|| Error::InvalidPool {
        reason: "an anchor pool has no bytes to copy".into(),
    })?;
    let need = geometry.pool_bytes();
    if region.len() < need {
        return Err(Error::InvalidPool {
            reason: format!(
                "pool memory is {} bytes but the geometry needs {need}",
                region.len()
            ),
        });
    }
    if region.kind() != MemKind::Host {
        return Err(Error::InvalidPool {
            reason: format!("cannot copy pages of {} memory on the CPU", region.kind()),
        });
    }
    Ok(region)
}

/// Copies page `page` into `dst` in flat-page order (`dst.len()` must be `page_bytes()`).
///
/// The pool's geometry and memory are read once. The page's spans are pinned for reading,
/// so a transfer writing them makes this an [`Error::MemoryBusy`], never a torn copy.
pub fn gather_page(pool: &dyn HostPool, page: u64, dst: &mut [u8]) -> Result<()> {
    let geometry = *pool.geometry();
    let region = checked_memory(pool.memory(), &geometry)?;
    gather_from(&region, &geometry, page, dst)
}

/// Copies a flat page from `src` into page `page` (`src.len()` must be `page_bytes()`).
///
/// The page's spans are pinned for writing, so a transfer using them makes this an
/// [`Error::MemoryBusy`].
pub fn scatter_page(pool: &dyn HostPool, page: u64, src: &[u8]) -> Result<()> {
    let geometry = *pool.geometry();
    let region = checked_memory(pool.memory(), &geometry)?;
    scatter_into(&region, &geometry, page, src)
}

/// [`gather_page`] for a region and geometry already checked by the caller.
pub(crate) fn gather_from(
    region: &MemoryRegion,
    geometry: &PoolGeometry,
    page: u64,
    dst: &mut [u8],
) -> Result<()> {
    check_flat_len(geometry, dst.len())?;
    let mut at = 0usize;
    for span in geometry.page_spans(page)? {
        let src = region.source(span.offset, span.len, "host pool")?;
        let bytes = src.host_bytes()?;
        dst[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    }
    Ok(())
}

/// [`scatter_page`] for a region and geometry already checked by the caller.
pub(crate) fn scatter_into(
    region: &MemoryRegion,
    geometry: &PoolGeometry,
    page: u64,
    src: &[u8],
) -> Result<()> {
    check_flat_len(geometry, src.len())?;
    let mut at = 0usize;
    for span in geometry.page_spans(page)? {
        let mut dst = region.target(span.offset, span.len, "host pool")?;
        let n = dst.len();
        dst.copy_from(0, &src[at..at + n])?;
        at += n;
    }
    Ok(())
}

fn check_flat_len(g: &PoolGeometry, len: usize) -> Result<()> {
    if len as u64 != g.page_bytes() {
        return Err(Error::InvalidBatch {
            reason: format!(
                "flat page buffer is {len} bytes, a page is {}",
                g.page_bytes()
            ),
        });
    }
    Ok(())
}

/// Anonymous mmap that is unmapped when the last region referencing it goes.
struct Mapping {
    _map: memmap2::MmapMut,
}

/// A host pool in an anonymous, page-aligned, pre-faulted mmap (SGLang's `alloc_mmap`).
///
/// Pre-faulting (`MADV_POPULATE_WRITE`, or touching every page) keeps first-touch faults out
/// of transfers and benchmarks. Its bytes are reached only through its one
/// [`MemoryRegion`], so [`MmapPool::write_bytes`] and [`MmapPool::read_bytes`] pin what they
/// touch and fail with [`Error::MemoryBusy`] rather than race a transfer.
pub struct MmapPool {
    geometry: PoolGeometry,
    region: MemoryRegion,
}

impl fmt::Debug for MmapPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmapPool")
            .field("geometry", &self.geometry)
            .field("addr", &format_args!("{:#x}", self.region.addr()))
            .finish()
    }
}

impl MmapPool {
    /// Maps and pre-faults a zeroed pool for `geometry`.
    pub fn new(geometry: PoolGeometry) -> Result<Self> {
        let len = usize::try_from(geometry.pool_bytes()).map_err(|_| Error::InvalidPool {
            reason: format!(
                "a pool of {} bytes does not fit the address space",
                geometry.pool_bytes()
            ),
        })?;
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|e| Error::InvalidPool {
                reason: format!("mmap of {len} bytes failed: {e}"),
            })?;
        prefault(&mut map);
        let addr = map.as_mut_ptr();
        // SAFETY: the mapping is `len` bytes, lives as long as the region's owner (the map
        // itself), and no reference to it is kept: the map moves into the region and every
        // access goes through the region's pins.
        let region = unsafe {
            MemoryRegion::with_owner(
                addr,
                len as u64,
                MemKind::Host,
                Arc::new(Mapping { _map: map }),
            )
        };
        Ok(MmapPool { geometry, region })
    }

    /// Copies `bytes` into the pool at `offset` (test and fill helper).
    pub fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut dst = self
            .region
            .target(offset, bytes.len() as u64, "MmapPool::write_bytes")?;
        dst.copy_from(0, bytes)
    }

    /// Copies pool bytes at `offset` into `out`.
    pub fn read_bytes(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let src = self
            .region
            .source(offset, out.len() as u64, "MmapPool::read_bytes")?;
        out.copy_from_slice(src.host_bytes()?);
        Ok(())
    }

    /// Base address (page-aligned).
    pub fn base(&self) -> usize {
        self.region.addr()
    }
}

impl HostPool for MmapPool {
    fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    fn memory(&self) -> Option<MemoryRegion> {
        Some(self.region.clone())
    }
}

fn prefault(map: &mut memmap2::MmapMut) {
    // Miri has no madvise; touching every page is the portable path.
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        // MADV_POPULATE_WRITE (Linux 5.14) faults every page in one call.
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: the range is exactly our live mapping.
        let rc = unsafe { libc::madvise(map.as_mut_ptr().cast(), map.len(), MADV_POPULATE_WRITE) };
        if rc == 0 {
            return;
        }
    }
    for chunk in map.chunks_mut(4096) {
        chunk[0] = 0;
    }
}

/// A logical pool with no KV bytes (SGLang's `LogicalHostPool` anchor): pages are tracked by
/// small marker objects only.
#[derive(Debug, Clone)]
pub struct AnchorPool {
    geometry: PoolGeometry,
}

impl AnchorPool {
    /// An anchor pool with the geometry whose pages it stands for.
    pub fn new(geometry: PoolGeometry) -> Result<Self> {
        geometry.validate()?;
        Ok(AnchorPool { geometry })
    }
}

impl HostPool for AnchorPool {
    fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    fn memory(&self) -> Option<MemoryRegion> {
        None
    }
}

#[cfg(test)]
mod tests;
