//! `kvdir-hicache`: the `hicache` command (plugins, config, doctor, bench, scrub) with KVDIR
//! linked in beside hicache's own plugins.

fn main() -> std::process::ExitCode {
    hicache_cli::Commands::new()
        .plugin(&kvdir::DESCRIPTOR)
        .main()
}
