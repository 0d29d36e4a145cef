//! KVDIR: a vendor's FILE plugin, written the way the plugin guide says, outside hicache's
//! own crates. It is used both ways a plugin can be: linked into a program (the
//! `kvdir-hicache` command of this crate, and any engine that names [`DESCRIPTOR`]), and
//! built as a shared library that hicache loads at run time (`hicache-abi`'s `kvdir`
//! example is `export_plugin!(kvdir::DESCRIPTOR)`).
//!
//! Its own layout: each object is one file `<storage dir>/kvdir/<bucket>/<key>`, where the
//! bucket is the key's hash modulo 64 in hex, written to a temporary file in the bucket,
//! flushed, and renamed over the name (atomic publish). Storage dirs are chosen by the
//! key's hash.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::raw::{
    BackendInfo, BackendKind, Capability, DynBackend, ListCursor, ListPage, Listed, MemoryRegion,
    ObjectKey, PluginContext, PluginDescriptor, PluginName, Probe, ReadItem, RegionId, RegionTable,
    StorageBackend, Usage, WriteItem,
};
use hicache_core::{MissReason, ReadOutcome, Result};

/// The plugin's name, given once: its errors, region table and descriptor are made from it.
pub const NAME: PluginName = PluginName::new("KVDIR");
const BUCKETS: u64 = 64;

hicache_core::plugin_params! {
    /// KVDIR's parameters.
    pub struct KvdirParams {
        sync: Bool = "sync" => "flush each object to stable storage before publishing it (default true)";
    }
}

/// The plugin's descriptor: name it where the registry is built (the guide's step 2).
pub static DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    NAME.as_str(),
    BackendKind::File,
    "one file per object under kvdir/ (a vendor's example)",
    probe,
    build,
)
.with_priority(10)
.with_params(KvdirParams::SPECS);

hicache_core::register_plugin!(DESCRIPTOR);

/// A KVDIR backend over `dir`, its parameters at their defaults: what the conformance suite
/// and tools that need no config build.
pub fn open(dir: &Path) -> Result<DynBackend> {
    let config = hicache_core::ConfigLoader::new()
        .set("storage_dir", dir.to_string_lossy().as_ref())
        .set("use_direct_io", false)
        .load()?;
    let params = hicache_core::raw::params_for(&DESCRIPTOR, &config)?;
    DESCRIPTOR.build(&PluginContext::new(&config, &params))
}

fn roots(ctx: &PluginContext<'_>) -> Vec<PathBuf> {
    ctx.config
        .storage_dirs
        .value
        .iter()
        .map(|d| d.join("kvdir"))
        .collect()
}

/// Usable when every storage dir takes a file and gives it back.
fn probe(ctx: &PluginContext<'_>) -> Probe {
    for root in roots(ctx) {
        let test = root.join(format!(".probe-{}", std::process::id()));
        let outcome = fs::create_dir_all(&root)
            .and_then(|()| fs::write(&test, b"kvdir"))
            .and_then(|()| fs::read(&test))
            .and_then(|b| {
                fs::remove_file(&test)?;
                if b == b"kvdir" {
                    Ok(())
                } else {
                    Err(std::io::Error::other("read back other bytes"))
                }
            });
        if let Err(e) = outcome {
            return Probe::unusable(
                format!("cannot store files under {}: {e}", root.display()),
                "point storage_dir at a writable directory",
            );
        }
    }
    Probe::usable("every storage dir stores and returns a file")
}

fn build(ctx: &PluginContext<'_>) -> Result<DynBackend> {
    let params = KvdirParams::from_params(ctx.params);
    let roots = roots(ctx);
    for root in &roots {
        for b in 0..BUCKETS {
            let dir = root.join(format!("{b:02x}"));
            fs::create_dir_all(&dir).map_err(NAME.io_at("mkdir", &dir))?;
        }
    }
    Ok(Arc::new(Kvdir {
        roots,
        sync: params.sync.map(|s| s.value).unwrap_or(true),
        regions: NAME.region_table(),
        temp: AtomicU64::new(0),
    }))
}

/// Host memory, any alignment, up to 1024 segments an item, atomic and persistent.
fn capability() -> Capability {
    let mut c = Capability::default();
    c.atomic_publish = true;
    c.max_segments = 1024;
    c.persistent = true;
    c
}

#[derive(Debug)]
struct Kvdir {
    roots: Vec<PathBuf>,
    sync: bool,
    regions: RegionTable,
    temp: AtomicU64,
}

impl Kvdir {
    fn bucket(&self, key: &ObjectKey) -> PathBuf {
        let h = key.hash();
        let root = &self.roots[(h % self.roots.len() as u64) as usize];
        root.join(format!("{:02x}", (h / self.roots.len() as u64) % BUCKETS))
    }

    fn path(&self, key: &ObjectKey) -> PathBuf {
        self.bucket(key).join(key.as_str())
    }

