//! The `hicache` command: which plugins this build has, what they can do here, and what the
//! effective configuration is.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use hicache::{EnvSnapshot, PluginChoice, Verdict};
use hicache_cli::bench::{BenchOptions, ModelShape};

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
    #[arg(long, global = true)]
    direct_io: Option<Switch>,
    /// Machine-readable JSON output, to stdout or to FILE.
    #[arg(long, global = true, value_name = "FILE", num_args = 0..=1)]
    json: Option<Option<PathBuf>>,
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
    /// Write, read back and verify pages; GB/s, pages/s, batch latency.
    Bench(BenchArgs),
    /// The whole diagnosis: config, plugins, dirs, geometry, memory, a live round trip.
    Doctor(DoctorArgs),
    /// Verify stored objects; report (and with --delete remove) torn, corrupt, foreign ones.
    Scrub(ScrubArgs),
}

#[derive(Args, Debug, Clone)]
struct ShapeArgs {
    /// Page shape (custom takes --page-bytes).
    #[arg(long, value_enum, default_value_t = Model::Llama3_8b)]
    model: Model,
    /// Tokens per page [default: 8; a custom page is 16 tokens of --page-bytes].
    #[arg(long)]
    page_tokens: Option<u64>,
    /// Bytes per page for --model custom (a multiple of 512).
    #[arg(long)]
    page_bytes: Option<u64>,
    /// Host layout.
    #[arg(long, value_enum, default_value_t = LayoutArg::PageFirst)]
    layout: LayoutArg,
}

/// `on` or `off` (also `true`/`false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    #[value(alias = "true")]
    On,
    #[value(alias = "false")]
    Off,
}

/// The page shapes `bench` and `doctor` know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Model {
    #[value(name = "llama3-8b")]
    Llama3_8b,
    #[value(name = "qwen3-8b")]
    Qwen3_8b,
    #[value(name = "deepseek-v3")]
    DeepseekV3,
    Custom,
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Model::Llama3_8b => "llama3-8b",
            Model::Qwen3_8b => "qwen3-8b",
            Model::DeepseekV3 => "deepseek-v3",
            Model::Custom => "custom",
        }
    }
}

/// SGLang's host layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
enum LayoutArg {
    LayerFirst,
    PageFirst,
    PageFirstDirect,
    PageHead,
}

impl From<LayoutArg> for hicache::Layout {
    fn from(l: LayoutArg) -> Self {
        match l {
            LayoutArg::LayerFirst => hicache::Layout::LayerFirst,
            LayoutArg::PageFirst => hicache::Layout::PageFirst,
            LayoutArg::PageFirstDirect => hicache::Layout::PageFirstDirect,
            LayoutArg::PageHead => hicache::Layout::PageHead,
        }
    }
}

/// The phases of `bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    Write,
    Read,
    Exists,
}

/// What `bench --baseline` runs instead of hicache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Baseline {
    /// O_DIRECT pwrite/pread of one pre-opened file per page.
    Raw,
    /// The object_store client, one object per page (feature obj).
    #[cfg(feature = "obj")]
    RawObj,
}

impl ShapeArgs {
    fn geometry(&self, pages: u64) -> hicache::Result<hicache::PoolGeometry> {
        let layout = hicache::Layout::from(self.layout);
        let shape = ModelShape::parse(self.model.name(), self.page_bytes)?;
        if matches!(shape, ModelShape::Custom { .. }) && self.page_tokens.is_some() {
            return Err(hicache::Error::invalid_config(
                "--page-tokens",
                "the command line",
                "does not apply to --model custom, whose pages are 16 tokens of --page-bytes",
            ));
        }
        shape.geometry(self.page_tokens.unwrap_or(8), layout, pages)
    }
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    /// Pages per round (default: about 256 MiB of pages, at least 16).
    #[arg(long)]
    pages: Option<u64>,
    /// Pages per call.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Calls in flight.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Phases, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "write,read,exists"
    )]
    ops: Vec<Op>,
    /// Rounds of write + read (medians are reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Keep the pages afterwards.
    #[arg(long)]
    keep: bool,
    /// Run a baseline instead of hicache: `raw` = O_DIRECT pwrite/pread of one pre-opened file
    /// per page with --threads threads (the disk's limit); `raw-obj` (feature obj) = the
    /// object_store client putting/getting one object per page, --batch requests in flight.
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
}

