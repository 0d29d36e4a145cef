//! The contract every storage plugin implements.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::key::ObjectKey;
use crate::memory::{MemKind, MemoryRegion, RegionId, RegionTable, Slice};
use crate::region_path::RegionPath;

/// Whether a backend stores files (addressed by path, routed over storage dirs) or objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Files on a (local, parallel or GPU-direct) filesystem.
    File,
    /// Objects in an object store (S3 and friends).
    Object,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::File => "FILE",
            BackendKind::Object => "OBJ",
        })
    }
}

/// What a backend can do, as plain data. Drives transfer-mode decisions and test gating.
///
/// [`Capability::default()`] is valid as it is: host memory, any alignment (1), one
/// segment per item, nothing else claimed. A plugin starts there and sets what it does:
///
/// ```
/// let mut c = hicache_core::raw::Capability::default();
/// assert!(c.problems().is_empty());
/// c.max_segments = 1024;
/// c.atomic_publish = true;
/// assert!(c.problems().is_empty());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capability {
    /// Transfers bypass the page cache (O_DIRECT or equivalent).
    pub direct_io: bool,
    /// Required alignment of memory addresses, object offsets and lengths, in bytes (1 when
    /// anything goes). Under direct I/O this is the storage's real alignment (statx DIOALIGN).
    pub io_alignment: u64,
    /// Transfers can target GPU memory without a host copy.
    pub gpu_direct: bool,
    /// Host memory can be registered.
    pub host_memory: bool,
    /// Device memory can be registered.
    pub device_memory: bool,
    /// An object becomes visible only once complete (crash-safe publish).
    pub atomic_publish: bool,
    /// Largest object the backend accepts, if bounded.
    pub max_object_size: Option<u64>,
    /// Most segments one item may gather from / scatter to.
    pub max_segments: u32,
    /// Data survives a process restart.
    pub persistent: bool,
}

impl Default for Capability {
    fn default() -> Self {
        Capability {
            direct_io: false,
            io_alignment: 1,
            gpu_direct: false,
            host_memory: true,
            device_memory: false,
            atomic_publish: false,
            max_object_size: None,
            max_segments: 1,
            persistent: false,
        }
    }
}

impl Capability {
    /// What makes this capability unusable, each naming the field and the fix; empty when
    /// it is valid. The conformance suite and the dynamic-plugin loader both check it.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.io_alignment.is_power_of_two() {
            out.push(format!(
                "io_alignment is {}: it must be a power of two (1 when any address and length go)",
                self.io_alignment
            ));
        } else if self.direct_io && self.io_alignment < 512 {
            out.push(format!(
                "io_alignment is {} under direct_io: set the storage's real direct-I/O alignment (statx DIOALIGN, at least 512)",
                self.io_alignment
            ));
        }
        if self.max_segments == 0 {
            out.push(
                "max_segments is 0: set how many segments one item may gather or scatter (at least 1)"
                    .into(),
            );
        }
        if !self.host_memory && !self.device_memory {
            out.push("neither host_memory nor device_memory is set: the backend could move no memory; set the kinds it accepts".into());
        }
        if self.max_object_size == Some(0) {
            out.push("max_object_size is Some(0): use None when objects are unbounded".into());
        }
        if self.gpu_direct && !self.device_memory {
            out.push("gpu_direct is set without device_memory: GPU-direct transfers need device memory registrations".into());
        }
        out
    }

    /// Refuses an item of more segments than [`Capability::max_segments`], before any I/O
    /// (a plugin must never truncate or split such an item silently).
    pub fn check_segments(
        &self,
        key: &crate::key::ObjectKey,
        segments: usize,
    ) -> crate::Result<()> {
        if segments > self.max_segments as usize {
            return Err(crate::Error::InvalidBatch {
                reason: format!(
                    "object {key} has {segments} segments; at most {} are allowed",
                    self.max_segments
                ),
            });
        }
        Ok(())
    }

    /// Whether memory of this kind can be registered.
    pub fn accepts(&self, kind: MemKind) -> bool {
        match kind {
            MemKind::Host => self.host_memory,
            MemKind::Device { .. } => self.device_memory,
        }
    }
}

