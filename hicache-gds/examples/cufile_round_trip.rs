//! Loads cuFile, opens the driver, registers a file in a dir, and writes and reads back
//! 1 MiB of host memory through it, once with cuFileWrite/cuFileRead and once as a batch of
//! 4 requests each way: the cuFile layer against whatever library the machine has.
//! `cargo run -p hicache-gds --example cufile_round_trip -- DIR [--device] [LIBRARY]`; with
//! `--device` the buffers are GPU memory from `cudaMalloc` (the CUDA runtime found on the
//! search path), filled and checked with `cudaMemcpy`.
//!
//! Every failure prints as hicache reports it (name, code, hint) and exits non-zero.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use hicache_gds::cufile::{CuFile, Op, Request};

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // --device: the same round trips from and into GPU memory (cudaMalloc).
    let device = args.iter().any(|a| a == "--device");
    args.retain(|a| a != "--device");
    let mut args = args.into_iter();
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: cufile_round_trip DIR [--device] [LIBRARY]");
        return ExitCode::from(2);
    };
    let library = args.next().map(PathBuf::from);
    match run(&dir, library.as_deref(), device) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    dir: &std::path::Path,
    library: Option<&std::path::Path>,
    device: bool,
) -> Result<(), String> {
    let cufile = CuFile::load(library).map_err(|e| e.to_string())?;
    println!(
        "loaded {}{}",
        cufile.path().display(),
        if cufile.is_stand_in() {
            " (hicache's stand-in)"
        } else {
            ""
        }
    );
    cufile.open_driver().map_err(|e| e.to_string())?;
    println!("cuFileDriverOpen: ok");
    let path = dir.join("hicache-cufile-round-trip");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(|e| format!("open {} with O_DIRECT: {e}", path.display()))?;
    let result = (|| {
        let handle = cufile
            .register_file(file.as_fd())
            .map_err(|e| e.to_string())?;
        println!("cuFileHandleRegister {}: ok", path.display());
        if device {
            return device_round_trip(&cufile, &handle);
        }
        let len = 1usize << 20;
        let out = hicache_core::raw::AlignedBuf::zeroed(len, 4096).map_err(|e| e.to_string())?;
        let mut out = out;
        for (i, b) in out.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let mut back =
            hicache_core::raw::AlignedBuf::zeroed(len, 4096).map_err(|e| e.to_string())?;
        // SAFETY: both buffers live and are used by nothing else until deregistered.
        unsafe {
            cufile
                .register_buffer(out.as_ptr().cast(), len)
                .map_err(|e| e.to_string())?;
            cufile
                .register_buffer(back.as_ptr().cast(), len)
                .map_err(|e| e.to_string())?;
            let w = cufile.write(&handle, out.as_ptr().cast(), len, 0, 0);
            let r = cufile.read(&handle, back.as_mut_ptr().cast(), len, 0, 0);
            cufile
                .deregister_buffer(out.as_ptr().cast())
                .map_err(|e| e.to_string())?;
            cufile
                .deregister_buffer(back.as_ptr().cast())
                .map_err(|e| e.to_string())?;
            println!("cuFileWrite: {} bytes", w.map_err(|e| e.to_string())?);
            println!("cuFileRead: {} bytes", r.map_err(|e| e.to_string())?);
        }
        if out.as_slice() != back.as_slice() {
            return Err("read back other bytes".to_string());
        }
        println!("bytes verified");
        batch_round_trip(&cufile, &handle, &mut out, &mut back)
    })();
    let _ = std::fs::remove_file(&path);
    cufile.close_driver().map_err(|e| e.to_string())?;
    result
}

