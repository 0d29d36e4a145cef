//! Building C plugins for tests with the system's C compiler, so a test proves the plugin
//! ABI from C without a build script.

use std::path::Path;
use std::process::Command;

/// Compiles C `files` (name, text; headers among them are found by `#include "…"`) into
/// the shared library `out`, with `-D` for each of `defines`, using `$CC` or `cc`.
/// Warnings are errors. Returns the compiler's complaint on failure.
pub fn shared_library(files: &[(&str, &str)], defines: &[&str], out: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let mut sources = Vec::new();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        if name.ends_with(".c") {
            sources.push(path);
        }
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
    ])
    .arg("-fvisibility=hidden")
    .arg("-o")
    .arg(out)
    .args(&sources)
    .args(defines.iter().map(|d| format!("-D{d}")))
    .arg("-lpthread");
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run the C compiler `{cc}` (set CC to one): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`{cc}` failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}