/// Identity of a backend instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendInfo {
    /// Plugin name, e.g. `POSIX`.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// File or object storage.
    pub kind: BackendKind,
    /// What it can do.
    pub capability: Capability,
    /// Where it stores data (dirs, bucket URL), for humans.
    pub location: String,
}

/// One object to write: its bytes are the concatenation of `segments`, in order.
#[derive(Clone, Copy, Debug)]
pub struct WriteItem<'a> {
    /// The object's name.
    pub key: &'a ObjectKey,
    /// Where the bytes come from.
    pub segments: &'a [Slice],
}

/// Checks one object where a read put it: the item's index in the batch and its segments'
/// bytes, in order. `Err(reason)` makes the item a miss for that reason.
///
/// `IoSlice` so that a plugin can lend the `iovec`s it read into, as they are (on Unix the two
/// have one layout), with no copy and no allocation per object.
pub type ReadCheck<'a> =
    dyn Fn(usize, &[std::io::IoSlice<'_>]) -> std::result::Result<(), MissReason> + Sync + 'a;

/// Completes one object just before a write sends it: the item's index in the batch, its
/// payload (the bytes of every segment after the first, in order), and a copy of its first
/// segment to fill in (its header). `Err` fails the item, and nothing of it is written.
///
/// The header is filled from the payload on the thread that is about to write it, so the
/// payload's bytes are still in cache when the write copies them: the connector checksums
/// enveloped pages here.
pub type WriteSeal<'a> =
    dyn Fn(usize, &[std::io::IoSlice<'_>], &mut [u8]) -> crate::error::Result<()> + Sync + 'a;

/// One object to read: its bytes are scattered into `segments`, in order.
#[derive(Clone, Copy, Debug)]
pub struct ReadItem<'a> {
    /// The object's name.
    pub key: &'a ObjectKey,
    /// Where the bytes go. Their total length must equal the object's length.
    pub segments: &'a [Slice],
}

impl WriteItem<'_> {
    /// Total bytes of the object.
    pub fn len(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ReadItem<'_> {
    /// Total bytes expected.
    pub fn len(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    /// Whether nothing is expected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a read found no valid page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MissReason {
    /// No object under that name.
    NotFound,
    /// The object exists but its length is not what the reader expects (torn, truncated,
    /// or written with another geometry).
    SizeMismatch {
        /// Bytes the reader expected.
        expected: u64,
        /// Bytes stored.
        found: u64,
    },
    /// The envelope header is not a hicache header or not this version.
    BadHeader {
        /// What is wrong.
        detail: String,
    },
    /// The object belongs to another namespace (model, rank, layout, dtype, geometry).
    ForeignNamespace,
    /// The header names another key (a renamed or misplaced file).
    KeyMismatch,
    /// The payload does not match its checksum.
    ChecksumMismatch,
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MissReason::NotFound => f.write_str("not found"),
            MissReason::SizeMismatch { expected, found } => {
                write!(f, "size mismatch: expected {expected} bytes, found {found}")
            }
            MissReason::BadHeader { detail } => write!(f, "bad header: {detail}"),
            MissReason::ForeignNamespace => f.write_str("written by another namespace"),
            MissReason::KeyMismatch => f.write_str("header names another key"),
            MissReason::ChecksumMismatch => f.write_str("payload checksum mismatch"),
        }
    }
}

impl MissReason {
    /// Whether the object exists but is not valid for this reader (corrupt, torn, foreign).
    pub fn is_invalid_object(&self) -> bool {
        !matches!(self, MissReason::NotFound)
    }

    /// A short stable name for the reason, as metrics label misses: `not_found`, `torn`,
    /// `bad_header`, `foreign`, `wrong_key`, `corrupt`.
    pub fn label(&self) -> &'static str {
        match self {
            MissReason::NotFound => "not_found",
            MissReason::SizeMismatch { .. } => "torn",
            MissReason::BadHeader { .. } => "bad_header",
            MissReason::ForeignNamespace => "foreign",
            MissReason::KeyMismatch => "wrong_key",
            MissReason::ChecksumMismatch => "corrupt",
        }
    }
}

/// The result of reading one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReadOutcome {
    /// The object was read in full into its segments.
    Hit,
    /// No valid object: the segments' contents are unspecified.
    Miss(MissReason),
}

