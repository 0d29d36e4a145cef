//! The `hicache` binary as a shell user runs it.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

fn hicache() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hicache"));
    cmd.env_remove("HICACHE_CONFIG")
        .env_remove("HICACHE_STORAGE_DIR")
        .env_remove("HICACHE_BACKEND_PLUGIN");
    cmd
}

/// `hicache config show | true`: the reader is gone before the first write; hicache ends quietly (killed by
/// SIGPIPE like any Unix tool), never with a panic.
#[test]
fn a_closed_pipe_ends_quietly() {
    for args in [
        &["config", "show"][..],
        &["plugins"][..],
        &["config", "show", "--json"][..],
    ] {
        let mut child = hicache()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before hicache writes a byte: its first write meets a broken pipe.
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            status.success() || status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {status:?} {err}"
        );
    }
}
