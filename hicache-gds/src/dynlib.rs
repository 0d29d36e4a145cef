//! Opening a vendor library at run time and taking functions out of it: what `cufile` and
//! `cuda` share.

use std::path::{Path, PathBuf};

use crate::error::GdsError;

/// The first of `candidates` (`explicit` alone when given) that loads, or
/// [`GdsError::NotFound`] naming `library`, each candidate with why it failed, and `fix`.
pub(crate) fn open_first(
    explicit: Option<&Path>,
    search: &[&str],
    library: &'static str,
    fix: &'static str,
) -> Result<(PathBuf, libloading::Library), GdsError> {
    let candidates: Vec<PathBuf> = match explicit {
        Some(p) => vec![p.to_path_buf()],
        None => search.iter().map(PathBuf::from).collect(),
    };
    let mut tried = Vec::new();
    for candidate in candidates {
        // SAFETY: loading runs the library's initialisers: those of the vendor library
        // searched for, or of the library the user named as it.
        match unsafe { libloading::Library::new(&candidate) } {
            Ok(lib) => return Ok((candidate, lib)),
            Err(e) => tried.push((candidate, e.to_string())),
        }
    }
    Err(GdsError::NotFound {
        library,
        tried,
        fix,
    })
}

/// The function `symbol` of `library` (loaded from `path`), copied out.
///
/// # Safety
/// `T` must be the C type of `symbol`, and the pointer must not be called after `library`
/// is unloaded (its owner keeps both together).
pub(crate) unsafe fn function<T: Copy>(
    library: &libloading::Library,
    path: &Path,
    symbol: &'static str,
) -> Result<T, GdsError> {
    // SAFETY: the caller's contract.
    unsafe { library.get::<T>(symbol.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| GdsError::MissingSymbol {
            path: path.to_path_buf(),
            symbol,
        })
}
