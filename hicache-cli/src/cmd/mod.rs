//! The commands of the `hicache` command line: argument parsing, one module per command,
//! and the JSON output they share; [`Commands`] runs them over any set of plugins.

pub(crate) mod args;
pub(crate) mod bench;
pub(crate) mod config;
pub(crate) mod json;
pub(crate) mod plugins;
pub(crate) mod tools;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use hicache::EnvSnapshot;
use hicache::raw::PluginDescriptor;

use args::{Cli, Command, ConfigCommand, GlobalArgs, Switch};
use bench::bench;
use config::{config_keys, config_show};
use json::JsonOut;
use plugins::plugins;
use tools::{doctor, scrub, usage};

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

/// The `hicache` command line (`plugins`, `config`, `doctor`, `bench`, `scrub`, `usage`) over this
/// build's plugins and any a program adds: a vendor who links a plugin into their own
/// binary gets every command for it in a few lines.
///
/// ```no_run
/// # mod acme { pub static DESCRIPTOR: hicache::raw::PluginDescriptor = hicache::raw::PluginDescriptor::new(
/// #     "ACME", hicache::raw::BackendKind::File, "ACME", |_| hicache::raw::Probe::unusable("-", "-"),
/// #     |_| Err(hicache::Error::backend("ACME", "-"))); }
/// fn main() -> std::process::ExitCode {
///     hicache_cli::Commands::new().plugin(&acme::DESCRIPTOR).main()
/// }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Commands {
    plugins: Vec<&'static PluginDescriptor>,
}

impl Commands {
    /// The commands over this build's plugins (and those of `plugin_dirs`).
    pub fn new() -> Self {
        Self::default()
    }

    /// With `plugin` beside them, selected like a built-in one.
    pub fn plugin(mut self, plugin: &'static PluginDescriptor) -> Self {
        self.plugins.push(plugin);
        self
    }

    /// Runs the command the process's arguments name, printing errors like the `hicache`
    /// command: call it first thing in `main` (it sets up logging from `HICACHE_LOG` unless
    /// the program already has a logger, and the default SIGPIPE action, so `| head` ends
    /// the command quietly).
    pub fn main(&self) -> ExitCode {
        quiet_on_broken_pipe();
        let (filter, bad_filter) = log_filter(std::env::var_os("HICACHE_LOG"));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Colour codes only where a person reads them, never into a pipe or a log file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            // A program that set up its own logging keeps it.
            .try_init()
            .ok();
        if let Some(why) = bad_filter {
            eprintln!("warning: {why}; logging warnings only");
        }
        self.run_args(std::env::args_os())
    }

    /// Parses `args` (the program name first) and runs the command; `--help`, `--version`
    /// and usage errors print as clap prints them.
    pub fn run_args(
        &self,
        args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    ) -> ExitCode {
        let cli = match Cli::try_parse_from(args) {
            Ok(cli) => cli,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
            }
        };
        match self.run(cli) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// The registry for `config`: this build's plugins, the added ones, and those of
    /// `plugin_dirs`.
    pub(crate) fn registry(
        &self,
        config: &hicache::Config,
    ) -> hicache::Result<hicache::PluginRegistry> {
        hicache::registry_with(config, &self.plugins)
    }

    fn load_config(&self, g: &GlobalArgs) -> hicache::Result<hicache::Config> {
        let mut loader = hicache::config_with(&self.plugins);
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

    fn run(&self, cli: Cli) -> hicache::Result<ExitCode> {
        let json = JsonOut::from(&cli.global.json);
        // Every command but `config keys` works on the loaded config; the reference is what
        // helps fix a config that does not load, so it needs none.
        let config = || -> hicache::Result<hicache::Config> {
            let config = self.load_config(&cli.global)?;
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
            } => config_show(self, &config()?, &json),
            Command::Plugins => plugins(self, &config()?, &json),
            // A one-off command never runs the capacity cleaner: it would start evicting
            // pages from dirs an engine may be using.
            Command::Bench(args) => bench(
                self,
                config()?.without_cleaner("hicache bench"),
                &args,
                &json,
            ),
            Command::Doctor(args) => doctor(self, &config()?, &args, &json),
            Command::Scrub(args) => scrub(
                self,
                &config()?.without_cleaner("hicache scrub"),
                &args,
                &json,
            ),
            Command::Usage(args) => usage(
                self,
                &config()?.without_cleaner("hicache usage"),
                &args,
                &json,
            ),
        }
    }
}

/// Restores the default SIGPIPE action: `hicache config show | head` then ends quietly when
/// `head` exits, like other Unix tools, instead of panicking in `println!` on EPIPE.
fn quiet_on_broken_pipe() {
    // SAFETY: `Commands::main` is documented to run first thing in `main`, before the
    // program starts other threads; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The log filter `HICACHE_LOG` names (`warn` when unset or empty), and why it was not taken
/// when it could not be: a value that is not UTF-8 or not a filter is said, not ignored.
fn log_filter(value: Option<OsString>) -> (tracing_subscriber::EnvFilter, Option<String>) {
    let warn = || tracing_subscriber::EnvFilter::new("warn");
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return (warn(), None);
    };
    match value.to_str() {
        None => (warn(), Some(format!("HICACHE_LOG {value:?} is not UTF-8"))),
        Some(text) => match tracing_subscriber::EnvFilter::try_new(text) {
            Ok(filter) => (filter, None),
            Err(e) => (
                warn(),
                Some(format!(
                    "HICACHE_LOG `{text}` is not a log filter ({e}); write a level (debug) or \
                     targets with levels (hicache_posix=debug,warn)"
                )),
            ),
        },
    }
}
