//! Listing stored objects: the bucket dirs of every root, walked in order (root, bucket,
//! name), each page continuing after the last object the previous one returned.
//!
//! Only complete objects are listed: names that are valid object keys and regular files.
//! Temporary files (their names start with `.`), spare files (in their own dir), links and
//! anything else are skipped. Nothing is created or followed: a missing bucket dir is empty.

use std::ffi::{CStr, CString};
use std::os::fd::AsFd;
use std::time::{Duration, SystemTime};

use hicache_core::raw::routing::bucket_name;
use hicache_core::raw::{ListCursor, ListPage, Listed, ObjectKey};
use hicache_core::{Error, Result};

use crate::NAME;
use crate::beneath;
use crate::root::Root;

/// Where a listing stands: root index, bucket, last name listed.
type Position = (usize, u8, Vec<u8>);

fn parse(cursor: &ListCursor) -> Result<Position> {
    let bad = || Error::InvalidBatch {
        reason: format!(
            "{NAME}: list cursor {:?} was not made by this plugin; pass the `next` of the previous page",
            cursor.0
        ),
    };
    let mut parts = cursor.0.splitn(3, '/');
    let root = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let bucket = parts
        .next()
        .and_then(|b| u8::from_str_radix(b, 16).ok())
        .ok_or_else(bad)?;
    let name = parts.next().ok_or_else(bad)?;
    Ok((root, bucket, name.as_bytes().to_vec()))
}

fn cursor((root, bucket, name): &Position) -> ListCursor {
    ListCursor(format!(
        "{root}/{bucket:02x}/{}",
        String::from_utf8_lossy(name)
    ))
}

/// One page of the objects under `roots` whose names start with `prefix`.
pub(crate) fn list(
    roots: &[Root],
    prefix: &str,
    after: Option<&ListCursor>,
    limit: usize,
) -> Result<ListPage> {
    let limit = limit.max(1);
    let after = after.map(parse).transpose()?;
    let mut page = ListPage::default();
    for (r, root) in roots.iter().enumerate() {
        for b in 0..=u8::MAX {
            if after
                .as_ref()
                .is_some_and(|(ar, ab, _)| (r, b) < (*ar, *ab))
            {
                continue;
            }
            let bucket = CString::new(bucket_name(b).to_vec()).expect("two hex digits");
            let dir = match beneath::open_dir(root.dir.fd(), &bucket) {
                Ok(dir) => dir,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(root, &bucket, "open", e)),
            };
            let mut names: Vec<CString> = beneath::list(dir.as_fd())
                .map_err(|e| io_error(root, &bucket, "list", e))?
                .into_iter()
                .filter(|n| {
                    let n = n.to_bytes();
                    !n.starts_with(b".")
                        && n.starts_with(prefix.as_bytes())
                        && after
                            .as_ref()
                            .is_none_or(|(ar, ab, an)| (r, b) != (*ar, *ab) || n > an.as_slice())
                })
                .collect();
            names.sort();
            for name in names {
                let Some(listed) = object(dir.as_fd(), &name) else {
                    continue;
                };
                page.objects.push(listed);
                if page.objects.len() == limit {
                    page.next = Some(cursor(&(r, b, name.into_bytes())));
                    return Ok(page);
                }
            }
        }
    }
    Ok(page)
}

/// `name` in a bucket dir as a listed object: `None` for what is not a complete object (a
/// name no key can have, a link, a dir, a file removed meanwhile).
fn object(dir: std::os::fd::BorrowedFd<'_>, name: &CStr) -> Option<Listed> {
    let key = ObjectKey::new(name.to_str().ok()?).ok()?;
    let st = beneath::stat(dir, name).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    Some(
        Listed::new(key, st.st_size as u64, time(st.st_mtime, st.st_mtime_nsec))
            .with_accessed(time(st.st_atime, st.st_atime_nsec)),
    )
}

/// A stat timestamp as a time, `None` before 1970.
pub(crate) fn time(secs: i64, nanos: i64) -> Option<SystemTime> {
    let secs = u64::try_from(secs).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, u32::try_from(nanos).unwrap_or(0)))
}

fn io_error(root: &Root, bucket: &CStr, op: &'static str, e: std::io::Error) -> Error {
    Error::io(
        NAME,
        op,
        Some(root.dir.path().join(bucket.to_string_lossy().as_ref())),
        e,
    )
}