#[derive(Args, Debug)]
struct DoctorArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    /// Host pool size as a multiple of the device KV cache (SGLang's --hicache-ratio).
    #[arg(long, default_value_t = 2.0)]
    ratio: f64,
    /// Device KV cache size, GiB, that --ratio multiplies.
    #[arg(long, default_value_t = 8.0)]
    device_kv_gib: f64,
    /// Host pool size in GiB (SGLang's --hicache-size); overrides --ratio.
    #[arg(long)]
    host_gib: Option<f64>,
}

#[derive(Args, Debug)]
struct ScrubArgs {
    /// Remove torn, corrupt and foreign objects and stale temporary files.
    #[arg(long)]
    delete: bool,
    /// Our namespace (16 hex chars as in object names); others are reported as foreign.
    #[arg(long)]
    namespace: Option<String>,
    /// Temporary files older than this many seconds are leftovers.
    #[arg(long, default_value_t = 60)]
    temp_age_s: u64,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Every effective setting with its value and where it came from.
    Show,
    /// Every key a config may hold in this build: type, default, environment variables,
    /// what reads it. Needs no valid config.
    Keys {
        /// The reference as Markdown (the text of the facade's CONFIG.md).
        #[arg(long, conflicts_with = "json")]
        markdown: bool,
    },
}

/// Restores the default SIGPIPE action: `hicache config show | head` then ends quietly when
/// `head` exits, like other Unix tools, instead of panicking in `println!` on EPIPE.
fn quiet_on_broken_pipe() {
    // SAFETY: called first thing in main, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
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
    match run(cli) {
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
    } else if let Ok(path) = std::env::var("HICACHE_CONFIG")
        && !path.is_empty()
    {
        loader = loader.file(path);
    }
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

/// Where JSON goes, if anywhere.
enum JsonOut {
    None,
    Stdout,
    File(PathBuf),
}

impl JsonOut {
    fn from(arg: &Option<Option<PathBuf>>) -> Self {
        match arg {
            None => JsonOut::None,
            Some(None) => JsonOut::Stdout,
            Some(Some(p)) => JsonOut::File(p.clone()),
        }
    }

    fn enabled(&self) -> bool {
        !matches!(self, JsonOut::None)
    }

    /// Fails before any work when the JSON file cannot be written (a missing dir, no
    /// permission), instead of after a long benchmark.
    fn check_writable(&self) -> hicache::Result<()> {
        if let JsonOut::File(p) = self {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(|e| {
                    hicache::Error::io("cli", "open the --json file", Some(p.clone()), e)
                })?;
        }
        Ok(())
    }

    /// Writes `value`; returns whether stdout was used (so text output is skipped).
    fn emit(&self, value: &serde_json::Value) -> hicache::Result<bool> {
        let text = serde_json::to_string_pretty(value).unwrap_or_default();
        match self {
            JsonOut::None => Ok(false),
            JsonOut::Stdout => {
                println!("{text}");
                Ok(true)
            }
            JsonOut::File(p) => {
                std::fs::write(p, text + "\n")
                    .map_err(|e| hicache::Error::io("cli", "write JSON", Some(p.clone()), e))?;
                Ok(false)
            }
        }
    }
}

fn runtime() -> hicache::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| hicache::Error::io("cli", "start runtime", None, e))
}

fn run(cli: Cli) -> hicache::Result<ExitCode> {
    let json = JsonOut::from(&cli.global.json);
    if let Command::Config {
        command: ConfigCommand::Keys { markdown },
    } = cli.command
    {
        // The reference is what helps fix a config that does not load: it needs none.
        json.check_writable()?;
        return config_keys(markdown, &json);
    }
    let config = load_config(&cli.global)?;
    json.check_writable()?;
    match cli.command {
        Command::Plugins => plugins(&config, &json),
        Command::Config {
            command: ConfigCommand::Show,
        } => config_show(&config, &json),
        Command::Config {
            command: ConfigCommand::Keys { .. },
        } => unreachable!("answered before the config is loaded"),
        Command::Bench(args) => bench(config, &args, &json),
        Command::Doctor(args) => doctor(&config, &args, &json),
        Command::Scrub(args) => scrub(&config, &args, &json),
    }
}

