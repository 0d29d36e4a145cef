//! Storage dir lists: parsing SGLang's comma form and checking a list.

use std::path::{Path, PathBuf};

use super::*;
use crate::error::{Error, Result};

/// Storage dirs for humans: SGLang's comma form, or a JSON list when a dir holds a comma
/// (the comma form would read as two dirs).
pub(super) fn render_dirs(dirs: &[PathBuf]) -> String {
    let names: Vec<String> = dirs.iter().map(|p| p.display().to_string()).collect();
    if names.iter().any(|n| n.contains(',')) {
        serde_json::to_string(&names).unwrap_or_default()
    } else {
        names.join(",")
    }
}

/// Parses a comma list of storage dirs (SGLang's form): entries trimmed, empty ones dropped,
/// order kept, duplicates (same real path, e.g. through a symlink) rejected.
pub(crate) fn parse_dir_list(key: &str, list: &str, source: &Source) -> Result<Vec<PathBuf>> {
    check_dir_list(
        key,
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(PathBuf::from)
            .collect(),
        source,
    )
}

/// Checks a list of storage dirs taken verbatim: not empty, no entry empty, no duplicates
/// (same real path, e.g. through a symlink).
///
/// A relative entry from a config file is relative to the file's directory, not to the
/// process's working directory. Two entries are the same dir when their real paths match or,
/// for dirs that exist, their device and inode do (a bind mount has another path).
pub(crate) fn check_dir_list(
    key: &str,
    list: Vec<PathBuf>,
    source: &Source,
) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut real: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    for path in list {
        if path.as_os_str().is_empty() {
            return Err(Error::invalid_config(
                key,
                source.to_string(),
                "an entry of the list is empty",
            ));
        }
        let path = match source {
            Source::File(file) if path.is_relative() => file
                .parent()
                .map_or_else(|| path.clone(), |dir| dir.join(&path)),
            _ => path,
        };
        let canonical = real_path(&path);
        let identity = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
        if let Some(i) = real
            .iter()
            .position(|(r, id)| *r == canonical || (identity.is_some() && *id == identity))
        {
            return Err(Error::InvalidConfig {
                key: key.into(),
                source_desc: source.to_string(),
                reason: format!(
                    "duplicate path {} (same as {})",
                    path.display(),
                    dirs[i].display()
                ),
                hint: Some(if key == "storage_dir" {
                    "list each storage dir once; two entries resolving to the same directory would route pages twice".into()
                } else {
                    format!("list each dir of `{key}` once")
                }),
            });
        }
        dirs.push(path);
        real.push((canonical, identity));
    }
    if dirs.is_empty() {
        return Err(Error::invalid_config(
            key,
            source.to_string(),
            "the list has no directory",
        ));
    }
    Ok(dirs)
}

/// The real path of `path`: canonical for the longest existing ancestor, the rest appended.
pub(super) fn real_path(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}
