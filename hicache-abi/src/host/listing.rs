//! `list` of a loaded plugin: one call per page, the page handed to a host function that
//! copies and checks it during the call. Whatever the plugin hands over — a key that is no
//! key, one outside the prefix, more objects than asked for, a cursor without its NUL, a
//! page given twice or never — is a plugin contract error, never a panic.

use std::ffi::{CString, c_char, c_void};
use std::time::{Duration, SystemTime};

use hicache_core::raw::{ListCursor, ListPage, Listed, MAX_OBJECT_KEY_LEN, ObjectKey};
use hicache_core::{Error, Result};

use super::load::bounded_c_str;
use super::plugin::CPlugin;
use crate::abi::{self, hicache_error, hicache_listed};

/// What the page function collects during one `list` call.
struct Sink<'a> {
    prefix: &'a str,
    limit: u32,
    pages: u32,
    objects: Vec<Listed>,
    next: Option<ListCursor>,
    problem: Option<String>,
}

impl Sink<'_> {
    /// Copies and checks one page; the first problem found is kept.
    ///
    /// # Safety
    /// `objects` must point to `n` entries (or be NULL), each key to `key_len` bytes, and
    /// `next` be NULL or readable up to its NUL or `CURSOR_MAX + 1` bytes (the ABI).
    unsafe fn take(&mut self, objects: *const hicache_listed, n: u32, next: *const c_char) {
        self.pages += 1;
        if self.pages > 1 {
            self.problem
                .get_or_insert_with(|| "list called its page function more than once".into());
            return;
        }
        if n > self.limit {
            self.problem = Some(format!(
                "list returned {n} objects for a page of at most {}",
                self.limit
            ));
            return;
        }
        let entries: &[hicache_listed] = match (objects.is_null(), n) {
            (_, 0) => &[],
            (true, _) => {
                self.problem = Some(format!("list returned {n} objects at a NULL address"));
                return;
            }
            // SAFETY: `n` entries at `objects` (the caller's contract).
            (false, _) => unsafe { std::slice::from_raw_parts(objects, n as usize) },
        };
        for entry in entries {
            match self.listed(entry) {
                Ok(listed) => self.objects.push(listed),
                Err(problem) => {
                    self.problem = Some(problem);
                    return;
                }
            }
        }
        if !next.is_null() {
            // SAFETY: the caller's contract.
            let bytes = unsafe { bounded_c_str(next, abi::CURSOR_MAX + 1) };
            match std::str::from_utf8(bytes) {
                Ok(_) if bytes.len() > abi::CURSOR_MAX => {
                    self.problem = Some(format!(
                        "list returned a cursor longer than {} bytes",
                        abi::CURSOR_MAX
                    ));
                }
                Ok(text) => self.next = Some(ListCursor(text.to_string())),
                Err(_) => self.problem = Some("list returned a cursor that is not UTF-8".into()),
            }
        }
    }

    fn listed(&self, entry: &hicache_listed) -> std::result::Result<Listed, String> {
        if entry.key.is_null() || entry.key_len as usize > MAX_OBJECT_KEY_LEN {
            return Err(format!(
                "list returned a key of {} bytes at {:?} (at most {MAX_OBJECT_KEY_LEN}, not NULL)",
                entry.key_len, entry.key
            ));
        }
        // SAFETY: `key_len` bytes at `key` (ABI), checked non-NULL and bounded above.
        let bytes =
            unsafe { std::slice::from_raw_parts(entry.key.cast::<u8>(), entry.key_len as usize) };
        let text = std::str::from_utf8(bytes)
            .map_err(|_| format!("list returned a key that is not UTF-8: {bytes:?}"))?;
        let key = ObjectKey::new(text)
            .map_err(|e| format!("list returned {text:?}, which is not an object key: {e}"))?;
        if !text.starts_with(self.prefix) {
            return Err(format!(
                "list returned {text:?} for prefix {:?}",
                self.prefix
            ));
        }
        let modified = u64::try_from(entry.modified_ns)
            .ok()
            .and_then(|ns| SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(ns)));
        Ok(Listed::new(key, entry.size, modified))
    }
}

/// The page function the host hands to `list`.
unsafe extern "C" fn take_page(
    sink: *mut c_void,
    objects: *const hicache_listed,
    n: u32,
    next: *const c_char,
) {
    // A panic must not cross into C; there is none to expect here, but a bug of ours
    // becomes a contract error of the call rather than an abort.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `sink` is the `Sink` `list_page` passed, alive during its `list` call.
        if let Some(sink) = unsafe { sink.cast::<Sink<'_>>().as_mut() } {
            // SAFETY: the plugin's page, as the ABI describes it.
            unsafe { sink.take(objects, n, next) };
        }
    }));
}

/// One page of the listing of `plugin`'s `instance` (live for the call).
pub(crate) fn list_page(
    plugin: &CPlugin,
    instance: *mut c_void,
    prefix: &str,
    cursor: Option<&ListCursor>,
    limit: usize,
) -> Result<ListPage> {
    let Some(list) = plugin.table.list else {
        return Err(Error::Unsupported {
            component: plugin.name.into(),
            operation: "listing objects (its plugin table has no `list`)".into(),
        });
    };
    // No key holds a NUL, so no object has such a prefix.
    let Ok(c_prefix) = CString::new(prefix) else {
        return Ok(ListPage::default());
    };
    let c_cursor = match cursor {
        None => None,
        Some(c) if c.0.len() <= abi::CURSOR_MAX => {
            Some(CString::new(c.0.as_str()).map_err(|_| Error::InvalidBatch {
                reason: format!("{:?} is not a cursor {} made", c.0, plugin.name),
            })?)
        }
        Some(c) => {
            return Err(Error::InvalidBatch {
                reason: format!(
                    "a cursor of {} bytes is not one {} made (at most {})",
                    c.0.len(),
                    plugin.name,
                    abi::CURSOR_MAX
                ),
            });
        }
    };
    let limit = u32::try_from(limit.max(1)).unwrap_or(u32::MAX);
    let mut sink = Sink {
        prefix,
        limit,
        pages: 0,
        objects: Vec::new(),
        next: None,
        problem: None,
    };
    let mut err = hicache_error::empty();
    // SAFETY: a live instance; the strings, the sink and the error buffer outlive the call,
    // and the plugin calls the page function only during it (ABI).
    let status = unsafe {
        list(
            instance,
            c_prefix.as_ptr(),
            c_cursor.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            limit,
            take_page,
            (&raw mut sink).cast::<c_void>(),
            &mut err,
        )
    };
    if status != abi::OK {
        return Err(match status {
            abi::ERR_INVALID => Error::InvalidBatch {
                reason: format!(
                    "{} refused the listing: {}",
                    plugin.name,
                    abi::text(&err.message)
                ),
            },
            abi::ERR_UNSUPPORTED => Error::Unsupported {
                component: plugin.name.into(),
                operation: format!("listing objects: {}", abi::text(&err.message)),
            },
            _ => plugin.failed("list", &err),
        });
    }
    if let Some(problem) = sink.problem {
        return Err(plugin.contract(problem));
    }
    if sink.pages != 1 {
        return Err(plugin.contract(format!(
            "list returned OK after calling its page function {} times (once expected)",
            sink.pages
        )));
    }
    Ok(ListPage {
        objects: sink.objects,
        next: sink.next,
    })
}
