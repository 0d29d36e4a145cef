//! Page shapes of well-known models.

use hicache::{AttentionKind, Dtype, Error, Layout, PoolGeometry, Result};

/// Which model's page shape to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelShape {
    /// Llama-3-8B: MHA, 32 layers, 8 KV heads × 128, bf16 (128 KiB per token).
    Llama3_8b,
    /// Qwen3-8B: MHA, 36 layers, 8 KV heads × 128, bf16 (144 KiB per token).
    Qwen3_8b,
    /// DeepSeek-V3: MLA, 61 layers, latent 576, bf16 (about 69 KiB per token).
    DeepseekV3,
    /// A synthetic MHA shape whose page is exactly `page_bytes` (a multiple of 512).
    Custom {
        /// Bytes per page.
        page_bytes: u64,
    },
}

impl ModelShape {
    /// Parses `llama3-8b`, `qwen3-8b`, `deepseek-v3`, `custom`.
    pub fn parse(name: &str, page_bytes: Option<u64>) -> Result<Self> {
        if page_bytes.is_some() && name != "custom" {
            return Err(Error::invalid_config(
                "--page-bytes",
                "the command line",
                format!(
                    "applies to --model custom only, not to {name} (whose page size follows from the model)"
                ),
            ));
        }
        Ok(match name {
            "llama3-8b" => ModelShape::Llama3_8b,
            "qwen3-8b" => ModelShape::Qwen3_8b,
            "deepseek-v3" => ModelShape::DeepseekV3,
            "custom" => ModelShape::Custom {
                page_bytes: page_bytes.unwrap_or(1 << 20),
            },
            other => {
                return Err(Error::invalid_config(
                    "--model",
                    "the command line",
                    format!("`{other}` is not one of llama3-8b, qwen3-8b, deepseek-v3, custom"),
                ));
            }
        })
    }

    /// The pool geometry for `pages` pages of `page_tokens` tokens in `layout`.
    pub fn geometry(&self, page_tokens: u64, layout: Layout, pages: u64) -> Result<PoolGeometry> {
        let (attention, layers, tokens) = match *self {
            ModelShape::Llama3_8b => (
                AttentionKind::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                32,
                page_tokens,
            ),
            ModelShape::Qwen3_8b => (
                AttentionKind::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                36,
                page_tokens,
            ),
            ModelShape::DeepseekV3 => (AttentionKind::Mla { kv_cache_dim: 576 }, 61, page_tokens),
            ModelShape::Custom { page_bytes } => {
                // 2 (K,V) × 8 layers × 16 tokens × 1 head × D × 2 bytes = 512·D bytes per page.
                if page_bytes == 0 || page_bytes % 512 != 0 {
                    return Err(Error::invalid_config(
                        "--page-bytes",
                        "the command line",
                        format!(
                            "{page_bytes} is not a positive multiple of 512; use e.g. 65536 or 1048576"
                        ),
                    ));
                }
                (
                    AttentionKind::Mha {
                        kv_heads: 1,
                        head_dim: page_bytes / 512,
                    },
                    8,
                    16,
                )
            }
        };
        PoolGeometry::new(attention, layers, Dtype::Bf16, tokens, layout, pages)
    }
}
