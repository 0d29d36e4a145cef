//! The index against real changes to a watched dir, made as another process would make them
//! (plain `std::fs` calls, not through the index).

use std::os::fd::AsFd;

use super::*;

const B: Bucket = (0, *b"ab");

fn watched() -> (tempfile::TempDir, std::fs::File, KnownNames) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ab")).unwrap();
    let handle = std::fs::File::open(dir.path().join("ab")).unwrap();
    let known = KnownNames::new().expect("inotify");
    known.watch(B, handle.as_fd());
    (dir, handle, known)
}

fn known_after_stat(known: &KnownNames, name: &[u8]) {
    known.refresh();
    let seen = known.seen(B);
    known.insert(B, seen, name);
    assert!(known.contains(B, name));
}

#[test]
fn only_local_filesystems_are_indexed() {
    for fs in ["ext4", "xfs", "btrfs", "tmpfs", "ramfs"] {
        assert!(watchable(fs), "{fs}");
    }
    for fs in [
        "nfs",
        "fuse",
        "lustre",
        "gpfs",
        "overlayfs",
        "zfs",
        "fs-magic-0x1234",
    ] {
        assert!(!watchable(fs), "{fs}");
    }
}

#[test]
fn every_change_to_a_name_drops_it_at_the_next_refresh() {
    let (dir, _handle, known) = watched();
    let ab = dir.path().join("ab");
    // Removed.
    std::fs::write(ab.join("k"), b"x").unwrap();
    known_after_stat(&known, b"k");
    std::fs::remove_file(ab.join("k")).unwrap();
    known.refresh();
    assert!(!known.contains(B, b"k"));
    // Renamed away.
    std::fs::write(ab.join("k"), b"x").unwrap();
    known_after_stat(&known, b"k");
    std::fs::rename(ab.join("k"), dir.path().join("elsewhere")).unwrap();
    known.refresh();
    assert!(!known.contains(B, b"k"));
    // Renamed over (replaced by a link, say).
    std::fs::write(ab.join("k"), b"x").unwrap();
    known_after_stat(&known, b"k");
    std::os::unix::fs::symlink("/etc/passwd", ab.join("link")).unwrap();
    std::fs::rename(ab.join("link"), ab.join("k")).unwrap();
    known.refresh();
    assert!(!known.contains(B, b"k"));
    // A change to another name leaves this one known.
    std::fs::write(ab.join("j"), b"x").unwrap();
    known_after_stat(&known, b"j");
    std::fs::write(ab.join("other"), b"x").unwrap();
    known.refresh();
    assert!(known.contains(B, b"j"));
    assert_eq!(known.len(), 1);
}

#[test]
fn a_stat_overtaken_by_a_change_is_not_recorded() {
    let (dir, _handle, known) = watched();
    known.refresh();
    let seen = known.seen(B);
    // The stat found k; then k was removed and another call applied that event.
    std::fs::write(dir.path().join("ab/k"), b"x").unwrap();
    std::fs::remove_file(dir.path().join("ab/k")).unwrap();
    known.refresh();
    known.insert(B, seen, b"k");
    assert!(!known.contains(B, b"k"));
    // Unwatched buckets never record.
    known.insert((0, *b"cd"), known.seen((0, *b"cd")), b"k");
    assert!(!known.contains((0, *b"cd"), b"k"));
}

#[test]
fn a_bucket_dir_that_goes_takes_its_names_and_its_watch() {
    let (dir, handle, known) = watched();
    std::fs::write(dir.path().join("ab/k"), b"x").unwrap();
    known_after_stat(&known, b"k");
    let seen = known.seen(B);
    // Removed and made again while this process holds the old dir open (the kernel then
    // reports the entries' removal, not the dir's).
    std::fs::remove_dir_all(dir.path().join("ab")).unwrap();
    std::fs::create_dir(dir.path().join("ab")).unwrap();
    known.refresh();
    assert!(!known.contains(B, b"k"));
    assert_eq!(known.len(), 0);
    // The removed dir is not watched again: nothing is recorded through it.
    known.watch(B, handle.as_fd());
    known.insert(B, known.seen(B), b"k");
    assert!(!known.contains(B, b"k"));
    // The new dir is watched; a stat begun before the switch is not recorded.
    let fresh = std::fs::File::open(dir.path().join("ab")).unwrap();
    known.watch(B, fresh.as_fd());
    known.insert(B, seen, b"k");
    assert!(!known.contains(B, b"k"));
    known_after_stat(&known, b"k");
    // Renamed away whole: its names go.
    std::fs::rename(dir.path().join("ab"), dir.path().join("moved")).unwrap();
    known.refresh();
    assert!(!known.contains(B, b"k"));
}

#[test]
fn lost_events_drop_the_whole_index() {
    let (dir, _handle, known) = watched();
    std::fs::write(dir.path().join("ab/k"), b"x").unwrap();
    known_after_stat(&known, b"k");
    let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16384);
    if max > 200_000 {
        eprintln!("max_queued_events = {max}: too many events to overflow in a test; skipped");
        return;
    }
    // More creations than the kernel queues: it drops the rest and says so.
    for i in 0..max + 16 {
        std::fs::File::create(dir.path().join(format!("ab/f{i}"))).unwrap();
    }
    known.refresh();
    assert!(!known.contains(B, b"k"));
    assert_eq!(known.len(), 0);
}