fn bench(config: hicache::Config, args: &BenchArgs, json: &JsonOut) -> hicache::Result<ExitCode> {
    for (flag, value) in [
        ("--pages", args.pages.unwrap_or(1)),
        ("--batch", args.batch as u64),
        ("--threads", args.threads as u64),
        ("--rounds", args.rounds as u64),
    ] {
        if value == 0 {
            return Err(hicache::Error::invalid_config(
                flag,
                "the command line",
                "must be at least 1",
            ));
        }
    }
    let one = args.shape.geometry(1)?;
    let pages = args
        .pages
        .unwrap_or_else(|| ((256u64 << 20) / one.page_bytes()).clamp(16, 4096));
    bench_fits_in_memory(pages, one.page_bytes())?;
    let ops = &args.ops;
    let report = match args.baseline {
        Some(Baseline::Raw) => {
            let dir = config
                .storage_dirs
                .value
                .first()
                .cloned()
                .unwrap_or_else(|| PathBuf::from("."));
            std::fs::create_dir_all(&dir)
                .map_err(|e| hicache::Error::io("bench", "create dir", Some(dir.clone()), e))?;
            hicache_cli::bench::raw_baseline(
                &dir,
                one.page_bytes(),
                pages,
                args.threads,
                config.use_direct_io.value,
                args.rounds,
            )?
        }
        #[cfg(feature = "obj")]
        Some(Baseline::RawObj) => {
            let registry = hicache::registry()?;
            let plugin = registry
                .get("OBJ")
                .ok_or_else(|| hicache::Error::backend("bench", "OBJ is not registered"))?;
            let params = hicache::raw::params_for(plugin, &config)?;
            let ctx = hicache::raw::PluginContext::new(&config, &params);
            let cfg = hicache::obj::ObjConfig::from_context(&ctx)?;
            runtime()?.block_on(hicache_cli::bench::raw_object_store(
                cfg,
                one.page_bytes(),
                pages,
                args.batch,
                args.rounds,
            ))?
        }
        None => {
            let cache =
                std::sync::Arc::new(hicache::open(config, hicache::HiCacheOptions::default())?);
            let opts = BenchOptions {
                geometry: one,
                pages,
                batch: args.batch,
                streams: args.threads,
                rounds: args.rounds,
                write: ops.contains(&Op::Write),
                read: ops.contains(&Op::Read),
                exists: ops.contains(&Op::Exists),
                keep: args.keep,
                progress: true,
            };
            runtime()?.block_on(hicache_cli::bench::run(cache, &opts))?
        }
    };
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        println!(
            "{} [{}] {} pages x {} ({} a round), batch {}, {} in flight, {} rounds, direct I/O {}, mode {}",
            report.plugin,
            report.location,
            report.pages,
            hicache::ByteSize(report.page_bytes),
            hicache::ByteSize(report.pages.saturating_mul(report.page_bytes)),
            report.batch,
            report.streams,
            report.rounds,
            if report.direct_io { "on" } else { "off" },
            report.transfer_mode
        );
        for (name, gbps, rounds) in [
            ("write", report.write_gbps, &report.write_rounds),
            ("read", report.read_gbps, &report.read_rounds),
        ] {
            if let Some(last) = rounds.last() {
                let per: Vec<String> = rounds.iter().map(|r| format!("{:.2}", r.gbps)).collect();
                let bytes: u64 = rounds.iter().map(|r| r.bytes).sum();
                let seconds: f64 = rounds.iter().map(|r| r.seconds).sum();
                println!(
                    "  {name:<5} {gbps:6.2} GB/s median ({}), {:.0} pages/s, batch p50 {:.2} ms p99 {:.2} ms, {} failed; {} in {seconds:.2} s in all",
                    per.join(" "),
                    last.pages_per_s,
                    last.p50_ms,
                    last.p99_ms,
                    last.failed_pages,
                    hicache::ByteSize(bytes),
                );
                for e in rounds.iter().flat_map(|r| &r.first_errors).take(8) {
                    println!("        first {name} failure: {e}");
                }
            }
        }
        if report.exists_keys_per_s > 0.0 {
            println!("  exists {:.0} keys/s", report.exists_keys_per_s);
        }
        println!(
            "  verified: {}",
            match (report.read_back, report.verified) {
                (false, _) => "not verified (nothing was read back)",
                (true, true) => "every byte",
                (true, false) => "NO - data mismatch or failed pages",
            }
        );
    }
    // A run that read nothing back has nothing to fail on; one that did must match.
    Ok(if report.verified || !report.read_back {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every bench keeps two copies of its pages in memory (written and read back); refuse a
/// `--pages` that cannot fit rather than fail deep inside mmap or swap the machine to a halt.
fn bench_fits_in_memory(pages: u64, page_bytes: u64) -> hicache::Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let need = pages.checked_mul(page_bytes).and_then(|b| b.checked_mul(2));
    let available = hicache_cli::doctor::available_memory();
    match (need, available) {
        (Some(need), Some(avail)) if need <= avail => Ok(()),
        (Some(_), None) => Ok(()),
        (need, avail) => Err(hicache::Error::invalid_config(
            "--pages",
            "the command line",
            format!(
                "{pages} pages of {} need {} of memory (written and read back) \
                 but {} is available; lower --pages",
                hicache::ByteSize(page_bytes),
                need.map_or("more than 2^64 bytes".into(), |n| format!(
                    "{:.1} GiB",
                    gib(n)
                )),
                avail.map_or("an unknown amount".into(), |a| format!("{:.1} GiB", gib(a))),
            ),
        )),
    }
}

/// A size or ratio flag: a finite number above zero whose bytes fit in 64 bits.
fn gib_amount(flag: &str, value: f64) -> hicache::Result<()> {
    let max = (u64::MAX >> 30) as f64;
    if value.is_finite() && value > 0.0 && value < max {
        return Ok(());
    }
    Err(hicache::Error::invalid_config(
        flag,
        "the command line",
        format!("{value:e} is not a number above 0 and below {max:e}"),
    ))
}

fn doctor(
    config: &hicache::Config,
    args: &DoctorArgs,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let geometry = args.shape.geometry(4)?;
    for (flag, value) in [
        ("--ratio", Some(args.ratio)),
        ("--device-kv-gib", Some(args.device_kv_gib)),
        ("--host-gib", args.host_gib),
    ] {
        if let Some(v) = value {
            gib_amount(flag, v)?;
        }
    }
    let gib = (1u64 << 30) as f64;
    let (host_pool_bytes, host_pool_origin) = match args.host_gib {
        Some(g) => ((g * gib) as u64, format!("--host-gib {g}")),
        None => (
            (args.ratio * args.device_kv_gib * gib) as u64,
            format!(
                "ratio {} x device KV {} GiB",
                args.ratio, args.device_kv_gib
            ),
        ),
    };
    let opts = hicache_cli::doctor::DoctorOptions {
        geometry,
        host_pool_bytes,
        host_pool_origin,
        round_trip_pages: 4,
    };
    let report = runtime()?.block_on(hicache_cli::doctor::run(config, &opts));
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        for (i, step) in report.steps.iter().enumerate() {
            println!(
                "{}) {:<13} {}",
                i + 1,
                step.name,
                hicache_cli::doctor::label(step.status)
            );
            for d in &step.details {
                println!("     {d}");
            }
            for f in &step.fixes {
                println!("     fix: {f}");
            }
        }
        println!(
            "{}",
            if report.ok() {
                "doctor: all checks passed"
            } else {
                "doctor: problems found (see FAIL above)"
            }
        );
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn scrub(config: &hicache::Config, args: &ScrubArgs, json: &JsonOut) -> hicache::Result<ExitCode> {
    let opts = hicache_cli::scrub::ScrubOptions {
        dirs: config.storage_dirs.value.clone(),
        delete: args.delete,
        namespace: args.namespace.clone(),
        temp_age: std::time::Duration::from_secs(args.temp_age_s),
    };
    let report = hicache_cli::scrub::scrub(&opts)?;
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        println!(
            "{} files: {} valid ({:.1} MiB), {} raw (no envelope), {} torn, {} corrupt, {} foreign, {} stale temporary, {} unreadable (kept), {} symlinks (not followed)",
            report.files,
            report.valid,
            report.valid_bytes as f64 / (1u64 << 20) as f64,
            report.raw,
            report.count("torn"),
            report.count("corrupt"),
            report.count("foreign"),
            report.count("stale-temp"),
            report.count("unreadable"),
            report.count("symlink")
        );
        for f in &report.findings {
            println!(
                "  {:<10} {} — {}{}",
                f.kind,
                f.path.display(),
                f.reason,
                if f.deleted { " (deleted)" } else { "" }
            );
        }
    }
    Ok(if report.findings.iter().all(|f| f.deleted) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn plugins(config: &hicache::Config, json: &JsonOut) -> hicache::Result<ExitCode> {
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
    if let Some(name) = &requested
        && !considered.iter().any(|c| c.name.eq_ignore_ascii_case(name))
    {
        return Err(hicache::Error::unknown_plugin(
            name,
            considered.iter().map(|c| c.name.as_str()),
        ));
    }
    // A failed listing exits non-zero: the requested plugin is unusable here, or `auto`
    // finds nothing usable.
    let usable = match &requested {
        Some(name) => considered
            .iter()
            .any(|c| c.name.eq_ignore_ascii_case(name) && c.verdict.is_usable()),
        None => auto_choice.is_some(),
    };
    let code = if usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if json.enabled() {
        let rows: Vec<serde_json::Value> = considered
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "kind": c.kind,
                    "priority": c.priority,
                    "usable": c.verdict.is_usable(),
                    "verdict": c.verdict,
                    "facts": c.facts,
                    "auto_choice": Some(&c.name) == auto_choice.as_ref(),
                })
            })
            .collect();
        let out = serde_json::json!({
            "plugins": rows,
            "auto_choice": auto_choice,
            "requested": config.plugin.value.to_string(),
            "usable": usable,
        });
        if json.emit(&out)? {
            return Ok(code);
        }
    }
    if considered.is_empty() {
        println!("no plugin is compiled into this build (enable a feature of the `hicache` crate)");
        return Ok(code);
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
        for (subject, facts) in facts_by_subject(&c.facts) {
            println!("{:<25}{subject}: {facts}", "");
        }
    }
    match (&requested, &auto_choice) {
        (Some(name), _) if usable => {
            println!("\nrequested plugin: {name} (from {})", config.plugin.source)
        }
        (Some(name), _) => println!(
            "\nrequested plugin: {name} (from {}) is unusable here",
            config.plugin.source
        ),
        (None, Some(name)) => println!("\n* = what `auto` chooses here: {name}"),
        (None, None) => println!("\n`auto` finds no usable plugin here"),
    }
    Ok(code)
}

