//! Scrub of any plugin that can list its objects: page through the listing, read each
//! object through the plugin into registered memory, check it there, and remove what
//! `--delete` may remove through the plugin too.
//!
//! A listing shows complete objects only (the backend contract), so temporary objects of
//! killed writers are not seen here; the plugin cleans those up (for POSIX dirs, [`super::scrub`]
//! finds them).

use hicache::raw::{AlignedBuf, ListWalk, MemoryRegion, ReadItem, RegionId, Slice, StorageBackend};
use hicache::{Error, MissReason, ReadOutcome, Result};

use super::{DELETABLE, Finding, ScrubReport, check_object, parse_namespace};
use crate::progress;

/// Objects larger than this are reported as unreadable instead of being read: an object is
/// read whole through its plugin, so this bounds the memory scrub takes.
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// What to scrub through a plugin.
#[derive(Clone, Debug)]
pub struct ListScrubOptions {
    /// Only objects whose names start with this.
    pub prefix: String,
    /// Remove torn, corrupt and foreign objects.
    pub delete: bool,
    /// Only this namespace (16 hex chars, as in object names) counts as ours; others are
    /// reported as foreign.
    pub namespace: Option<String>,
    /// Objects asked for per listing call.
    pub page: usize,
    /// Objects larger than this are reported as unreadable, not read (at most
    /// [`MAX_OBJECT_BYTES`] is sensible).
    pub max_object_bytes: u64,
    /// Show a count on stderr when it is a terminal.
    pub progress: bool,
}

impl Default for ListScrubOptions {
    fn default() -> Self {
        ListScrubOptions {
            prefix: String::new(),
            delete: false,
            namespace: None,
            page: 1000,
            max_object_bytes: MAX_OBJECT_BYTES,
            progress: false,
        }
    }
}

/// One registered buffer, replaced by a larger one when an object needs it.
struct Scratch<'a> {
    backend: &'a dyn StorageBackend,
    align: usize,
    held: Option<(RegionId, MemoryRegion)>,
}

impl Scratch<'_> {
    /// A registered region of at least `len` bytes.
    fn at_least(&mut self, len: u64) -> Result<(RegionId, MemoryRegion)> {
        if let Some((id, region)) = &self.held
            && region.len() >= len
        {
            return Ok((*id, region.clone()));
        }
        self.release()?;
        let size = len
            .max(1)
            .checked_next_multiple_of(self.align as u64)
            .and_then(|size| usize::try_from(size).ok())
            .ok_or_else(|| Error::backend("scrub", format!("{len} bytes do not fit in memory")))?;
        let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(size, self.align)?);
        let id = self.backend.register(region.clone())?;
        self.held = Some((id, region.clone()));
        Ok((id, region))
    }

    fn release(&mut self) -> Result<()> {
        match self.held.take() {
            Some((id, _)) => self.backend.deregister(id),
            None => Ok(()),
        }
    }
}

/// Scrubs every object `backend` lists under `opts.prefix`: each is read through the plugin
/// and its envelope, name, namespace, length and checksum checked; `--delete` removes what
/// is torn, corrupt or foreign through the plugin. An object removed or rewritten between
/// the listing and the read is counted as skipped. A plugin that cannot list is the error it returns
/// ([`Error::Unsupported`]).
pub async fn scrub_backend(
    backend: &dyn StorageBackend,
    opts: &ListScrubOptions,
) -> Result<ScrubReport> {
    let namespace = opts.namespace.as_deref().map(parse_namespace).transpose()?;
    let info = backend.info();
    let mut scratch = Scratch {
        backend,
        align: usize::try_from(info.capability.io_alignment.max(1)).unwrap_or(4096),
        held: None,
    };
    let mut report = ScrubReport::default();
    let progress = progress::spinner(opts.progress, "scrub");
    let mut walk = ListWalk::new(backend, &opts.prefix, opts.page);
    let outcome = async {
        while let Some(objects) = walk.next_page().await? {
            for listed in &objects {
                let name = listed.key.as_str();
                let finding = if listed.size > opts.max_object_bytes {
                    Some((
                        "unreadable",
                        format!(
                            "{} bytes: larger than scrub reads through a plugin ({} bytes)",
                            listed.size, opts.max_object_bytes
                        ),
                    ))
                } else {
                    let (id, region) = scratch.at_least(listed.size)?;
                    let segments = [Slice::new(id, 0, listed.size)];
                    let item = ReadItem {
                        key: &listed.key,
                        segments: &segments,
                    };
                    let read = backend.read(&[item]).await.into_iter().next();
                    match read {
                        // Removed or rewritten since it was listed (or where reads do not
                        // look): not this walk's to judge.
                        Some(Ok(ReadOutcome::Miss(
                            MissReason::NotFound | MissReason::SizeMismatch { .. },
                        ))) => {
                            report.skipped += 1;
                            continue;
                        }
                        Some(Ok(ReadOutcome::Hit)) => {
                            let bytes =
                                region.source(0, listed.size, "scrub")?.into_host_bytes()?;
                            check_object(
                                bytes.as_ref(),
                                name,
                                None,
                                namespace.as_deref(),
                                &mut report,
                            )
                        }
                        Some(Ok(ReadOutcome::Miss(other))) => {
                            Some(("corrupt", format!("{} reports: {other}", info.name)))
                        }
                        Some(Err(e)) => Some((
                            "unreadable",
                            format!("cannot read it through {}: {e}", info.name),
                        )),
                        None => {
                            return Err(Error::PluginContract {
                                plugin: info.name.clone(),
                                detail: "read returned no result for a batch of one".into(),
                            });
                        }
                    }
                };
                // Skipped objects left above; every other one was looked at.
                report.files += 1;
                progress.set_message(format!("{} objects", report.files));
                if let Some((kind, reason)) = finding {
                    let deleted = opts.delete
                        && DELETABLE.contains(&kind)
                        && matches!(
                            backend
                                .remove(std::slice::from_ref(&listed.key))
                                .await
                                .first(),
                            Some(Ok(()))
                        );
                    report.findings.push(Finding {
                        path: name.into(),
                        kind,
                        reason,
                        deleted,
                    });
                }
            }
        }
        Ok(())
    }
    .await;
    progress.finish_and_clear();
    // The scratch buffer is released whatever happened; its error is reported only when
    // the walk itself went well.
    let released = scratch.release();
    outcome?;
    released?;
    Ok(report)
}
