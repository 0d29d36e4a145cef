//! USRBIO as the file layer's data path: how 3FS moves an object's bytes.
//!
//! Every byte USRBIO moves must lie in an iov, shared memory the FUSE process maps. This
//! path keeps *lanes* — an iov of `iov_bytes` with a read ring and a write ring — one per
//! worker at most, taken for a transfer and given back after (`prep_io` is not
//! thread-safe: a lane is used by one thread at a time). A write copies the object's
//! segments into the lane's iov and runs them through the write ring; a read runs the read
//! ring into the iov and copies out to the segments: a bounce. (Zero-copy for host pools
//! allocated in shared memory, wrapped with `hf3fs_iovwrap`, and reporting the bytes
//! bounced, are still to come.) The file is registered with `hf3fs_reg_fd` for
//! each transfer and deregistered before the layer can close it, so a reused descriptor
//! number never meets a stale registration.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hicache_core::{MemKind, MemoryRegion, Result};
use hicache_posix::data_path::{DataPath, Direction, Transfer};

use crate::error::UsrbioError;
use crate::usrbio::{Io, Iov, Ring, Usrbio};

/// Bytes per I/O handed to a ring: a window is split into I/Os of at most this many, so the
/// FUSE process can work on them in parallel.
const IO_BYTES: usize = 1 << 20;

/// An iov and a ring of each direction, used by one thread at a time.
struct Lane {
    iov: Iov,
    reads: Ring,
    writes: Ring,
}

/// USRBIO as a data path (see the module docs).
pub(crate) struct UsrbioPath {
    usrbio: Arc<Usrbio>,
    mount: PathBuf,
    iov_bytes: usize,
    entries: u32,
    idle: Mutex<Vec<Lane>>,
}

impl std::fmt::Debug for UsrbioPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsrbioPath")
            .field("usrbio", &self.usrbio)
            .field("mount", &self.mount)
            .field("iov_bytes", &self.iov_bytes)
            .finish_non_exhaustive()
    }
}

fn io_error(e: UsrbioError) -> io::Error {
    match e.errno() {
        Some(n) => io::Error::new(io::Error::from_raw_os_error(n).kind(), e.to_string()),
        None => io::Error::other(e.to_string()),
    }
}

impl UsrbioPath {
    pub(crate) fn new(usrbio: Arc<Usrbio>, mount: PathBuf, iov_bytes: usize, entries: u32) -> Self {
        UsrbioPath {
            usrbio,
            mount,
            iov_bytes,
            entries,
            idle: Mutex::new(Vec::new()),
        }
    }

