//! The probe against the stand-in: dirs checked with a real registration and an O_DIRECT
//! block written and read back, each failure naming the dir and carrying its hint.

mod support;

use hicache_gds::GdsError;
use hicache_gds::probe::{Mode, probe};

/// A dir on the build's filesystem (O_DIRECT works there; /tmp may be tmpfs).
fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn every_dir_is_checked_with_a_registered_file_and_leaves_nothing() {
    let _turn = support::serial();
    let (a, b) = (dir(), dir());
    let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
    let found = probe(&dirs, Some(support::cufile())).unwrap();
    assert_eq!(found.dirs, dirs);
    assert!(found.stand_in);
    assert_eq!(found.loaded_from, support::cufile());
    let nvidia_fs = std::path::Path::new("/sys/module/nvidia_fs").exists();
    assert_eq!(found.mode == Mode::P2p, nvidia_fs);
    for d in &dirs {
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 0, "{}", d.display());
    }
}

#[test]
fn a_failure_names_the_dir_and_carries_the_hint() {
    let _turn = support::serial();
    let d = dir();
    support::fail("cuFileHandleRegister", 5027);
    let e = probe(&[d.path().to_path_buf()], Some(support::cufile()));
    support::fail("cuFileHandleRegister", 0);
    let e = e.unwrap_err();
    assert_eq!(e.dir.as_deref(), Some(d.path()));
    let text = e.to_string();
    assert!(
        text.starts_with(&d.path().display().to_string()) && text.contains("/run/udev/data"),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    // A dir that does not exist, and a library that does not.
    let gone = d.path().join("gone");
    let e = probe(std::slice::from_ref(&gone), Some(support::cufile())).unwrap_err();
    assert_eq!(e.dir.as_deref(), Some(gone.as_path()));
    assert!(e.to_string().contains("O_DIRECT"), "{e}");
    let e = probe(
        &[d.path().to_path_buf()],
        Some(&d.path().join("libcufile.so.0")),
    )
    .unwrap_err();
    assert!(
        e.dir.is_none() && matches!(e.source, GdsError::NotFound { .. }),
        "{e:?}"
    );
}