impl ReadOutcome {
    /// Whether the read delivered the page.
    pub fn is_hit(&self) -> bool {
        matches!(self, ReadOutcome::Hit)
    }
}

/// Capacity numbers for the capacity manager and `hicache doctor`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Total bytes of the storage (summed over dirs), if known.
    pub total_bytes: Option<u64>,
    /// Bytes in use, if known.
    pub used_bytes: Option<u64>,
    /// Bytes still free for this user, if known.
    pub available_bytes: Option<u64>,
}

/// One stored object, as a listing sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listed {
    /// Its name.
    pub key: ObjectKey,
    /// Its length in bytes.
    pub size: u64,
    /// When it was last written, when the storage knows.
    pub modified: Option<std::time::SystemTime>,
    /// When it was last read, when the storage records it (POSIX: the file's access time,
    /// which a running cleaner keeps up to date for pages hicache reads).
    pub accessed: Option<std::time::SystemTime>,
}

impl Listed {
    /// An object of `size` bytes, last written at `modified`.
    pub fn new(key: ObjectKey, size: u64, modified: Option<std::time::SystemTime>) -> Self {
        Listed {
            key,
            size,
            modified,
            accessed: None,
        }
    }

    /// The same, last read at `accessed`.
    pub fn with_accessed(mut self, accessed: Option<std::time::SystemTime>) -> Self {
        self.accessed = accessed;
        self
    }

    /// Its last known use: the later of its last write and its last read.
    pub fn last_used(&self) -> Option<std::time::SystemTime> {
        self.modified.max(self.accessed)
    }
}

/// Where a listing goes on: opaque text made by the backend that listed the page before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListCursor(pub String);

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Objects of this page, in the backend's order.
    pub objects: Vec<Listed>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<ListCursor>,
}

/// A walk through one listing, a page at a time: for tools that go through a whole store
/// (scrub, usage, a cleaner) without holding it in memory. It ends after the page without a
/// cursor, and refuses (as [`Error::PluginContract`]) a cursor that does not move.
#[derive(Debug)]
pub struct ListWalk<'a> {
    backend: &'a dyn StorageBackend,
    prefix: &'a str,
    limit: usize,
    cursor: Option<ListCursor>,
    done: bool,
}

impl<'a> ListWalk<'a> {
    /// The objects of `backend` whose names start with `prefix`, up to `limit` a page.
    pub fn new(backend: &'a dyn StorageBackend, prefix: &'a str, limit: usize) -> Self {
        ListWalk {
            backend,
            prefix,
            limit: limit.max(1),
            cursor: None,
            done: false,
        }
    }

    /// The next page's objects; `None` once the listing has ended.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Listed>>> {
        if self.done {
            return Ok(None);
        }
        let page = self
            .backend
            .list(self.prefix, self.cursor.as_ref(), self.limit)
            .await?;
        match page.next {
            Some(next) if Some(&next) == self.cursor.as_ref() => {
                self.done = true;
                return Err(Error::PluginContract {
                    plugin: self.backend.info().name,
                    detail: "list returned the cursor it was given: the listing would never end"
                        .into(),
                });
            }
            Some(next) => self.cursor = Some(next),
            None => self.done = true,
        }
        Ok(Some(page.objects))
    }
}

/// Every object under `prefix`, page by page (`page` objects a call). Stops at the first
/// error.
pub async fn list_all(
    backend: &dyn StorageBackend,
    prefix: &str,
    page: usize,
) -> Result<Vec<Listed>> {
    let mut walk = ListWalk::new(backend, prefix, page);
    let mut out = Vec::new();
    while let Some(objects) = walk.next_page().await? {
        out.extend(objects);
    }
    Ok(out)
}

