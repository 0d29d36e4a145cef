//! The commands of the `hicache` binary: argument parsing, one module per command, and
//! the JSON output they share. The work itself lives in the library (`hicache_cli`).

pub(crate) mod args;
pub(crate) mod bench;
pub(crate) mod config;
pub(crate) mod json;
pub(crate) mod plugins;
pub(crate) mod tools;

use std::process::ExitCode;

use args::{Cli, Command, ConfigCommand};
use bench::bench;
use config::{config_keys, config_show};
use json::JsonOut;
use plugins::plugins;
use tools::{doctor, scrub};

use crate::load_config;

pub(crate) fn runtime() -> hicache::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            hicache::Error::io(
                hicache::Component::Tool("hicache"),
                "start runtime",
                None,
                e,
            )
        })
}

pub(crate) fn run(cli: Cli) -> hicache::Result<ExitCode> {
    let json = JsonOut::from(&cli.global.json);
    // Every command but `config keys` works on the loaded config; the reference is what
    // helps fix a config that does not load, so it needs none.
    let config = || -> hicache::Result<hicache::Config> {
        let config = load_config(&cli.global)?;
        json.check_writable()?;
        Ok(config)
    };
    match cli.command {
        Command::Config {
            command: ConfigCommand::Keys { markdown },
        } => {
            json.check_writable()?;
            config_keys(markdown, &json)
        }
        Command::Config {
            command: ConfigCommand::Show,
        } => config_show(&config()?, &json),
        Command::Plugins => plugins(&config()?, &json),
        Command::Bench(args) => bench(config()?, &args, &json),
        Command::Doctor(args) => doctor(&config()?, &args, &json),
        Command::Scrub(args) => scrub(&config()?, &args, &json),
    }
}
