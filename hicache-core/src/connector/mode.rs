//! Which transfer mode a pool gets on a backend: zero-copy, bounce or anchor.

use std::fmt;

use serde::Serialize;

use crate::backend::Capability;
use crate::config::{Config, TransferChoice};
use crate::key::NamingScheme;
use crate::pool::{Layout, PoolGeometry};

/// How a pool's pages move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferMode {
    /// The backend reads and writes the pool's spans in place.
    ZeroCopy,
    /// Pages are copied through aligned staging slots.
    Bounce,
    /// The pool has no bytes: small marker objects stand for pages.
    Anchor,
}

impl fmt::Display for TransferMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransferMode::ZeroCopy => "zero-copy",
            TransferMode::Bounce => "bounce",
            TransferMode::Anchor => "anchor",
        })
    }
}

/// The transfer mode `config` gets for a pool: [`decide_mode`] under the config's naming,
/// turned into bounce when `transfer_mode = bounce`.
pub fn choose_mode(
    geometry: &PoolGeometry,
    base: Option<u64>,
    capability: &Capability,
    config: &Config,
) -> (TransferMode, String) {
    match decide_mode(geometry, base, capability, config.naming.value) {
        (TransferMode::ZeroCopy, _) if config.transfer_mode.value == TransferChoice::Bounce => (
            TransferMode::Bounce,
            format!(
                "transfer_mode = bounce (from {})",
                config.transfer_mode.source
            ),
        ),
        decided => decided,
    }
}

/// Decides the transfer mode of a pool whose memory starts at `base` (`None`: anchor pool).
///
/// Zero-copy needs every span (base and length) aligned to the backend's direct-I/O alignment
/// and few enough spans per object. SGLang naming decides as SGLang's NIXL backend does, so
/// each side finds the other's objects: only `page_first` and `page_first_direct` pools move
/// zero-copy (as `_k`/`_v` objects; SGLang stores other layouts as one flat page), and under
/// direct I/O by SGLang's fixed 4096-byte rule rather than the filesystem's alignment.
pub fn decide_mode(
    geometry: &PoolGeometry,
    base: Option<u64>,
    capability: &Capability,
    naming: NamingScheme,
) -> (TransferMode, String) {
    let Some(base) = base else {
        return (
            TransferMode::Anchor,
            "the pool has no KV bytes (logical anchor pool); pages are tracked by marker objects"
                .into(),
        );
    };
    let mut align = effective_alignment(capability);
    let spans = geometry.spans_per_page();
    if naming == NamingScheme::Sglang {
        if !matches!(
            geometry.layout(),
            Layout::PageFirst | Layout::PageFirstDirect
        ) {
            return (
                TransferMode::Bounce,
                format!(
                    "SGLang naming: SGLang zero-copies only page_first and page_first_direct pools and stores {} pages as one flat page",
                    geometry.layout()
                ),
            );
        }
        if capability.direct_io {
            align = align.max(SGLANG_DIRECT_IO_ALIGN);
        }
    }
    // One more segment for the envelope header.
    if spans + 1 > u64::from(capability.max_segments.max(1)) {
        return (
            TransferMode::Bounce,
            format!(
                "a {} page has {spans} spans, more than the {} segments per object the backend takes",
                geometry.layout(),
                capability.max_segments
            ),
        );
    }
    if !geometry.spans_aligned(base, align) {
        return (
            TransferMode::Bounce,
            format!(
                "direct I/O needs {align}-byte alignment but the pool base {base:#x} or its span length {} is not a multiple of it",
                geometry.span_len()
            ),
        );
    }
    let why = if align > 1 {
        format!(
            "base and {spans} span(s) of {} bytes per page are {align}-byte aligned",
            geometry.span_len()
        )
    } else {
        format!("direct I/O is off; {spans} span(s) per page move in place")
    };
    (TransferMode::ZeroCopy, why)
}

/// The alignment SGLang's NIXL backend requires of zero-copy pools under O_DIRECT, whatever
/// the filesystem's (its `is_stride_page_aligned(4096)`); also its anchor markers' size.
pub(super) const SGLANG_DIRECT_IO_ALIGN: u64 = 4096;

pub(super) fn effective_alignment(capability: &Capability) -> u64 {
    if capability.direct_io {
        capability.io_alignment.max(1)
    } else {
        1
    }
}
