//! What a storage dir holds besides pages, for `hicache doctor`: links planted under it
//! (never followed by the plugin) and the spare dirs of the processes sharing it.
//!
//! Looking changes nothing: the walk opens dirs with `O_NOFOLLOW`, reads no page, creates and
//! removes nothing. Testing whether a spare dir's owner is gone takes its lock for a moment,
//! exactly as a starting writer would, and releases it.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::beneath::{self, RootDir};
use crate::spare::{self, SPARE_DIR};

/// What [`inspect_root`] found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RootContents {
    /// Symbolic links under the dir, at any level hicache uses (the plugin refuses them).
    pub links: Vec<PathBuf>,
    /// Entries named like bucket dirs (`00`..`ff`) that are not dirs.
    pub misplaced: Vec<PathBuf>,
    /// Spare dirs of running processes (this one's included, if it has the dir open).
    pub live_spare_dirs: Vec<String>,
    /// Spare dirs of processes that are gone; the next process to open the dir removes them.
    pub dead_spare_dirs: Vec<String>,
    /// Spare dirs whose owner cannot be proven gone (no lock file: another tool or an older
    /// hicache; or a filesystem without `flock`). Nothing removes them.
    pub unknown_spare_dirs: Vec<String>,
}

/// Walks `dir` (the configured storage dir; it may itself be a link) without following
/// anything beneath it.
pub fn inspect_root(dir: &Path) -> std::io::Result<RootContents> {
    let root = RootDir::open(dir, 0o700)?;
    let mut found = RootContents::default();
    for name in beneath::list(root.fd())? {
        let shown = dir.join(name.to_string_lossy().as_ref());
        let Ok(st) = beneath::stat(root.fd(), &name) else {
            continue;
        };
        let bucket = is_bucket_name(name.to_bytes());
        if beneath::is_link(&st) {
            found.links.push(shown);
        } else if bucket && st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            found.misplaced.push(shown);
        } else if bucket {
            links_in(root.fd(), &name, &shown, &mut found.links);
        } else if name.to_bytes() == SPARE_DIR.as_bytes() {
            let Ok(top) = beneath::open_dir(root.fd(), &name) else {
                continue;
            };
            let spares = spare::scan(top.as_fd(), None);
            found
                .links
                .extend(spares.links.iter().map(|l| shown.join(l)));
            for d in spares
                .live
                .iter()
                .chain(&spares.dead)
                .chain(&spares.unknown)
            {
                if let Ok(c) = CString::new(d.as_str()) {
                    links_in(top.as_fd(), &c, &shown.join(d), &mut found.links);
                }
            }
            found.live_spare_dirs = spares.live;
            found.dead_spare_dirs = spares.dead;
            found.unknown_spare_dirs = spares.unknown;
        }
    }
    Ok(found)
}

fn is_bucket_name(name: &[u8]) -> bool {
    name.len() == 2
        && name
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// Adds the links directly inside `parent/name` to `out`.
fn links_in(
    parent: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    shown: &Path,
    out: &mut Vec<PathBuf>,
) {
    let Ok(dir) = beneath::open_dir(parent, name) else {
        return;
    };
    let Ok(names) = beneath::list(dir.as_fd()) else {
        return;
    };
    for n in names {
        if beneath::stat(dir.as_fd(), &n).is_ok_and(|st| beneath::is_link(&st)) {
            out.push(shown.join(n.to_string_lossy().as_ref()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn finds_links_at_every_level_and_touches_nothing() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("ab")).unwrap();
        std::fs::create_dir_all(d.join(SPARE_DIR).join("h-b-1-00")).unwrap();
        symlink(outside.path(), d.join("cd")).unwrap();
        symlink(outside.path(), d.join("ab/page")).unwrap();
        symlink(outside.path(), d.join(SPARE_DIR).join("x")).unwrap();
        symlink(outside.path(), d.join(SPARE_DIR).join("h-b-1-00/7")).unwrap();
        std::fs::write(d.join("ef"), b"").unwrap();
        let found = inspect_root(d).unwrap();
        let mut links = found.links.clone();
        links.sort();
        let mut want = vec![
            d.join("cd"),
            d.join("ab/page"),
            d.join(SPARE_DIR).join("x"),
            d.join(SPARE_DIR).join("h-b-1-00/7"),
        ];
        want.sort();
        assert_eq!(links, want);
        assert_eq!(found.misplaced, vec![d.join("ef")]);
        assert_eq!(found.unknown_spare_dirs, vec!["h-b-1-00".to_string()]);
        // Nothing was removed.
        assert!(d.join("cd").is_symlink() && d.join(SPARE_DIR).join("x").is_symlink());
    }
}
