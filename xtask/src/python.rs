//! `cargo xtask python`: the Python package `hicache` (hicache-py) built as a wheel with
//! maturin, installed into a venv with numpy, and its tests run against SGLang's own
//! storage classes from the SGLang 0.5.23 wheel.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{root, step};

/// The SGLang release whose storage interface the package implements.
const SGLANG: &str = "0.5.23";
/// The files of SGLang's wheel the tests use: its storage base classes and what they import
/// besides torch (standard library only), its NIXL backend's file naming and routing, and the
/// NIXL backend itself (read as source for its naming code, never imported).
const SGLANG_FILES: &[&str] = &[
    "sglang/srt/mem_cache/hicache_storage.py",
    "sglang/srt/environ.py",
    "sglang/srt/mem_cache/storage/nixl/nixl_utils.py",
    "sglang/srt/mem_cache/storage/nixl/nixl_routing.py",
    "sglang/srt/mem_cache/storage/nixl/hicache_nixl.py",
];
const MATURIN: &str = "maturin==1.16.0";

pub(crate) fn python(args: &[String]) -> Result<(), String> {
    if let Some(other) = args.first() {
        return Err(format!("unknown python option `{other}`"));
    }
    let target = root().join("target");
    let venv = target.join("py-venv");
    let py = venv.join("bin").join("python");
    if !venv.join(".installed").exists() {
        let mut mk = Command::new("python3");
        mk.args(["-m", "venv"]).arg(&venv);
        step("python3 -m venv target/py-venv", mk)?;
        let mut pip = Command::new(&py);
        pip.args(["-m", "pip", "install", "-q", MATURIN, "numpy"]);
        step(&format!("pip install {MATURIN} numpy"), pip)?;
        std::fs::write(venv.join(".installed"), b"").map_err(|e| e.to_string())?;
    }
    let sglang = sglang_sources(&py, &target)?;

    let wheels = target.join("wheels");
    // Old wheels would make the install below ambiguous.
    let _ = std::fs::remove_dir_all(&wheels);
    let mut build = Command::new(venv.join("bin").join("maturin"));
    build
        .current_dir(root())
        .args([
            "build",
            "--profile",
            "dev",
            "-m",
            "hicache-py/Cargo.toml",
            "-i",
        ])
        .arg(&py)
        .arg("--out")
        .arg(&wheels);
    step("maturin build hicache-py (abi3 wheel)", build)?;
    let wheel = only_wheel(&wheels)?;
    let mut install = Command::new(&py);
    install
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(&wheel);
    step("pip install the hicache wheel", install)?;

    let mut test = Command::new(&py);
    test.current_dir(root().join("hicache-py"))
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .env("HICACHE_SGLANG_SOURCE", &sglang);
    step(
        &format!("python tests of hicache-py (SGLang {SGLANG}'s HiCacheStorage)"),
        test,
    )
}

/// SGLang's storage modules, unpacked from its wheel into `target/sglang-<version>` (the
/// wheel is downloaded once, without dependencies).
fn sglang_sources(py: &Path, target: &Path) -> Result<PathBuf, String> {
    let dir = target.join(format!("sglang-{SGLANG}"));
    // The marker lists what was unpacked, so a longer list unpacks again.
    let unpacked = SGLANG_FILES.join("\n");
    if std::fs::read_to_string(dir.join(".unpacked")).is_ok_and(|s| s == unpacked) {
        return Ok(dir);
    }
    let download = target.join("sglang-wheel");
    let mut get = Command::new(py);
    get.args(["-m", "pip", "download", "-q", "--no-deps"])
        .arg(format!("sglang=={SGLANG}"))
        .arg("-d")
        .arg(&download);
    step(&format!("pip download --no-deps sglang=={SGLANG}"), get)?;
    let wheel = only_wheel(&download)?;
    // The package dirs get empty `__init__.py`s: the wheel's own would import the server.
    let script = "import sys, zipfile, pathlib\n\
        wheel, out, names = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]\n\
        z = zipfile.ZipFile(wheel)\n\
        for name in names:\n\
        \x20   path = out / name\n\
        \x20   path.parent.mkdir(parents=True, exist_ok=True)\n\
        \x20   path.write_bytes(z.read(name))\n\
        \x20   for parent in path.relative_to(out).parents:\n\
        \x20       if str(parent) != '.':\n\
        \x20           (out / parent / '__init__.py').touch()\n";
    let mut unpack = Command::new(py);
    unpack
        .args(["-c", script])
        .arg(&wheel)
        .arg(&dir)
        .args(SGLANG_FILES);
    step("unpack SGLang's storage modules", unpack)?;
    std::fs::write(dir.join(".unpacked"), unpacked).map_err(|e| e.to_string())?;
    Ok(dir)
}

fn only_wheel(dir: &Path) -> Result<PathBuf, String> {
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "expected one wheel in {}, found {}",
            dir.display(),
            wheels.len()
        )),
    }
}
