//! Loads cuFile, opens the driver, registers a file in a dir, and writes and reads back
//! 1 MiB of host memory through it, once with cuFileWrite/cuFileRead and once as a batch of
//! 4 requests each way: the cuFile layer against whatever library the machine has. `cargo run -p hicache-gds --example cufile_round_trip -- DIR [LIBRARY]`.
//!
//! Every failure prints as hicache reports it (name, code, hint) and exits non-zero.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use hicache_gds::cufile::{CuFile, Op, Request};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: cufile_round_trip DIR [LIBRARY]");
        return ExitCode::from(2);
    };
    let library = args.next().map(PathBuf::from);
    match run(&dir, library.as_deref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: &std::path::Path, library: Option<&std::path::Path>) -> Result<(), String> {
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
