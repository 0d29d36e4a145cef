//! The `hicache` command: which plugins this build has, what they can do here, and what the
//! effective configuration is.

mod cmd;

use std::process::ExitCode;

use clap::Parser;
use hicache::EnvSnapshot;

use cmd::args::{Cli, GlobalArgs, Switch};

/// Restores the default SIGPIPE action: `hicache config show | head` then ends quietly when
/// `head` exits, like other Unix tools, instead of panicking in `println!` on EPIPE.
fn quiet_on_broken_pipe() {
    // SAFETY: called first thing in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Counts heap allocations, so `hicache bench` can report them per page.
#[global_allocator]
static ALLOCATOR: hicache_cli::bench::CountingAllocator = hicache_cli::bench::CountingAllocator;

fn main() -> ExitCode {
    ALLOCATOR.installed();
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HICACHE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only where a person reads them, never into a pipe or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cmd::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(g: &GlobalArgs) -> hicache::Result<hicache::Config> {
    let mut loader = hicache::config();
    if let Some(path) = &g.config {
        loader = loader.file(path);
    }
    // The environment brings HICACHE_CONFIG when --config is absent (the library's rule).
    loader = loader.env(EnvSnapshot::from_process());
    if let Some(p) = &g.plugin {
        loader = loader.set_flag("--plugin", "plugin", p.as_str());
    }
    if !g.dirs.is_empty() {
        // Verbatim: each --dir is one dir, commas included.
        let mut list = Vec::with_capacity(g.dirs.len());
        for d in &g.dirs {
            let s = d.to_str().ok_or_else(|| {
                hicache::Error::invalid_config(
                    "--dir",
                    "the command line",
                    format!("{} is not valid UTF-8", d.display()),
                )
            })?;
            list.push(serde_json::Value::String(s.to_string()));
        }
        loader = loader.set_flag("--dir", "storage_dir", serde_json::Value::Array(list));
    }
    if let Some(d) = g.direct_io {
        loader = loader.set_flag("--direct-io", "use_direct_io", d == Switch::On);
    }
    loader.load()
}
