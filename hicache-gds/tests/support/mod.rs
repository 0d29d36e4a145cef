//! The stand-ins the tests load, built once per test binary, and what the tests share.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

struct Built {
    _dir: tempfile::TempDir,
    cufile: PathBuf,
    cudart: PathBuf,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Under the build's own tmp dir: a static is never dropped, so this dir stays.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        Built {
            cufile: hicache_testkit::standins::cufile(dir.path()).unwrap(),
            cudart: hicache_testkit::standins::cudart(dir.path()).unwrap(),
            _dir: dir,
        }
    })
}

/// The cuFile stand-in.
pub fn cufile() -> &'static Path {
    &built().cufile
}

/// The CUDA runtime stand-in.
pub fn cudart() -> &'static Path {
    &built().cudart
}

/// The stand-ins' injected failures and device count are process-wide: tests that touch
/// them take turns.
pub fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A function only a stand-in exports.
pub fn stand_in_fn<T: Copy>(library: &Path, symbol: &str) -> T {
    // SAFETY: the stand-in's own library; the caller names the symbol's C type. The
    // library stays loaded for the test's life (the handle is leaked), so the pointer does
    // not dangle.
    unsafe {
        let lib = libloading::Library::new(library).unwrap();
        let f: T = *lib.get::<T>(symbol.as_bytes()).unwrap();
        std::mem::forget(lib);
        f
    }
}

/// Makes the cuFile stand-in's `call` fail with `code` until cleared with 0.
pub fn fail(call: &str, code: c_int) {
    let f: unsafe extern "C" fn(*const c_char, c_int) =
        stand_in_fn(cufile(), "hicache_cufile_stand_in_fail");
    let call = CString::new(call).unwrap();
    // SAFETY: a NUL-terminated name and a code.
    unsafe { f(call.as_ptr(), code) };
}

/// A new empty file `name` in `dir`, open for reading and writing.
pub fn scratch_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join(name))
        .unwrap()
}