/// A batch-oriented storage engine: the one trait every plugin implements.
///
/// See the [`crate::docs::backend_design`] note for how io_uring, object stores, cuFile,
/// 3FS usrbio and C-ABI plugins map onto it.
///
/// # Behavior
/// - Batches return **one result per item**, in order; one failing item never fails others.
///   The connector treats any other count as a plugin bug and fails every item of the batch.
/// - `write` publishes each object atomically when [`Capability::atomic_publish`] is set:
///   a reader sees the old object, the new one, or none — never a mix. Writing an existing
///   key replaces it.
/// - `read` of a missing object is `Ok(ReadOutcome::Miss(MissReason::NotFound))`; an object
///   whose length differs from the segments' total is `Miss(SizeMismatch)`; both leave the
///   store unchanged. `Err` is kept for failures (I/O error, timeout, bad slice).
/// - Every slice is checked against the registrations before I/O: an unknown region or an
///   out-of-range slice is [`Error::UnregisteredRegion`](crate::Error::UnregisteredRegion) /
///   [`Error::SliceOutOfRange`](crate::Error::SliceOutOfRange) for that item; under direct
///   I/O a misaligned slice is [`Error::Misaligned`](crate::Error::Misaligned), never an EINVAL
///   from the kernel.
/// - `read_checked` answers `None` (the default: nothing read, the caller reads and checks)
///   or reads like `read` and has run the check on every item it reports as a `Hit`, with
///   that item's bytes; a failed check is that item's `Miss(reason)`.
/// - `exists` creates nothing; `remove` of a missing key is `Ok(())`.
/// - An empty batch returns an empty vector and does no I/O.
/// - `list` pages through complete objects whose names start with a prefix: across the
///   pages of one listing, every object that exists throughout it appears exactly once,
///   with its size; temporary and incomplete objects never appear. A backend that cannot
///   list keeps the default, which is [`Error::Unsupported`](crate::Error::Unsupported).
#[async_trait]
pub trait StorageBackend: Send + Sync + fmt::Debug + 'static {
    /// Name, version, kind, capability, location.
    fn info(&self) -> BackendInfo;

    /// Makes memory available for transfers; returns the id transfers name it by.
    fn register(&self, region: MemoryRegion) -> Result<RegionId>;

    /// Releases a registration. Transfers naming it afterwards fail with a typed error.
    fn deregister(&self, id: RegionId) -> Result<()>;

    /// How transfers reach the registered region `id`: in place, or copied through the
    /// backend's buffers (with a live count), so `register_pool` can tell the caller. The
    /// default says nothing ([`RegionPath::Unstated`]); an unknown id answers the same.
    fn region_path(&self, id: RegionId) -> RegionPath {
        let _ = id;
        RegionPath::Unstated
    }

    /// Writes each item's segments as one object.
    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>>;

    /// Writes like [`write`](Self::write), but each item's first segment is a header that
    /// `seal` fills in first: for each item, on the thread that will write it, the backend
    /// copies the first segment, calls `seal` with the item's index, its other segments'
    /// bytes and the copy, and writes the filled copy in the first segment's place (the
    /// first segment's own memory is only read). An `Err` from `seal` is the item's error,
    /// and the item is not written.
    ///
    /// `None`, the default: this backend does not seal, nothing was written, and the caller
    /// completes its headers itself and calls `write`. A backend that answers `Some` has
    /// called `seal` exactly once for every item it reports written.
    async fn write_sealed(
        &self,
        batch: &[WriteItem<'_>],
        seal: &WriteSeal<'_>,
    ) -> Option<Vec<Result<()>>> {
        let _ = (batch, seal);
        None
    }

    /// Reads each object into its item's segments.
    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>>;

    /// Reads like [`read`](Self::read), and runs `check` on each object read whole, on the
    /// thread that read it, right after (while its bytes are still in cache); a failed check
    /// makes the item `Miss(reason)`. The connector passes its envelope verification here.
    ///
    /// `None`, the default: this backend does not check where it reads, nothing was read, and
    /// the caller reads and checks itself. A backend that answers `Some` has called `check`
    /// for every item that it reports as a `Hit`.
    async fn read_checked(
        &self,
        batch: &[ReadItem<'_>],
        check: &ReadCheck<'_>,
    ) -> Option<Vec<Result<ReadOutcome>>> {
        let _ = (batch, check);
        None
    }

    /// Whether each object exists (complete objects only).
    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>>;

    /// Removes each object; a missing object is not an error.
    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>>;

    /// Capacity figures.
    async fn usage(&self) -> Result<Usage>;

    /// Up to `limit` (at least 1) objects whose names start with `prefix`, continuing after
    /// `cursor` (the previous page's `next`; `None` starts the listing).
    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        let _ = (prefix, cursor, limit);
        Err(Error::Unsupported {
            component: self.info().name.into(),
            operation: "listing objects".into(),
        })
    }
}

