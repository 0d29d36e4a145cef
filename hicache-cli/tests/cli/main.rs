//! The `hicache` binary as a shell user runs it.

use std::process::Command;

#[cfg(feature = "posix")]
mod cleaner;
mod config_keys;
#[cfg(feature = "dynamic")]
mod dynamic;
mod flags;
#[cfg(feature = "gds")]
mod gds;
mod output;
mod shared_root;
#[cfg(feature = "3fs")]
mod threefs;

fn hicache() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hicache"));
    cmd.env_remove("HICACHE_CONFIG")
        .env_remove("HICACHE_STORAGE_DIR")
        .env_remove("HICACHE_BACKEND_PLUGIN")
        .env_remove("HICACHE_PLUGIN_DIR");
    cmd
}

/// Runs `cmd`, which must succeed (its stderr is the failure message).
fn success(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd.get_args().collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `cmd`, which must succeed, and parses what it printed as JSON.
fn json_output(cmd: &mut Command) -> serde_json::Value {
    serde_json::from_slice(&success(cmd).stdout).unwrap()
}
