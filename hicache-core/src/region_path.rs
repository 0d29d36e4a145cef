//! [`RegionPath`]: how a backend's transfers reach a registered region's bytes, so a caller
//! learns at registration whether pages move in place or are copied on the way.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Serialize, Serializer};

/// How a backend's transfers reach a registered region
/// ([`StorageBackend::region_path`](crate::raw::StorageBackend::region_path)).
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "path", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RegionPath {
    /// The backend's I/O reads and writes the region's bytes where they are.
    InPlace {
        /// What moves them (`pread/pwrite`, `io_uring`, `USRBIO on the pool's shm`).
        by: String,
    },
    /// Each transfer copies the bytes through the backend's own buffers.
    Copied(CopyReport),
    /// The backend does not say (the default of the trait method).
    Unstated,
}

impl RegionPath {
    /// In place, moved by `by`.
    pub fn in_place(by: impl Into<String>) -> Self {
        RegionPath::InPlace { by: by.into() }
    }

    /// Whether the bytes are copied on the way.
    pub fn is_copied(&self) -> bool {
        matches!(self, RegionPath::Copied(_))
    }
}

impl fmt::Display for RegionPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionPath::InPlace { by } => write!(f, "in place ({by})"),
            RegionPath::Copied(c) => write!(
                f,
                "copied through {} ({}); {} bytes so far",
                c.through,
                c.why,
                c.bytes.get()
            ),
            RegionPath::Unstated => f.write_str("not stated by the plugin"),
        }
    }
}

/// A copy a backend makes on every transfer of a region: through what, why, and a live count
/// of the bytes copied.
#[derive(Clone, Debug, Serialize)]
pub struct CopyReport {
    /// The buffers the bytes go through (`16 MiB USRBIO iovs`).
    pub through: String,
    /// Why the region cannot be moved in place, and what would allow it.
    pub why: String,
    /// Bytes copied so far for this backend (every region it copies), live.
    pub bytes: CopyCounter,
}

/// A shared count of bytes copied; clones count into the same total.
#[derive(Clone, Debug, Default)]
pub struct CopyCounter(Arc<AtomicU64>);

impl CopyCounter {
    /// A new counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `bytes` more.
    pub fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Serialize for CopyCounter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::{CopyCounter, CopyReport, RegionPath};

    #[test]
    fn a_copy_counter_is_shared_by_its_clones_and_shown_live() {
        let bytes = CopyCounter::new();
        let path = RegionPath::Copied(CopyReport {
            through: "iovs".into(),
            why: "not shared".into(),
            bytes: bytes.clone(),
        });
        bytes.add(4096);
        bytes.clone().add(1);
        assert!(path.is_copied());
        assert_eq!(
            path.to_string(),
            "copied through iovs (not shared); 4097 bytes so far"
        );
        assert!(!RegionPath::in_place("pread").is_copied());
        assert_eq!(RegionPath::Unstated.to_string(), "not stated by the plugin");
    }
}
