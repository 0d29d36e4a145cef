//! The `hicache` command: which plugins this build has, what they can do here, and what the
//! effective configuration is.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use hicache::{ConfigLoader, EnvSnapshot, PluginChoice, Verdict};

#[derive(Parser, Debug)]
#[command(
    name = "hicache",
    version,
    about = "KV-cache storage tier: plugins, config, diagnosis"
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct GlobalArgs {
    /// Config file (.toml or .json; a leading @ is accepted).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Plugin to use (`auto` probes and picks).
    #[arg(long, global = true, value_name = "NAME")]
    plugin: Option<String>,
    /// Storage dir (repeat for several; order is part of routing).
    #[arg(long = "dir", global = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Direct I/O on or off.
    #[arg(long, global = true, value_name = "on|off")]
    direct_io: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One row per plugin: kind, priority, verdict here, reason and hint.
    Plugins,
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Every effective setting with its value and where it came from.
    Show,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HICACHE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load_config(g: &GlobalArgs) -> hicache::Result<hicache::Config> {
    let mut loader = ConfigLoader::new();
    if let Some(path) = &g.config {
        loader = loader.file(path);
    } else if let Ok(path) = std::env::var("HICACHE_CONFIG")
        && !path.is_empty()
    {
        loader = loader.file(path);
    }
    loader = loader.env(EnvSnapshot::from_process());
    if let Some(p) = &g.plugin {
        loader = loader.set("plugin", p.as_str());
    }
    if !g.dirs.is_empty() {
        let list: Vec<String> = g.dirs.iter().map(|d| d.display().to_string()).collect();
        loader = loader.set("storage_dir", list.join(","));
    }
    if let Some(d) = &g.direct_io {
        loader = loader.set("use_direct_io", d.as_str());
    }
    loader.load()
}

fn run(cli: Cli) -> hicache::Result<ExitCode> {
    let config = load_config(&cli.global)?;
    match cli.command {
        Command::Plugins => plugins(&config, cli.global.json),
        Command::Config {
            command: ConfigCommand::Show,
        } => {
            config_show(&config, cli.global.json);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn plugins(config: &hicache::Config, json: bool) -> hicache::Result<ExitCode> {
    let registry = hicache::registry()?;
    let considered = registry.probe_all(config);
    // The plugin `auto` would choose: the first usable one in selection order.
    let auto_choice = considered
        .iter()
        .find(|c| c.verdict.is_usable())
        .map(|c| c.name.clone());
    let requested = match &config.plugin.value {
        PluginChoice::Auto => None,
        PluginChoice::Named(n) => Some(n.clone()),
    };
    if json {
        let rows: Vec<serde_json::Value> = considered
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "kind": c.kind,
                    "priority": c.priority,
                    "usable": c.verdict.is_usable(),
                    "verdict": c.verdict,
                    "auto_choice": Some(&c.name) == auto_choice.as_ref(),
                })
            })
            .collect();
        let out = serde_json::json!({
            "plugins": rows,
            "auto_choice": auto_choice,
            "requested": config.plugin.value.to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    if considered.is_empty() {
        println!("no plugin is compiled into this build (enable a feature of the `hicache` crate)");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<2}{:<8} {:<5} {:>8}  VERDICT",
        "", "PLUGIN", "KIND", "PRIORITY"
    );
    for c in &considered {
        let mark = if Some(&c.name) == auto_choice.as_ref() {
            "*"
        } else {
            ""
        };
        let (verdict, detail) = match &c.verdict {
            Verdict::Usable { detail } => ("usable".to_string(), detail.clone()),
            Verdict::Unusable { reason, hint } => (
                "unusable".to_string(),
                match hint {
                    Some(h) => format!("{reason} (hint: {h})"),
                    None => reason.clone(),
                },
            ),
        };
        println!(
            "{mark:<2}{:<8} {:<5} {:>8}  {verdict}: {detail}",
            c.name,
            c.kind.to_string(),
            c.priority
        );
    }
    match (&requested, &auto_choice) {
        (Some(name), _) => println!("\nrequested plugin: {name} (from {})", config.plugin.source),
        (None, Some(name)) => println!("\n* = what `auto` chooses here: {name}"),
        (None, None) => println!("\n`auto` finds no usable plugin here"),
    }
    Ok(ExitCode::SUCCESS)
}

fn config_show(config: &hicache::Config, json: bool) {
    let entries = config.entries();
    if json {
        let out = serde_json::json!({ "settings": entries, "warnings": config.warnings });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return;
    }
    let width = entries.iter().map(|e| e.key.len()).max().unwrap_or(0);
    for e in &entries {
        let mut line = format!("{:<width$}  {}  [{}]", e.key, e.value, e.source);
        for (source, value) in &e.overridden {
            line.push_str(&format!(" (overrides {value} from {source})"));
        }
        println!("{line}");
    }
    for w in &config.warnings {
        println!("warning: {w}");
    }
}