/// The same MiB as 4 requests of one batch each way, the file's quarters in reverse order.
fn batch_round_trip(
    cufile: &CuFile,
    handle: &hicache_gds::cufile::FileHandle<'_>,
    out: &mut hicache_core::raw::AlignedBuf,
    back: &mut hicache_core::raw::AlignedBuf,
) -> Result<(), String> {
    let quarter = out.len() / 4;
    back.as_mut_slice().fill(0);
    let batch = match cufile.batch(4) {
        Ok(b) => b,
        Err(e) => return Err(e.to_string()),
    };
    let requests = |op, base: *mut u8| -> Vec<Request<'_>> {
        (0..4u64)
            .map(|i| Request {
                file: handle,
                op,
                base: base.cast(),
                size: quarter,
                file_offset: (3 - i) * quarter as u64,
                buf_offset: i * quarter as u64,
            })
            .collect()
    };
    // SAFETY: both buffers live and are used by nothing else during the runs; they are
    // registered for the time of the batches.
    unsafe {
        cufile
            .register_buffer(out.as_ptr().cast(), out.len())
            .map_err(|e| e.to_string())?;
        cufile
            .register_buffer(back.as_ptr().cast(), back.len())
            .map_err(|e| e.to_string())?;
        let w = batch.run(&requests(Op::Write, out.as_mut_ptr()));
        let r = batch.run(&requests(Op::Read, back.as_mut_ptr()));
        cufile
            .deregister_buffer(out.as_ptr().cast())
            .map_err(|e| e.to_string())?;
        cufile
            .deregister_buffer(back.as_ptr().cast())
            .map_err(|e| e.to_string())?;
        for (what, results) in [("write", w), ("read", r)] {
            let results = results.map_err(|e| e.to_string())?;
            let done: Result<Vec<usize>, String> = results
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()))
                .collect();
            println!("batch {what}: {:?} bytes", done?);
        }
    }
    if out.as_slice() != back.as_slice() {
        // Which quarter of the page each quarter read back holds, if any.
        let whose: Vec<Option<usize>> = back
            .as_slice()
            .chunks(quarter)
            .map(|got| out.as_slice().chunks(quarter).position(|want| want == got))
            .collect();
        return Err(format!(
            "the batch read back other bytes (quarter i holds the page's quarter: {whose:?})"
        ));
    }
    println!("batch bytes verified");
    Ok(())
}

/// The round trips from and into GPU memory: one `cuFileWrite`/`cuFileRead` of 1 MiB, then
/// the same MiB as a batch of 4 requests each way, quarters reversed in the file.
fn device_round_trip(
    cufile: &CuFile,
    handle: &hicache_gds::cufile::FileHandle<'_>,
) -> Result<(), String> {
    let cuda = hicache_gds::cuda::CudaRuntime::load(None).map_err(|e| e.to_string())?;
    let gpus = cuda.device_count().map_err(|e| e.to_string())?;
    cuda.set_device(0).map_err(|e| e.to_string())?;
    println!("CUDA runtime {}: {gpus} GPU(s)", cuda.path().display());
    let len = 1usize << 20;
    let page: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
    let mut src = cuda.alloc(len).map_err(|e| e.to_string())?;
    let mut dst = cuda.alloc(len).map_err(|e| e.to_string())?;
    src.copy_from_host(0, &page).map_err(|e| e.to_string())?;
    let check = |dst: &hicache_gds::cuda::DeviceBuffer<'_>, what: &str| -> Result<(), String> {
        let mut back = vec![0u8; len];
        dst.copy_to_host(0, &mut back).map_err(|e| e.to_string())?;
        if back != page {
            return Err(format!("{what}: GPU memory holds other bytes"));
        }
        println!("{what}: GPU bytes verified");
        Ok(())
    };
    // SAFETY: both device buffers live and are used by nothing else until deregistered.
    unsafe {
        cufile
            .register_buffer(src.as_ptr(), len)
            .map_err(|e| e.to_string())?;
        cufile
            .register_buffer(dst.as_ptr(), len)
            .map_err(|e| e.to_string())?;
        let w = cufile.write(handle, src.as_ptr(), len, 0, 0);
        let r = cufile.read(handle, dst.as_ptr(), len, 0, 0);
        println!(
            "cuFileWrite from GPU: {} bytes",
            w.map_err(|e| e.to_string())?
        );
        println!(
            "cuFileRead into GPU: {} bytes",
            r.map_err(|e| e.to_string())?
        );
    }
    check(&dst, "cuFileRead")?;
    dst.copy_from_host(0, &vec![0u8; len])
        .map_err(|e| e.to_string())?;
    let quarter = len / 4;
    let batch = cufile.batch(4).map_err(|e| e.to_string())?;
    let requests = |op, base: *mut std::ffi::c_void| -> Vec<Request<'_>> {
        (0..4u64)
            .map(|i| Request {
                file: handle,
                op,
                base,
                size: quarter,
                file_offset: (3 - i) * quarter as u64,
                buf_offset: i * quarter as u64,
            })
            .collect()
    };
    // SAFETY: as above; the buffers are still registered.
    unsafe {
        let w = batch.run(&requests(Op::Write, src.as_ptr()));
        let r = batch.run(&requests(Op::Read, dst.as_ptr()));
        cufile
            .deregister_buffer(src.as_ptr())
            .map_err(|e| e.to_string())?;
        cufile
            .deregister_buffer(dst.as_ptr())
            .map_err(|e| e.to_string())?;
        for (what, results) in [("write", w), ("read", r)] {
            let done: Result<Vec<usize>, String> = results
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()))
                .collect();
            println!("batch {what} (GPU): {:?} bytes", done?);
        }
    }
    check(&dst, "batch read")
}