    fn take_lane(&self) -> io::Result<Lane> {
        if let Some(lane) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(lane);
        }
        let lane = (|| {
            Ok::<_, UsrbioError>(Lane {
                iov: self.usrbio.create_iov(&self.mount, self.iov_bytes)?,
                reads: self.usrbio.create_ring(&self.mount, self.entries, true)?,
                writes: self.usrbio.create_ring(&self.mount, self.entries, false)?,
            })
        })();
        lane.map_err(io_error)
    }

    fn give_back(&self, lane: Lane) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lane);
    }

    /// Moves one transfer through `lane`, a window of at most `iov_bytes` at a time.
    fn move_through(&self, lane: &mut Lane, t: &Transfer<'_>) -> Result<u64, UsrbioError> {
        let fd = self.usrbio.register_fd(t.file())?;
        let segments: Vec<(u64, usize)> = t.segments().collect();
        let total = t.len();
        let mut done = 0u64;
        while done < total {
            let n = usize::try_from(total - done)
                .unwrap_or(usize::MAX)
                .min(self.iov_bytes);
            if t.direction() == Direction::Write {
                // SAFETY: the file layer's promise (`Transfer`): the segments lie in
                // registered host memory reserved for this transfer.
                unsafe { gather(&segments, done, &mut lane.iov.bytes_mut()[..n]) };
            }
            let ios: Vec<Io<'_>> = (0..n)
                .step_by(IO_BYTES)
                .map(|at| Io {
                    file: &fd,
                    iov_offset: at,
                    len: IO_BYTES.min(n - at),
                    file_offset: t.offset() + done + at as u64,
                })
                .collect();
            let ring = match t.direction() {
                Direction::Read => &mut lane.reads,
                Direction::Write => &mut lane.writes,
            };
            let results = ring.run(&mut lane.iov, &ios)?;
            // Bytes in order up to the first short or failed I/O.
            let mut moved = 0u64;
            let mut failure = None;
            for (io, r) in ios.iter().zip(results) {
                match r {
                    Ok(m) => {
                        moved += m;
                        if m < io.len as u64 {
                            break;
                        }
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            if t.direction() == Direction::Read && moved > 0 {
                let got = usize::try_from(moved).unwrap_or(n).min(n);
                // SAFETY: as above, for the segments a read fills.
                unsafe { scatter(&segments, done, &lane.iov.bytes()[..got]) };
            }
            done += moved;
            match failure {
                Some(e) if done == 0 => return Err(e),
                Some(_) => break,
                None if moved < n as u64 => break,
                None => {}
            }
        }
        Ok(done)
    }
}

/// Copies the transfer's bytes from `skip` on into `out`.
///
/// # Safety
/// Each segment `(addr, len)` must be readable host memory not written during the call.
unsafe fn gather(segments: &[(u64, usize)], skip: u64, out: &mut [u8]) {
    let mut at = 0u64;
    let mut filled = 0usize;
    for &(addr, len) in segments {
        let end = at + len as u64;
        if end > skip && filled < out.len() {
            let from = skip.saturating_sub(at) as usize;
            let take = (len - from).min(out.len() - filled);
            // SAFETY: `from + take <= len` inside the segment (the caller's contract).
            let src =
                unsafe { std::slice::from_raw_parts((addr as usize as *const u8).add(from), take) };
            out[filled..filled + take].copy_from_slice(src);
            filled += take;
        }
        at = end;
    }
}

/// Copies `from` into the transfer's bytes from `skip` on.
///
/// # Safety
/// Each segment `(addr, len)` must be writable host memory nothing else uses during the call.
unsafe fn scatter(segments: &[(u64, usize)], skip: u64, from: &[u8]) {
    let mut at = 0u64;
    let mut taken = 0usize;
    for &(addr, len) in segments {
        let end = at + len as u64;
        if end > skip && taken < from.len() {
            let into = skip.saturating_sub(at) as usize;
            let put = (len - into).min(from.len() - taken);
            // SAFETY: `into + put <= len` inside the segment (the caller's contract).
            let dst = unsafe {
                std::slice::from_raw_parts_mut((addr as usize as *mut u8).add(into), put)
            };
            dst.copy_from_slice(&from[taken..taken + put]);
            taken += put;
        }
        at = end;
    }
}

impl DataPath for UsrbioPath {
    fn accepts(&self, kind: MemKind) -> bool {
        kind == MemKind::Host
    }

    fn register(&self, _: &MemoryRegion) -> Result<()> {
        // Bounced: host memory needs no registration with USRBIO.
        Ok(())
    }

    fn deregister(&self, _: &MemoryRegion) -> Result<()> {
        Ok(())
    }

    fn call(&self, direction: Direction) -> &'static str {
        match direction {
            Direction::Read => "hf3fs read",
            Direction::Write => "hf3fs write",
        }
    }

    fn transfer(&self, transfer: &Transfer<'_>) -> io::Result<u64> {
        let mut lane = self.take_lane()?;
        let moved = self.move_through(&mut lane, transfer);
        if matches!(moved, Err(UsrbioError::Abandoned { .. })) {
            // Its I/O may still be in flight: never reused, never destroyed (`Ring::run`
            // already keeps the iov and ring from being destroyed on drop).
            drop(lane);
        } else {
            self.give_back(lane);
        }
        moved.map_err(io_error)
    }

    fn describe(&self) -> String {
        format!(
            "USRBIO rings through {} MiB bounce iovs on {} ({}{})",
            self.iov_bytes >> 20,
            self.mount.display(),
            self.usrbio.path().display(),
            if self.usrbio.is_stand_in() {
                ", the test stand-in"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{gather, scatter};

    #[test]
    fn gather_and_scatter_walk_segments_from_any_offset() {
        let a: Vec<u8> = (0..10).collect();
        let b: Vec<u8> = (10..16).collect();
        let segs = [(a.as_ptr() as u64, a.len()), (b.as_ptr() as u64, b.len())];
        let mut out = [0u8; 7];
        // SAFETY: both segments are live vectors read by nothing else.
        unsafe { gather(&segs, 6, &mut out) };
        assert_eq!(out, [6, 7, 8, 9, 10, 11, 12]);
        let mut c = vec![0u8; 4];
        let mut d = vec![0u8; 4];
        let segs = [(c.as_mut_ptr() as u64, 4), (d.as_mut_ptr() as u64, 4)];
        // SAFETY: both segments are live vectors used by nothing else during the call.
        unsafe { scatter(&segs, 3, &[1, 2, 3]) };
        assert_eq!((c, d), (vec![0, 0, 0, 1], vec![2, 3, 0, 0]));
    }
}
