//! What the 3FS plugin's probe will report: the library found and where, and per storage
//! dir its 3FS mount, an iov and a ring of each direction created there, and a real
//! write and read-back of one block through USRBIO. Nothing is assumed from configuration
//! alone — the trap peers fall into (library present, no 3FS mount) is a failure naming the
//! dir.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::UsrbioError;
use crate::usrbio::{Io, Usrbio};

/// Bytes written and read back per dir.
const PROBE_BYTES: usize = 4096;

/// What the probe found.
#[derive(Debug)]
pub struct Found {
    /// The library loaded.
    pub loaded_from: PathBuf,
    /// Whether it is hicache's test stand-in.
    pub stand_in: bool,
    /// Each dir checked, with the 3FS mount it lies under.
    pub dirs: Vec<(PathBuf, PathBuf)>,
    /// The library, loaded, for the plugin to use.
    pub usrbio: Arc<Usrbio>,
}

/// Why 3FS cannot work here, and where.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", dir.as_ref().map(|d| format!("{}: ", d.display())).unwrap_or_default())]
pub struct ProbeError {
    /// The storage dir, when the failure is about one.
    pub dir: Option<PathBuf>,
    /// What failed.
    #[source]
    pub source: UsrbioError,
}

impl ProbeError {
    fn at(dir: Option<&Path>, source: UsrbioError) -> Self {
        ProbeError {
            dir: dir.map(Path::to_path_buf),
            source,
        }
    }
}

/// Loads USRBIO (from `library`, or the search path) and checks each of `dirs`: its mount,
/// an iov and two rings there, and one block written and read back through them in a new
/// file that is removed after. The first failure is the error, naming the dir.
pub fn probe(dirs: &[PathBuf], library: Option<&Path>) -> Result<Found, ProbeError> {
    let usrbio = Arc::new(Usrbio::load(library).map_err(|e| ProbeError::at(None, e))?);
    let mut checked = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let mount = check_dir(&usrbio, dir).map_err(|e| ProbeError::at(Some(dir), e))?;
        checked.push((dir.clone(), mount));
    }
    Ok(Found {
        loaded_from: usrbio.path().to_path_buf(),
        stand_in: usrbio.is_stand_in(),
        dirs: checked,
        usrbio,
    })
}

fn check_dir(usrbio: &Arc<Usrbio>, dir: &Path) -> Result<PathBuf, UsrbioError> {
    let mount = usrbio.mount_point(dir)?;
    let mut iov = usrbio.create_iov(&mount, PROBE_BYTES)?;
    let mut writes = usrbio.create_ring(&mount, 4, false)?;
    let mut reads = usrbio.create_ring(&mount, 4, true)?;
    let path = dir.join(format!(".hicache-3fs-probe-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| UsrbioError::Refused(format!("cannot create {}: {e}", path.display())))?;
    let result = (|| {
        let fd = usrbio.register_fd(file.as_fd())?;
        let pattern: Vec<u8> = (0..PROBE_BYTES).map(|i| (i % 251) as u8 ^ 0x3f).collect();
        iov.bytes_mut().copy_from_slice(&pattern);
        let io = [Io {
            file: &fd,
            iov_offset: 0,
            len: PROBE_BYTES,
            file_offset: 0,
        }];
        let wrote = writes.run(&mut iov, &io)?.pop();
        iov.bytes_mut().fill(0);
        let read = reads.run(&mut iov, &io)?.pop();
        match (wrote, read) {
            (Some(Ok(w)), Some(Ok(r))) if w == PROBE_BYTES as u64 && r == w => {}
            (Some(Err(e)), _) | (_, Some(Err(e))) => return Err(e),
            (w, r) => {
                return Err(UsrbioError::Refused(format!(
                    "the probe block did not round-trip (wrote {w:?}, read {r:?} of {PROBE_BYTES} bytes)"
                )));
            }
        }
        if iov.bytes() != pattern.as_slice() {
            return Err(UsrbioError::Refused(
                "the probe block read back other bytes".into(),
            ));
        }
        Ok(())
    })();
    drop(file);
    let _ = std::fs::remove_file(&path);
    result.map(|()| mount)
}
