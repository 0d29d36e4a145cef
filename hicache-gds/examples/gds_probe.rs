//! Runs the GDS probe on storage dirs: `cargo run -p hicache-gds --example gds_probe -- DIR...`
//! (`HICACHE_CUFILE` names the library instead of the search path). Prints what was found,
//! or the failure with its dir and hint, and exits non-zero then.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dirs: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let library = std::env::var_os("HICACHE_CUFILE").map(PathBuf::from);
    match hicache_gds::probe::probe(&dirs, library.as_deref()) {
        Ok(found) => {
            println!(
                "usable: {}{}, {:?} mode, dirs checked: {:?}",
                found.loaded_from.display(),
                if found.stand_in {
                    " (hicache's stand-in)"
                } else {
                    ""
                },
                found.mode,
                found.dirs
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("unusable: {e}");
            ExitCode::FAILURE
        }
    }
}