    fn write_one(&self, item: &WriteItem<'_>) -> Result<()> {
        capability().check_segments(item.key, item.segments.len())?;
        let bytes = self.regions.gather(item.segments)?;
        let bucket = self.bucket(item.key);
        let n = self.temp.fetch_add(1, Ordering::Relaxed);
        let temp = bucket.join(format!(".tmp-{}-{n}", std::process::id()));
        let result = (|| {
            let mut f = fs::File::create_new(&temp).map_err(NAME.io_at("create", &temp))?;
            f.write_all(&bytes).map_err(NAME.io_at("write", &temp))?;
            if self.sync {
                f.sync_data().map_err(NAME.io_at("fsync", &temp))?;
            }
            let path = self.path(item.key);
            fs::rename(&temp, &path).map_err(NAME.io_at("rename", &path))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    fn read_one(&self, item: &ReadItem<'_>) -> Result<ReadOutcome> {
        // Every slice is checked (and pinned) before the file is looked at: a bad slice is
        // an error even when the object does not exist.
        capability().check_segments(item.key, item.segments.len())?;
        let mut targets = item
            .segments
            .iter()
            .map(|s| self.regions.target(s))
            .collect::<Result<Vec<_>>>()?;
        let path = self.path(item.key);
        // O_NOFOLLOW: a link planted as the object's name is refused, never followed out of
        // the dir; O_NONBLOCK: a FIFO planted there is refused below instead of hanging the
        // open until a writer comes (on a regular file the flag changes nothing).
        let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags.bits())
            .open(&path);
        let f = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Ok(ReadOutcome::Miss(MissReason::NotFound));
            }
            Err(e) => return Err(NAME.io("open", path, e)),
        };
        let meta = f.metadata().map_err(NAME.io_at("fstat", &path))?;
        if !meta.is_file() {
            let e = std::io::Error::new(ErrorKind::InvalidData, "not a regular file");
            return Err(NAME.io("open", path, e));
        }
        let found = meta.len();
        if found != item.len() {
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected: item.len(),
                found,
            }));
        }
        let mut bytes = Vec::with_capacity(found as usize);
        // At most one byte past the page: a file that grew since the fstat is a mismatch,
        // not a reason to read all of it.
        f.take(item.len().saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(NAME.io_at("read", &path))?;
        if bytes.len() as u64 != item.len() {
            // Replaced by a shorter object between fstat and read.
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected: item.len(),
                found: bytes.len() as u64,
            }));
        }
        hicache_core::raw::scatter_into(NAME.as_str(), &mut targets, &bytes)?;
        Ok(ReadOutcome::Hit)
    }
}

#[async_trait::async_trait]
impl StorageBackend for Kvdir {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: NAME.to_string(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: BackendKind::File,
            capability: capability(),
            location: self
                .roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        self.regions.register(region, &capability())
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        self.regions.deregister(id)
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        batch.iter().map(|i| self.write_one(i)).collect()
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        batch.iter().map(|i| self.read_one(i)).collect()
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        keys.iter()
            .map(|k| {
                let path = self.path(k);
                match fs::symlink_metadata(&path) {
                    Ok(m) => Ok(m.is_file()),
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(NAME.io("stat", path, e)),
                }
            })
            .collect()
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        keys.iter()
            .map(|k| {
                let path = self.path(k);
                match fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(NAME.io("unlink", path, e)),
                }
            })
            .collect()
    }

    /// Every bucket is read and sorted for each page (simple, not fast): the cursor is the
    /// last object's `<root>/<bucket>/<key>`.
    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        let mut found = Vec::new();
        for (r, root) in self.roots.iter().enumerate() {
            for b in 0..BUCKETS {
                let dir = root.join(format!("{b:02x}"));
                let entries = match fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(NAME.io("readdir", dir, e)),
                };
                for entry in entries {
                    let entry = entry.map_err(NAME.io_at("readdir", &dir))?;
                    let name = entry.file_name();
                    let Some(name) = name.to_str() else { continue };
                    // Temporary files start with '.', which no key does.
                    let Ok(key) = ObjectKey::new(name) else {
                        continue;
                    };
                    if !name.starts_with(prefix) {
                        continue;
                    }
                    let Ok(meta) = entry.metadata() else { continue };
                    if meta.is_file() {
                        let at = format!("{r}/{b:02x}/{name}");
                        found.push((at, Listed::new(key, meta.len(), meta.modified().ok())));
                    }
                }
            }
        }
        found.sort_by(|x, y| x.0.cmp(&y.0));
        found.retain(|(at, _)| cursor.is_none_or(|c| *at > c.0));
        let more = found.len() > limit.max(1);
        found.truncate(limit.max(1));
        let next =
            more.then(|| ListCursor(found.last().map(|(at, _)| at.clone()).unwrap_or_default()));
        Ok(ListPage {
            objects: found.into_iter().map(|(_, l)| l).collect(),
            next,
        })
    }

    async fn usage(&self) -> Result<Usage> {
        // The filesystems' figures, summed over the storage dirs' distinct filesystems;
        // what KVDIR itself holds is not counted (that would walk every file).
        let mut usage = Usage::default();
        let mut seen = Vec::new();
        for root in &self.roots {
            let vfs = nix::sys::statvfs::statvfs(root)
                .map_err(|e| NAME.io("statvfs", root, std::io::Error::from(e)))?;
            if seen.contains(&vfs.filesystem_id()) {
                continue;
            }
            seen.push(vfs.filesystem_id());
            let block = vfs.fragment_size();
            *usage.total_bytes.get_or_insert(0) += vfs.blocks() * block;
            *usage.available_bytes.get_or_insert(0) += vfs.blocks_available() * block;
        }
        Ok(usage)
    }
}
