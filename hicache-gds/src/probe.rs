//! What the GDS plugins' probe will report: the library found and where, the driver opened,
//! compat or P2P mode, and per storage dir a real file registration with an aligned write
//! and read-back of one block through cuFile. Nothing is assumed from configuration alone.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cufile::CuFile;
use crate::error::GdsError;

/// Bytes written and read back per dir: one O_DIRECT block.
const PROBE_BYTES: usize = 4096;

/// How cuFile moves data on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The nvidia-fs kernel module is loaded: DMA between GPU memory and storage.
    P2p,
    /// No nvidia-fs: cuFile's own POSIX path through host bounce buffers (it works, with
    /// `allow_compat_mode` in cufile.json, but moves data through the CPU).
    Compat,
}

/// Whether the nvidia-fs module is loaded (it is what makes P2P DMA possible).
pub fn mode() -> Mode {
    if Path::new("/sys/module/nvidia_fs").exists() {
        Mode::P2p
    } else {
        Mode::Compat
    }
}

/// What the probe found.
#[derive(Debug)]
pub struct Found {
    /// The library loaded.
    pub loaded_from: PathBuf,
    /// Whether it is hicache's test stand-in.
    pub stand_in: bool,
    /// Compat or P2P.
    pub mode: Mode,
    /// Each dir checked: a file registered, one block written and read back.
    pub dirs: Vec<PathBuf>,
    /// The library, loaded (its driver closed again), for the plugin to use.
    pub cufile: Arc<CuFile>,
}

/// Loads cuFile (from `library`, or the search path), opens the driver, and in each of
/// `dirs` registers an O_DIRECT file and writes and reads back one block from host memory;
/// the first failure is the error, naming the dir.
pub fn probe(dirs: &[PathBuf], library: Option<&Path>) -> Result<Found, ProbeError> {
    let cufile = Arc::new(CuFile::load(library).map_err(|e| ProbeError::at(None, e))?);
    cufile.open_driver().map_err(|e| ProbeError::at(None, e))?;
    let checked = dirs
        .iter()
        .map(|dir| check_dir(&cufile, dir).map(|()| dir.clone()))
        .collect::<Result<Vec<_>, _>>();
    let closed = cufile.close_driver();
    let dirs = checked?;
    closed.map_err(|e| ProbeError::at(None, e))?;
    Ok(Found {
        loaded_from: cufile.path().to_path_buf(),
        stand_in: cufile.is_stand_in(),
        mode: mode(),
        dirs,
        cufile,
    })
}

fn check_dir(cufile: &CuFile, dir: &Path) -> Result<(), ProbeError> {
    let path = dir.join(format!(".hicache-gds-probe-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(|source| {
            ProbeError::at(
                Some(dir),
                GdsError::Os {
                    call: "open with O_DIRECT",
                    source,
                },
            )
        })?;
    let result =
        (|| {
            let handle = cufile.register_file(file.as_fd())?;
            let mut out =
                hicache_core::raw::AlignedBuf::zeroed(PROBE_BYTES, PROBE_BYTES).map_err(|e| {
                    GdsError::Os {
                        call: "allocate the probe buffer",
                        source: std::io::Error::other(e.to_string()),
                    }
                })?;
            for (i, b) in out.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 251) as u8 ^ 0x5a;
            }
            let mut back = hicache_core::raw::AlignedBuf::zeroed(PROBE_BYTES, PROBE_BYTES)
                .map_err(|e| GdsError::Os {
                    call: "allocate the probe buffer",
                    source: std::io::Error::other(e.to_string()),
                })?;
            // SAFETY: both buffers live and are used by nothing else during the calls.
            let moved = unsafe {
                let w = cufile.write(&handle, out.as_ptr().cast(), PROBE_BYTES, 0, 0)?;
                let r = cufile.read(&handle, back.as_mut_ptr().cast(), PROBE_BYTES, 0, 0)?;
                (w, r)
            };
            if moved != (PROBE_BYTES, PROBE_BYTES) || out.as_slice() != back.as_slice() {
                return Err(GdsError::Os {
                    call: "cuFileRead",
                    source: std::io::Error::other(format!(
                        "wrote {} and read {} of {PROBE_BYTES} bytes, or read back other bytes",
                        moved.0, moved.1
                    )),
                });
            }
            Ok(())
        })();
    drop(file);
    let _ = std::fs::remove_file(&path);
    result.map_err(|e| ProbeError::at(Some(dir), e))
}

/// Why GDS cannot work here, and where.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", dir.as_ref().map(|d| format!("{}: ", d.display())).unwrap_or_default())]
pub struct ProbeError {
    /// The storage dir, when the failure is about one.
    pub dir: Option<PathBuf>,
    /// What failed (its text carries the hint).
    #[source]
    pub source: GdsError,
}

impl ProbeError {
    fn at(dir: Option<&Path>, source: GdsError) -> Self {
        ProbeError {
            dir: dir.map(Path::to_path_buf),
            source,
        }
    }
}
