//! NIXL's POSIX plugin at its best: `../shared/baselines/nixl_posix_bench.py` in a venv with
//! `nixl-cu12`, both its `uring` and `aio` modes, the same pages in flight as hicache, with
//! its buffers as the script allocates them and in huge pages (see [`Memory`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::failure;
use crate::root;

/// The modes the script runs in one process.
const MODES: [&str; 2] = ["uring", "aio"];

/// The memory the script's buffers are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Memory {
    /// As the script allocates them: `mmap.mmap(-1, n)`, a shared anonymous mapping, whose
    /// pages are tmpfs pages (4 KiB where `shmem_enabled` is `never`).
    Script,
    /// Private anonymous mappings advised for transparent huge pages, the memory `hicache
    /// bench` gives its pool and the raw loops for direct I/O to a device: the script
    /// runs unchanged behind [`HUGE_PAGES`], which makes its `mmap.mmap(-1, n)` calls so. On
    /// a virtio disk direct I/O from huge pages was much faster, for NIXL too; on tmpfs,
    /// where the kernel copies, NIXL's best figures came from its script's buffers.
    HugePages,
}

/// Every variant the baseline runs: each mode in each memory. The case reports the best one
/// per figure.
pub(super) const VARIANTS: [(&str, Memory); 4] = [
    ("uring", Memory::Script),
    ("aio", Memory::Script),
    ("uring+hugepages", Memory::HugePages),
    ("aio+hugepages", Memory::HugePages),
];

/// Makes the script's anonymous `mmap.mmap` buffers private and advises them for huge
/// pages before their first touch.
const HUGE_PAGES: &str = r#"
import mmap
_mmap = mmap.mmap
class _HugePages(_mmap):
    def __new__(cls, fileno, length, *args, **kwargs):
        anonymous = fileno == -1 and not args and "flags" not in kwargs
        if anonymous:
            kwargs["flags"] = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        m = _mmap.__new__(cls, fileno, length, *args, **kwargs)
        if anonymous:
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except (AttributeError, OSError):
                pass  # no transparent huge pages here: base pages, as hicache's pool then gets
        return m
mmap.mmap = _HugePages
"#;

/// Sends each page to another of the script's files, by one fixed permutation of the files
/// it registers: page `i`'s writes and reads both go to file `perm[i]`. A `FILE` list it
/// cannot permute (not a list of tuples, or naming a file never registered) fails the run,
/// so that an unscattered run is never reported as a scattered one. With `--prealloc`,
/// which allocates the files' blocks in their own order before the clock starts, a request's
/// pages then lie scattered on the disk, as a store's pages do when each write lands in
/// whichever file is free (see [`Placement::Scattered`]).
const SCATTER: &str = r#"
import random
try:
    from nixl_cu12 import nixl_agent as _agent
except ImportError:
    from nixl import nixl_agent as _agent
_register, _descs = _agent.register_memory, _agent.get_xfer_descs
def _register_scattered(self, reg_list, mem_type=None, *args, **kwargs):
    if mem_type == "FILE":
        if not isinstance(reg_list, list):
            raise RuntimeError("pages scattered: the script registered its files other than as a list of tuples, so they cannot be permuted")
        fds = [d[2] for d in reg_list]
        to = list(fds)
        random.Random(0).shuffle(to)
        self._hicache_scatter = dict(zip(fds, to))
    return _register(self, reg_list, mem_type, *args, **kwargs)
def _descs_scattered(self, descs, mem_type=None, *args, **kwargs):
    if mem_type == "FILE":
        to = getattr(self, "_hicache_scatter", None)
        if to is None or not isinstance(descs, list) or any(d[2] not in to for d in descs):
            raise RuntimeError("pages scattered: a FILE transfer list is not a list of tuples naming files the script registered, so its pages cannot be scattered")
        descs = [(d[0], d[1], to[d[2]]) + tuple(d[3:]) for d in descs]
    return _descs(self, descs, mem_type, *args, **kwargs)
_agent.register_memory, _agent.get_xfer_descs = _register_scattered, _descs_scattered
"#;

/// Runs the script (`argv[1]`, its arguments after it) once the parts before it are set.
const RUN_SCRIPT: &str = r#"
import runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"#;

