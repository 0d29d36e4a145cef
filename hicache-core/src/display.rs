//! Human-readable forms: byte sizes, pool geometries and pool reports as a person reads
//! them in a log line or a command's output (`Debug` stays the exact form).

use std::fmt;

use crate::connector::{PayloadCheck, PoolReport};
use crate::pool::{AttentionKind, PoolGeometry};

/// A byte count shown with a binary unit: `64 KiB`, `8.58 MiB`, `512 B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut unit = 0;
        while unit + 1 < UNITS.len() && self.0 >= 1 << (10 * (unit + 1)) {
            unit += 1;
        }
        if unit == 0 {
            return write!(f, "{} B", self.0);
        }
        let whole = 1u64 << (10 * unit);
        if self.0.is_multiple_of(whole) {
            return write!(f, "{} {}", self.0 / whole, UNITS[unit]);
        }
        let value = self.0 as f64 / whole as f64;
        let text = format!("{value:.2}");
        // 1.50 -> 1.5; 16.00 (rounded up) -> 16
        let text = text.trim_end_matches('0').trim_end_matches('.');
        write!(f, "{text} {}", UNITS[unit])
    }
}

impl fmt::Display for AttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AttentionKind::Mha { kv_heads, head_dim } => {
                write!(f, "MHA ({kv_heads} KV heads x {head_dim})")
            }
            AttentionKind::Mla { kv_cache_dim } => write!(f, "MLA (latent {kv_cache_dim})"),
        }
    }
}

impl fmt::Display for PoolGeometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {} layers, {} tokens per page, {}, {}: {} per page in {} span(s) of {}, {} pages",
            self.attention(),
            self.layers(),
            self.page_tokens(),
            self.dtype(),
            self.layout(),
            ByteSize(self.page_bytes()),
            self.spans_per_page(),
            ByteSize(self.span_len()),
            self.pages()
        )
    }
}

impl fmt::Display for PoolReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}); {} per page in {} span(s), stored as {} object(s) of {} in all; {} naming, {} format, namespace {}, alignment {}",
            self.mode,
            self.reason,
            ByteSize(self.page_bytes),
            self.spans_per_page,
            self.objects_per_page,
            ByteSize(self.stored_bytes_per_page),
            self.naming,
            self.page_format,
            self.namespace,
            ByteSize(self.io_alignment),
        )?;
        if self.staging_chunk_bytes > 0 {
            write!(
                f,
                ", staging {} per chunk",
                ByteSize(self.staging_chunk_bytes)
            )?;
        }
        if let Some(path) = &self.pool_path {
            write!(f, "; pool bytes: {path}")?;
        }
        if self.payload_check == PayloadCheck::DeviceUnchecked {
            write!(f, "; {}", self.payload_check)?;
        }
        if !self.writer {
            f.write_str("; this rank does not write (MLA: TP rank 0 does)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Dtype, Layout};

    #[test]
    fn sizes_read_as_people_write_them() {
        for (n, want) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (64 << 10, "64 KiB"),
            (1536, "1.5 KiB"),
            (8_994_816, "8.58 MiB"),
            (8 << 20, "8 MiB"),
            (3 << 30, "3 GiB"),
            (u64::MAX, "16 EiB"),
            ((1 << 20) - 1, "1024 KiB"),
        ] {
            assert_eq!(ByteSize(n).to_string(), want, "{n}");
        }
    }

    #[test]
    fn geometries_read_as_shapes_not_structs() {
        let g = PoolGeometry::new(
            AttentionKind::Mha {
                kv_heads: 8,
                head_dim: 128,
            },
            32,
            Dtype::Bf16,
            64,
            Layout::PageFirst,
            100,
        )
        .unwrap();
        let text = g.to_string();
        assert!(
            text.starts_with("MHA (8 KV heads x 128), 32 layers, 64 tokens per page, bf16"),
            "{text}"
        );
        assert!(
            text.contains("8 MiB per page") && text.ends_with("100 pages"),
            "{text}"
        );
        assert!(!text.contains('{'), "{text}");
        let mla = AttentionKind::Mla { kv_cache_dim: 576 };
        assert_eq!(mla.to_string(), "MLA (latent 576)");
    }
}
