//! Stand-ins for vendor libraries that cannot exist on a machine without their hardware,
//! built from C with the system's compiler: they export the vendor's C functions with its
//! types and return conventions over POSIX I/O, so tests go through the real FFI path.
//! What each proves, and what it cannot, is stated at the top of its source.

use std::path::{Path, PathBuf};

/// The source of the cuFile stand-in (`libcufile.so.0`'s functions over pread/pwrite).
pub const CUFILE_C: &str = include_str!("../standins/cufile.c");

/// Builds the cuFile stand-in as `dir/libcufile.so.0`.
pub fn cufile(dir: &Path) -> Result<PathBuf, String> {
    let out = dir.join("libcufile.so.0");
    crate::cc::shared_library(&[("cufile.c", CUFILE_C)], &[], &out)?;
    Ok(out)
}

/// The source of the CUDA runtime stand-in (`cudaMalloc` over host memory).
pub const CUDART_C: &str = include_str!("../standins/cudart.c");

/// Builds the CUDA runtime stand-in as `dir/libcudart.so`.
pub fn cudart(dir: &Path) -> Result<PathBuf, String> {
    let out = dir.join("libcudart.so");
    crate::cc::shared_library(&[("cudart.c", CUDART_C)], &[], &out)?;
    Ok(out)
}

/// The source of the USRBIO stand-in (`libhf3fs_api_shared.so`'s functions over
/// pread/pwrite, a "mount" being a dir made by [`make_usrbio_mount`]).
pub const USRBIO_C: &str = include_str!("../standins/usrbio.c");

/// The file that marks a dir as a 3FS mount for the USRBIO stand-in.
pub const USRBIO_MOUNT_MARKER: &str = ".hf3fs-stand-in-mount";

/// Makes `dir` a 3FS "mount" for the USRBIO stand-in: the marker file, and the virtual dir
/// `3fs-virt/iovs` where a real mount publishes shared memory (the stand-in refuses iovs and
/// rings on a mount without it, as 3FS does).
pub fn make_usrbio_mount(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("3fs-virt/iovs"))?;
    std::fs::write(dir.join(USRBIO_MOUNT_MARKER), b"")
}

/// Builds the USRBIO stand-in as `dir/libhf3fs_api_shared.so`.
pub fn usrbio(dir: &Path) -> Result<PathBuf, String> {
    let out = dir.join("libhf3fs_api_shared.so");
    crate::cc::shared_library(&[("usrbio.c", USRBIO_C)], &[], &out)?;
    Ok(out)
}