/// Where the script's pages go on its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// As the script does: page `i` in file `i`, the files allocated by the first round's
    /// writes in page order, so a request's pages lie side by side and the block layer
    /// merges them.
    InOrder,
    /// Each page in another file ([`SCATTER`]), the files allocated in their own order
    /// first (`--prealloc`): what NIXL's requests do when a request's pages are not
    /// neighbours on the disk.
    Scattered,
}

/// The program `python -c` runs before the script, or `None` to run the script as it is.
fn prelude(memory: Memory, placement: Placement) -> Option<String> {
    let mut parts = Vec::new();
    if placement == Placement::Scattered {
        parts.push(SCATTER);
    }
    if memory == Memory::HugePages {
        parts.push(HUGE_PAGES);
    }
    if parts.is_empty() {
        return None;
    }
    parts.push(RUN_SCRIPT);
    Some(parts.concat())
}

/// Creates the NIXL venv if needed; returns its python or why it cannot.
pub(super) fn python() -> Result<PathBuf, String> {
    let venv = root().join("target").join("nixl-venv");
    let python = venv.join("bin").join("python");
    let ready = venv.join(".installed");
    if ready.exists() {
        return Ok(python);
    }
    println!("bench: creating the NIXL venv (pip install --no-deps nixl-cu12==1.5.1 numpy)");
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .map_err(|e| format!("python3 -m venv: {e}"))?
        .success();
    if !ok {
        return Err("python3 -m venv failed (is python3-venv installed?)".into());
    }
    let out = Command::new(venv.join("bin").join("pip"))
        .args(["install", "-q", "--no-deps", "nixl-cu12==1.5.1", "numpy"])
        .output()
        .map_err(|e| format!("pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip install failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    std::fs::write(&ready, b"").map_err(|e| e.to_string())?;
    Ok(python)
}

/// One run's figures for one mode.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct ModeRun {
    pub(super) write: Vec<f64>,
    pub(super) read: Vec<f64>,
    pub(super) query_keys_per_s: Option<f64>,
}

/// What to ask the baseline for.
pub(super) struct Request<'a> {
    pub(super) dir: &'a Path,
    pub(super) page_bytes: u64,
    pub(super) pages: u64,
    pub(super) batch: u64,
    pub(super) inflight: u64,
    pub(super) rounds: usize,
    /// Also time `query_memory` (SGLang's `batch_exists` through NIXL), `batch` keys a call.
    pub(super) query: bool,
    /// The memories to run in, each a run of the script in every mode.
    pub(super) memories: &'a [Memory],
    /// Where the pages go on the files.
    pub(super) placement: Placement,
}

/// Runs the baseline once in every mode of each memory the request names; per-round GB/s
/// per variant, in [`VARIANTS`] order (empty for a memory not asked for).
pub(super) fn run(python: &Path, r: &Request) -> Result<Vec<ModeRun>, String> {
    let mut runs = Vec::new();
    for (i, (_, memory)) in VARIANTS.iter().enumerate().step_by(MODES.len()) {
        if r.memories.contains(memory) {
            runs.extend(run_in(python, r, *memory)?);
        } else {
            runs.extend((0..MODES.len()).map(|_| ModeRun::default()));
        }
        debug_assert_eq!(runs.len(), i + MODES.len());
    }
    Ok(runs)
}

/// One run of the script, its buffers in `memory`: a [`ModeRun`] per mode of [`MODES`].
fn run_in(python: &Path, r: &Request, memory: Memory) -> Result<Vec<ModeRun>, String> {
    let script = root()
        .join("..")
        .join("shared")
        .join("baselines")
        .join("nixl_posix_bench.py");
    let mut cmd = Command::new(python);
    if let Some(prelude) = prelude(memory, r.placement) {
        cmd.arg("-c").arg(prelude);
    }
    cmd.arg(&script)
        .args(["--pages", &r.pages.to_string()])
        .args(["--page-size", &r.page_bytes.to_string()])
        .args(["--batch", &r.batch.to_string()])
        .args(["--inflight", &r.inflight.to_string()])
        .args(["--iters", &r.rounds.to_string()])
        .args(["--modes", &MODES.join(",")])
        .arg("--dir")
        .arg(r.dir.join("nixl"))
        .env("NIXL_LOG_LEVEL", "WARN");
    if r.query {
        cmd.arg("--query");
    }
    if r.placement == Placement::Scattered {
        cmd.arg("--prealloc");
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{memory:?} memory: {}", failure(&out)));
    }
    parse(&String::from_utf8_lossy(&out.stdout), r.rounds)
}

