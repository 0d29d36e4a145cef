//! Which transfer mode a pool gets on a backend: zero-copy, bounce or anchor.

use std::fmt;

use serde::Serialize;

use crate::backend::{BackendInfo, BackendKind, Capability};
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

/// Whose rule decides a pool's transfer mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeRule {
    /// hicache naming: zero-copy wherever the backend's real direct-I/O alignment allows it.
    Hicache,
    /// SGLang naming: the rule of SGLang's NIXL backend, so that each side finds the other's
    /// objects.
    Sglang {
        /// SGLang's `needs_page_alignment`: the config asks for direct I/O and the plugin
        /// stores files. It holds whether or not the filesystem honours O_DIRECT (on tmpfs
        /// SGLang falls back to buffered I/O and keeps the rule), and whenever the backend
        /// does direct I/O.
        page_aligned: bool,
    },
}

impl ModeRule {
    /// The rule `config` sets for the backend `info` describes.
    pub fn of(config: &Config, info: &BackendInfo) -> Self {
        match config.naming.value {
            NamingScheme::Hicache => ModeRule::Hicache,
            NamingScheme::Sglang => ModeRule::Sglang {
                page_aligned: info.capability.direct_io
                    || (config.use_direct_io.value && info.kind == BackendKind::File),
            },
        }
    }

    /// The length of a raw anchor marker as SGLang writes and reads it: 4096 bytes when it
    /// aligns pages, 1 otherwise (hicache's own rule asks 1; the connector rounds up to one
    /// aligned block).
    pub(super) fn raw_marker_len(self) -> u64 {
        match self {
            ModeRule::Sglang { page_aligned: true } => SGLANG_DIRECT_IO_ALIGN,
            _ => 1,
        }
    }
}

/// The transfer mode `config` gets for a pool on the backend `info` describes: [`decide_mode`]
/// under the config's [`ModeRule`], turned into bounce when `transfer_mode = bounce`.
pub fn choose_mode(
    geometry: &PoolGeometry,
    base: Option<u64>,
    info: &BackendInfo,
    config: &Config,
) -> (TransferMode, String) {
    let rule = ModeRule::of(config, info);
    bounce_if_asked(decide_mode(geometry, base, &info.capability, rule), config)
}

/// `decided`, turned into bounce when the config says `transfer_mode = bounce`.
fn bounce_if_asked(decided: (TransferMode, String), config: &Config) -> (TransferMode, String) {
    match decided {
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
/// and few enough spans per object. [`ModeRule::Sglang`] decides as SGLang's NIXL backend
/// does, so each side finds the other's objects: only `page_first` and `page_first_direct`
/// pools move zero-copy (as `_k`/`_v` objects; SGLang stores other layouts as one flat page),
/// and when direct I/O is asked for, only pools whose base and page stride meet SGLang's fixed
/// 4096-byte rule, whatever the filesystem's alignment.
pub fn decide_mode(
    geometry: &PoolGeometry,
    base: Option<u64>,
    capability: &Capability,
    rule: ModeRule,
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
    if let ModeRule::Sglang { page_aligned } = rule {
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
        if page_aligned {
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
        let needs = match rule {
            ModeRule::Sglang { page_aligned: true } => "SGLang's direct-I/O rule needs",
            _ => "direct I/O needs",
        };
        return (
            TransferMode::Bounce,
            format!(
                "{needs} {align}-byte alignment but the pool base {base:#x} or its span length {} is not a multiple of it",
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

/// The transfer mode of a sidecar pool whose buffers start at `bases`: zero-copy when every
/// span of every page is aligned as the backend's direct I/O needs (under SGLang naming with
/// direct I/O, SGLang's fixed 4096 bytes, as its hybrid pools decide) and an object's spans
/// fit the backend's segments; bounce otherwise, or when `transfer_mode = bounce`. Unlike a
/// KV pool, SGLang zero-copies a sidecar whatever its layout, so no layout is checked.
pub(super) fn choose_sidecar_mode(
    shape: &super::shape::PageShape,
    bases: &[u64],
    info: &BackendInfo,
    config: &Config,
) -> (TransferMode, String) {
    let capability = &info.capability;
    let rule = ModeRule::of(config, info);
    let mut align = effective_alignment(capability);
    let spans = shape.spans_per_page();
    // SGLang names each span of a zero-copy sidecar as its own object.
    let per_object = match rule {
        ModeRule::Sglang { page_aligned } => {
            if page_aligned {
                align = align.max(SGLANG_DIRECT_IO_ALIGN);
            }
            1
        }
        ModeRule::Hicache => spans,
    };
    let decided = if per_object + 1 > u64::from(capability.max_segments.max(1)) {
        (
            TransferMode::Bounce,
            format!(
                "an object would have {per_object} spans, more than the {} segments per object the backend takes",
                capability.max_segments
            ),
        )
    } else if !shape.aligned(bases, align) {
        (
            TransferMode::Bounce,
            format!(
                "zero-copy needs every buffer base, page stride and span {align}-byte aligned, and this pool's are not"
            ),
        )
    } else if align > 1 {
        (
            TransferMode::ZeroCopy,
            format!("every buffer base, page stride and span is {align}-byte aligned"),
        )
    } else {
        (
            TransferMode::ZeroCopy,
            format!("direct I/O is off; {spans} span(s) per page move in place"),
        )
    };
    bounce_if_asked(decided, config)
}
