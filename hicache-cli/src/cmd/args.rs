//! The command line, as clap parses it.

use std::path::PathBuf;

use crate::bench::ModelShape;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "hicache",
    version,
    about = "KV-cache storage tier: plugins, config, diagnosis"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Args, Debug)]
pub(crate) struct GlobalArgs {
    /// Config file (.toml or .json; a leading @ is accepted).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Plugin to use (`auto` probes and picks).
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) plugin: Option<String>,
    /// Storage dir (repeat for several; order is part of routing).
    #[arg(long = "dir", global = true, value_name = "DIR")]
    pub(crate) dirs: Vec<PathBuf>,
    /// Direct I/O on or off.
    #[arg(long, global = true)]
    pub(crate) direct_io: Option<Switch>,
    /// Machine-readable JSON output, to stdout (no FILE, or `-`) or to FILE.
    #[arg(long, global = true, value_name = "FILE", num_args = 0..=1)]
    pub(crate) json: Option<Option<PathBuf>>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// Capacity, and the stored objects counted by namespace with their bytes and ages.
    Usage(UsageArgs),
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ShapeArgs {
    /// Page shape (custom takes --page-bytes).
    #[arg(long, value_enum, default_value_t = Model::Llama3_8b)]
    pub(crate) model: Model,
    /// Tokens per page [default: 8; a custom page is 16 tokens of --page-bytes].
    #[arg(long)]
    pub(crate) page_tokens: Option<u64>,
    /// Bytes per page for --model custom (a multiple of 512).
    #[arg(long)]
    pub(crate) page_bytes: Option<u64>,
    /// Host layout.
    #[arg(long, value_enum, default_value_t = LayoutArg::PageFirst)]
    pub(crate) layout: LayoutArg,
}

/// `on` or `off` (also `true`/`false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Switch {
    #[value(alias = "true")]
    On,
    #[value(alias = "false")]
    Off,
}

/// The page shapes `bench` and `doctor` know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Model {
    #[value(name = "llama3-8b")]
    Llama3_8b,
    #[value(name = "qwen3-8b")]
    Qwen3_8b,
    #[value(name = "deepseek-v3")]
    DeepseekV3,
    Custom,
}

impl Model {
    pub(crate) fn name(self) -> &'static str {
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
pub(crate) enum LayoutArg {
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
pub(crate) enum Op {
    Write,
    Read,
    Exists,
}

/// What `bench --baseline` runs instead of hicache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Baseline {
    /// O_DIRECT pwrite/pread of one pre-opened file per page.
    Raw,
    /// The raw loop plus the per-page open, close and rename of publishing by name.
    RawPublish,
    /// The object_store client, one object per page (feature obj).
    #[cfg(feature = "obj")]
    RawObj,
}

impl ShapeArgs {
    pub(crate) fn geometry(&self, pages: u64) -> hicache::Result<hicache::PoolGeometry> {
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
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// Pages per round (default: about 256 MiB of pages, at least 16).
    #[arg(long)]
    pub(crate) pages: Option<u64>,
    /// Pages per call.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch: usize,
    /// Calls in flight.
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: usize,
    /// Phases, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "write,read,exists"
    )]
    pub(crate) ops: Vec<Op>,
    /// Rounds of write + read (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Keep the pages afterwards.
    #[arg(long)]
    pub(crate) keep: bool,
    /// Allocate the host pool in a shared-memory file under /dev/shm, as an engine does for
    /// a plugin that moves such memory in place (3FS); the report says how the pool moved.
    #[arg(long, conflicts_with = "baseline")]
    pub(crate) shared_pool: bool,
    /// Run a baseline instead of hicache: `raw` = O_DIRECT pwrite/pread of one pre-opened file
    /// per page with --threads threads (the disk's limit); `raw-publish` = the same loop, but a
    /// write opens a spare file, writes, closes and renames it onto the page's name, and a read
    /// opens the name, reads and closes it (the least a by-name atomic store costs per page);
    /// `raw-obj` (feature obj) = the object_store client putting/getting one object per page,
    /// --batch requests in flight.
    #[arg(long, value_enum)]
    pub(crate) baseline: Option<Baseline>,
}

#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// Host pool size as a multiple of the device KV cache (SGLang's --hicache-ratio).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) ratio: f64,
    /// Device KV cache size, GiB, that --ratio multiplies.
    #[arg(long, default_value_t = 8.0)]
    pub(crate) device_kv_gib: f64,
    /// Host pool size in GiB (SGLang's --hicache-size); overrides --ratio.
    #[arg(long)]
    pub(crate) host_gib: Option<f64>,
}

#[derive(Args, Debug)]
pub(crate) struct ScrubArgs {
    /// Remove torn, corrupt and foreign objects and stale temporary files.
    #[arg(long)]
    pub(crate) delete: bool,
    /// Our namespace (16 hex chars as in object names); others are reported as foreign.
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    /// Temporary files older than this many seconds are leftovers.
    #[arg(long, default_value_t = 60)]
    pub(crate) temp_age_s: u64,
    /// Walk the plugin's listing and read each object through the plugin, also for POSIX
    /// dirs (which are otherwise walked file by file). Other plugins are always walked so.
    #[arg(long)]
    pub(crate) listing: bool,
    /// Only objects whose names start with this (a listing walk only).
    #[arg(long, default_value = "", requires = "listing")]
    pub(crate) prefix: String,
}

#[derive(Args, Debug)]
pub(crate) struct UsageArgs {
    /// Only objects whose names start with this.
    #[arg(long, default_value = "")]
    pub(crate) prefix: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConfigCommand {
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