/// Reads the script's output: a line per mode (`MODE w1 … wN r1 … rN OK`), then its median
/// line and, with `--query`, a `query_memory K keys/s` line.
fn parse(text: &str, rounds: usize) -> Result<Vec<ModeRun>, String> {
    let mut runs = Vec::new();
    let mut current: Option<ModeRun> = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if MODES.contains(&first) {
            if !line.contains("OK") {
                return Err(format!("NIXL verification failed: {line}"));
            }
            let nums: Vec<f64> = words.filter_map(|w| w.parse().ok()).collect();
            if nums.len() < 2 * rounds {
                return Err(format!("cannot parse NIXL line: {line}"));
            }
            runs.extend(current.take());
            current = Some(ModeRun {
                write: nums[..rounds].to_vec(),
                read: nums[rounds..2 * rounds].to_vec(),
                query_keys_per_s: None,
            });
        } else if first == "query_memory" {
            let value = words
                .next()
                .and_then(|w| w.replace(',', "").parse().ok())
                .ok_or_else(|| format!("cannot parse NIXL line: {line}"))?;
            match current.as_mut() {
                Some(run) => run.query_keys_per_s = Some(value),
                None => return Err(format!("a query line before any mode: {line}")),
            }
        }
    }
    runs.extend(current);
    if runs.len() != MODES.len() {
        return Err(format!(
            "expected {} mode lines in NIXL output, found {}: {text}",
            MODES.len(),
            runs.len()
        ));
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "\
# pages=4 page_size=65536 batch=2 inflight=2 iters=2 direct=True dir=/x total=0.000 GB
mode       write GB/s (per iter)            read GB/s (per iter)             verify
uring        1.00   2.00                      3.00   4.00                   OK
           write median 1.50 GB/s, read median 3.50 GB/s
           query_memory 123,456 keys/s (batches of 2)
aio          0.50   0.60                      0.70   0.80                   OK
           write median 0.55 GB/s, read median 0.75 GB/s
           query_memory 99 keys/s (batches of 2)
";

    #[test]
    fn reads_every_mode_and_its_query_rate() {
        let runs = parse(OUTPUT, 2).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].write, [1.0, 2.0]);
        assert_eq!(runs[0].read, [3.0, 4.0]);
        assert_eq!(runs[0].query_keys_per_s, Some(123456.0));
        assert_eq!(runs[1].write, [0.5, 0.6]);
        assert_eq!(runs[1].query_keys_per_s, Some(99.0));
    }

    #[test]
    fn a_mismatch_a_missing_mode_or_a_short_line_is_an_error() {
        let bad = OUTPUT.replacen("OK", "MISMATCH", 1);
        assert!(parse(&bad, 2).unwrap_err().contains("verification"));
        let one: String = OUTPUT.lines().take(5).collect::<Vec<_>>().join("\n");
        assert!(
            parse(&one, 2)
                .unwrap_err()
                .contains("expected 2 mode lines")
        );
        assert!(parse(OUTPUT, 3).unwrap_err().contains("cannot parse"));
        assert!(parse("", 2).is_err());
    }

    /// The prelude runs the script with its arguments, and the script's anonymous buffer is
    /// then private and advised for huge pages; without it, the buffer is shared.
    #[test]
    fn the_huge_pages_prelude_changes_only_the_scripts_buffers() {
        let dir =
            std::env::temp_dir().join(format!("hicache-xtask-prelude-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let probe = dir.join("probe.py");
        std::fs::write(
            &probe,
            r#"
import ctypes, mmap, sys
m = mmap.mmap(-1, 4 << 20)
m[0] = 1
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
inside = False
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and len(head) > 1 and len(head[1]) == 4:
        lo, hi = (int(x, 16) for x in head[0].split("-"))
        inside = lo <= addr < hi
        if inside:
            perms = head[1]
    elif inside and line.startswith("VmFlags:"):
        print(perms, "hg" in line.split()[1:], " ".join(sys.argv[1:]))
        break
"#,
        )
        .unwrap();
        let run = |prelude: bool| {
            let mut cmd = Command::new("python3");
            if prelude {
                cmd.arg("-c")
                    .arg(super::prelude(Memory::HugePages, Placement::InOrder).unwrap());
            }
            let out = cmd.arg(&probe).args(["--pages", "4"]).output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let plain = run(false);
        let huge = run(true);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(plain.starts_with("rw-s False --pages 4"), "{plain}");
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
        let want = format!("rw-p {} --pages 4", if thp { "True" } else { "False" });
        assert_eq!(huge, want);
    }

    /// Behind the scatter prelude, a NIXL agent (here a stand-in module with NIXL's
    /// signatures, recording what it is given) sees each file descriptor of a `FILE` transfer
    /// list replaced by another registered one, the same every time, all of them used once;
    /// `DRAM` lists and the script's arguments pass unchanged. A `FILE` list it cannot
    /// permute (an unregistered file, not a list, no registration) raises instead.
    #[test]
    fn the_scatter_prelude_sends_each_page_to_another_registered_file() {
        let dir =
            std::env::temp_dir().join(format!("hicache-xtask-scatter-{}", std::process::id()));
        let module = dir.join("nixl_cu12");
        std::fs::create_dir_all(&module).unwrap();
        std::fs::write(
            module.join("__init__.py"),
            r#"
class nixl_agent:
    def register_memory(self, reg_list, mem_type=None, backends=[]):
        return (mem_type, [tuple(d) for d in reg_list])
    def get_xfer_descs(self, descs, mem_type=None):
        return (mem_type, [tuple(d) for d in descs])
"#,
        )
        .unwrap();
        let probe = dir.join("probe.py");
        std::fs::write(
            &probe,
            r#"
import sys
from nixl_cu12 import nixl_agent
a = nixl_agent()
fds = list(range(100, 132))
a.register_memory([(0, 4096, fd, f"page{i}") for i, fd in enumerate(fds)], "FILE", backends=["POSIX"])
first = [d[2] for d in a.get_xfer_descs([(0, 4096, fd) for fd in fds], "FILE")[1]]
again = [d[2] for d in a.get_xfer_descs([(0, 4096, fd) for fd in fds[:4]], "FILE")[1]]
dram = a.get_xfer_descs([(7, 4096, 0)], "DRAM")[1]
def refused(agent, descs):
    try:
        agent.get_xfer_descs(descs, "FILE")
    except RuntimeError as e:
        return "cannot be scattered" in str(e)
    return False
unregistered = refused(a, [(0, 4096, 999)])
not_a_list = refused(a, tuple((0, 4096, fd) for fd in fds))
never_registered = refused(nixl_agent(), [(0, 4096, 100)])
print(sorted(first) == fds, first != fds, again == first[:4], dram == [(7, 4096, 0)],
      unregistered, not_a_list, never_registered, " ".join(sys.argv[1:]))
"#,
        )
        .unwrap();
        let out = Command::new("python3")
            .arg("-c")
            .arg(prelude(Memory::Script, Placement::Scattered).unwrap())
            .arg(&probe)
            .arg("--pages")
            .env("PYTHONPATH", &dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "True True True True True True True --pages"
        );
    }

    #[test]
    fn the_script_runs_bare_only_in_its_own_memory_and_order() {
        assert_eq!(prelude(Memory::Script, Placement::InOrder), None);
        let huge = prelude(Memory::HugePages, Placement::InOrder).unwrap();
        assert!(huge.contains("MADV_HUGEPAGE") && !huge.contains("_hicache_scatter"));
        let both = prelude(Memory::HugePages, Placement::Scattered).unwrap();
        assert!(both.contains("MADV_HUGEPAGE") && both.contains("_hicache_scatter"));
        assert!(both.trim_end().ends_with(r#"run_name="__main__")"#));
    }
}