/// A shared, type-erased backend.
pub type DynBackend = Arc<dyn StorageBackend>;

/// The registration helpers of [`RegionTable`] that read a [`Capability`] (here, so the
/// memory module does not depend on this one).
impl RegionTable {
    /// The whole `register` of a plugin whose registration is bookkeeping only: refuses a
    /// memory kind `capability` does not accept ([`Error::Unsupported`] naming the kind and
    /// the kinds accepted), else adds the region and returns its id.
    pub fn register(&self, region: MemoryRegion, capability: &Capability) -> Result<RegionId> {
        if !capability.accepts(region.kind()) {
            let accepted = match (capability.host_memory, capability.device_memory) {
                (true, true) => "host and device",
                (true, false) => "host",
                (false, true) => "device",
                (false, false) => "no",
            };
            return Err(Error::Unsupported {
                component: self.backend_name().to_string().into(),
                operation: format!(
                    "registering {} memory ({} moves {accepted} memory)",
                    region.kind(),
                    self.backend_name()
                ),
            });
        }
        Ok(self.insert(region))
    }

    /// The whole `deregister` of such a plugin: [`remove`](Self::remove), result dropped.
    pub fn deregister(&self, id: RegionId) -> Result<()> {
        self.remove(id).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::Capability;
    use crate::error::Error;
    use crate::memory::{AlignedBuf, MemKind, MemoryRegion, RegionTable};

    #[test]
    fn the_default_capability_is_valid_and_every_problem_names_its_field() {
        assert_eq!(Capability::default().problems(), Vec::<String>::new());
        type Break = fn(&mut Capability);
        let cases: [(&str, Break); 6] = [
            ("io_alignment is 0", |c| c.io_alignment = 0),
            ("io_alignment is 24", |c| c.io_alignment = 24),
            ("io_alignment is 1 under direct_io", |c| c.direct_io = true),
            ("max_segments is 0", |c| c.max_segments = 0),
            ("neither host_memory nor device_memory", |c| {
                c.host_memory = false
            }),
            ("max_object_size is Some(0)", |c| {
                c.max_object_size = Some(0)
            }),
        ];
        for (says, break_it) in cases {
            let mut c = Capability::default();
            break_it(&mut c);
            let problems = c.problems();
            assert!(
                problems.len() == 1 && problems[0].starts_with(says),
                "{says}: {problems:?}"
            );
        }
        let mut gpu = Capability {
            gpu_direct: true,
            ..Capability::default()
        };
        assert!(gpu.problems()[0].starts_with("gpu_direct is set without device_memory"));
        gpu.device_memory = true;
        assert!(gpu.problems().is_empty());
    }

    #[test]
    fn register_checks_the_kind_against_the_capability() {
        let table = RegionTable::new("ACME");
        let host = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
        let cap = Capability::default();
        let id = table.register(host, &cap).unwrap();
        let fake = std::ptr::NonNull::<u8>::dangling().as_ptr();
        // SAFETY: the address is never dereferenced: registration is refused before any use.
        let device = unsafe { MemoryRegion::from_raw(fake, 4096, MemKind::Device { device: 0 }) };
        let e = table.register(device, &cap).unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported { operation, .. }
                if operation == "registering device:0 memory (ACME moves host memory)"),
            "{e:?}"
        );
        assert_eq!(table.len(), 1);
        table.deregister(id).unwrap();
        assert!(matches!(
            table.deregister(id),
            Err(Error::UnregisteredRegion { .. })
        ));
    }
}
