//! Loads cuFile, opens the driver, registers a file in a dir, and writes and reads back
//! 1 MiB of host memory through it: the cuFile layer against whatever library the machine
//! has. `cargo run -p hicache-gds --example cufile_round_trip -- DIR [LIBRARY]`.
//!
//! Every failure prints as hicache reports it (name, code, hint) and exits non-zero.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use hicache_gds::cufile::CuFile;

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
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    cufile.close_driver().map_err(|e| e.to_string())?;
    result
}