/// A probe's facts, one line per subject in the order found: `("/data", "filesystem ext4,
/// free 10 GiB")`.
fn facts_by_subject(facts: &[hicache::Fact]) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for f in facts {
        let item = format!("{} {}", f.name, f.value);
        match out.iter_mut().find(|(s, _)| *s == f.subject) {
            Some((_, line)) => {
                line.push_str(", ");
                line.push_str(&item);
            }
            None => out.push((&f.subject, item)),
        }
    }
    out
}

/// Plugin parameters the plugin would refuse, as `bench` and `doctor` would report them: the
/// requested plugin's (sections and flat form), and every other section's.
fn parameter_problems(config: &hicache::Config) -> hicache::Result<Vec<String>> {
    let registry = hicache::registry()?;
    let mut problems = Vec::new();
    for plugin in registry.plugins() {
        let named = matches!(&config.plugin.value,
            PluginChoice::Named(n) if n.eq_ignore_ascii_case(plugin.name));
        // Flat parameters belong to the requested plugin only.
        let own_section = config.section(plugin.name).is_some() && config.flat_params.is_empty();
        if (named || own_section)
            && let Err(e) = hicache::raw::params_for(plugin, config)
        {
            problems.push(e.to_string());
        }
    }
    Ok(problems)
}

fn config_keys(markdown: bool, json: &JsonOut) -> hicache::Result<ExitCode> {
    let keys = hicache::reference();
    if markdown {
        print!("{}", hicache::config_keys_markdown(&keys));
        return Ok(ExitCode::SUCCESS);
    }
    if json.emit(&serde_json::json!({ "keys": keys }))? {
        return Ok(ExitCode::SUCCESS);
    }
    let width = keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
    for k in &keys {
        let default = k
            .default
            .as_deref()
            .map(|d| format!("  [default {d}]"))
            .unwrap_or_default();
        println!("{:<width$}  {}{default}", k.key, k.ty);
        let mut env: Vec<String> = k.env.clone();
        if let Some(alias) = &k.sglang_env {
            env.push(format!("{alias} (SGLang)"));
        }
        let env = if env.is_empty() {
            String::new()
        } else {
            format!("env {}; ", env.join(", "))
        };
        println!("{:<width$}  {env}read by {}", "", k.read_by);
        let secret = if k.secret {
            " (secret: never shown)"
        } else {
            ""
        };
        println!("{:<width$}  {}{secret}", "", k.doc);
    }
    Ok(ExitCode::SUCCESS)
}

fn config_show(config: &hicache::Config, json: &JsonOut) -> hicache::Result<ExitCode> {
    let entries = config.entries();
    let problems = parameter_problems(config)?;
    let code = if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    for p in &problems {
        eprintln!("error: {p}");
    }
    if json.enabled() {
        let out = serde_json::json!({
            "settings": entries,
            "warnings": config.warnings,
            "errors": problems,
        });
        if json.emit(&out)? {
            return Ok(code);
        }
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
    Ok(code)
}
