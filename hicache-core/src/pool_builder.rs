//! Building a [`PoolGeometry`] by named fields, so counts that share a type (layers, tokens
//! per page, pages) cannot be passed in each other's place.

use crate::error::{Error, Result};
use crate::pool::{AttentionKind, Dtype, Layout, PoolGeometry};

impl PoolGeometry {
    /// A geometry by named fields:
    ///
    /// ```
    /// use hicache_core::{AttentionKind, Dtype, Layout, PoolGeometry};
    /// let g = PoolGeometry::builder(AttentionKind::Mha { kv_heads: 8, head_dim: 128 })
    ///     .layers(32)
    ///     .page_tokens(64)
    ///     .dtype(Dtype::Bf16)
    ///     .layout(Layout::PageFirst)
    ///     .pages(1024)
    ///     .build()?;
    /// assert_eq!(g.page_bytes(), 2 * 32 * 64 * 8 * 128 * 2);
    /// # Ok::<(), hicache_core::Error>(())
    /// ```
    pub fn builder(attention: AttentionKind) -> PoolGeometryBuilder {
        PoolGeometryBuilder {
            attention,
            layers: None,
            page_tokens: None,
            dtype: None,
            layout: None,
            pages: None,
        }
    }
}

/// Fields of a [`PoolGeometry`] being built; [`build`](Self::build) validates them.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until build()"]
pub struct PoolGeometryBuilder {
    attention: AttentionKind,
    layers: Option<u64>,
    page_tokens: Option<u64>,
    dtype: Option<Dtype>,
    layout: Option<Layout>,
    pages: Option<u64>,
}

impl PoolGeometryBuilder {
    /// Layers held by this rank.
    pub fn layers(mut self, layers: u64) -> Self {
        self.layers = Some(layers);
        self
    }

    /// Tokens per page.
    pub fn page_tokens(mut self, page_tokens: u64) -> Self {
        self.page_tokens = Some(page_tokens);
        self
    }

    /// Element type.
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Byte order of the host buffer.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = Some(layout);
        self
    }

    /// Pages in the pool.
    pub fn pages(mut self, pages: u64) -> Self {
        self.pages = Some(pages);
        self
    }

    /// The validated geometry; a field never set is an error naming it.
    pub fn build(self) -> Result<PoolGeometry> {
        let missing = |field: &str| Error::InvalidPool {
            reason: format!("the geometry's `{field}` was not set"),
        };
        PoolGeometry::new(
            self.attention,
            self.layers.ok_or_else(|| missing("layers"))?,
            self.dtype.ok_or_else(|| missing("dtype"))?,
            self.page_tokens.ok_or_else(|| missing("page_tokens"))?,
            self.layout.ok_or_else(|| missing("layout"))?,
            self.pages.ok_or_else(|| missing("pages"))?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_fields_build_the_same_geometry_and_missing_ones_are_named() {
        let mla = AttentionKind::Mla { kv_cache_dim: 576 };
        let built = PoolGeometry::builder(mla)
            .pages(10)
            .layout(Layout::PageFirst)
            .dtype(Dtype::Bf16)
            .page_tokens(64)
            .layers(61)
            .build()
            .unwrap();
        assert_eq!(
            built,
            PoolGeometry::new(mla, 61, Dtype::Bf16, 64, Layout::PageFirst, 10).unwrap()
        );
        let e = PoolGeometry::builder(mla)
            .layers(61)
            .dtype(Dtype::Bf16)
            .layout(Layout::PageFirst)
            .pages(10)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("`page_tokens` was not set"), "{e}");
        // Values are still validated.
        assert!(
            PoolGeometry::builder(mla)
                .layers(0)
                .page_tokens(64)
                .dtype(Dtype::Bf16)
                .layout(Layout::PageFirst)
                .pages(10)
                .build()
                .is_err()
        );
    }
}
