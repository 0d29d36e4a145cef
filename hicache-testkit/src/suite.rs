//! Turning cases into `libtest-mimic` trials: one fresh environment per trial.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::raw::{Capability, DynBackend};
use hicache_core::{ConfigLoader, HiCache, HiCacheOptions, Result, StorageIdentity};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::broken::Bug;
use crate::check::{CaseError, CaseResult};

/// Builds a backend for a trial. Called once or more per trial; every call must return a
/// backend over the *same* storage (the trial's dir or namespace), as a restart would.
pub type Factory = Arc<dyn Fn(&TrialEnv) -> Result<DynBackend> + Send + Sync>;

/// The boxed future of a case.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// How a case is shown to be able to fail: a case that passes against every plugin, broken
/// or not, proves nothing.
#[derive(Clone, Copy, Debug)]
pub enum Proof {
    /// The case fails against a [`BrokenBackend`](crate::broken::BrokenBackend) with each of
    /// these bugs (the testkit's own tests check every pair).
    Catches(&'static [Bug]),
    /// No plugin can make the case fail: it checks hicache-core's own logic (the text says
    /// which), and core's tests guard that logic.
    CoreOnly(&'static str),
}

/// One named case.
#[derive(Clone, Copy)]
pub struct Case {
    /// Name (the trial is `conformance::<name>`).
    pub name: &'static str,
    /// The case body.
    pub run: for<'a> fn(&'a TrialEnv) -> CaseFuture<'a>,
    /// The bugs it is shown to catch.
    pub proof: Proof,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// What a case gets: a fresh dir (and unique namespace) and the plugin's factory.
pub struct TrialEnv {
    dir: tempfile::TempDir,
    namespace: String,
    factory: Factory,
    plugin: String,
    capability: Capability,
    name_limit: Option<usize>,
    cancel_ops: Option<u64>,
}

impl std::fmt::Debug for TrialEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrialEnv")
            .field("plugin", &self.plugin)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl TrialEnv {
    /// A fresh environment under `root` (the system temp dir when `None`).
    pub fn new(plugin: &str, root: Option<&Path>, factory: Factory) -> Result<Self> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = match root {
            Some(r) => {
                std::fs::create_dir_all(r).map_err(|e| {
                    hicache_core::Error::io(plugin, "create test root", Some(r.to_path_buf()), e)
                })?;
                tempfile::Builder::new()
                    .prefix("hicache-conformance-")
                    .tempdir_in(r)
            }
            None => tempfile::Builder::new()
                .prefix("hicache-conformance-")
                .tempdir(),
        }
        .map_err(|e| {
            hicache_core::Error::io(plugin, "create test dir", root.map(Path::to_path_buf), e)
        })?;
        let namespace = format!(
            "t{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() % 1_000_000_007)
                .unwrap_or(0)
        );
        let mut env = TrialEnv {
            dir,
            namespace,
            factory,
            plugin: plugin.to_string(),
            capability: Capability::default(),
            name_limit: None,
            cancel_ops: None,
        };
        env.capability = env.backend()?.info().capability;
        Ok(env)
    }

    /// The trial's own directory (FILE plugins store here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A name unique to this trial (OBJ plugins use it as a key prefix).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The longest object name the storage behind this variant accepts, when it is below
    /// hicache's own limit (set with [`Suite::name_limit`]).
    pub fn name_limit(&self) -> Option<usize> {
        self.name_limit
    }

    /// Calls each cancellation workload makes at least (half of them under a timeout or
    /// `select!`; a workload continues up to 4× that until a quarter of it was dropped while
    /// pending, when at least 1 call in 10 is): `HICACHE_TEST_CANCEL_OPS` when set, else the
    /// variant's [`Suite::cancel_ops`], else 1000.
    pub fn cancel_ops(&self) -> u64 {
        std::env::var("HICACHE_TEST_CANCEL_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .or(self.cancel_ops)
            .unwrap_or(1000)
    }

    /// The plugin under test.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// The backend's capability.
    pub fn capability(&self) -> &Capability {
        &self.capability
    }

    /// A new backend over the trial's storage.
    pub fn backend(&self) -> Result<DynBackend> {
        (self.factory)(self)
    }

    /// A config loader pointing at the trial dir.
    pub fn config(&self) -> ConfigLoader {
        ConfigLoader::new().set("storage_dir", self.dir().display().to_string())
    }

    /// A connector over a new backend, with extra explicit settings.
    pub fn connector(
        &self,
        identity: StorageIdentity,
        settings: &[(&str, &str)],
    ) -> Result<HiCache> {
        let mut loader = self.config();
        for (k, v) in settings {
            loader = loader.set(*k, *v);
        }
        HiCache::with_backend(
            self.backend()?,
            loader.load()?,
            HiCacheOptions::new(identity),
        )
    }

    /// A connector with default settings for model `m`, single rank.
    pub fn default_connector(&self) -> Result<HiCache> {
        self.connector(StorageIdentity::single("m"), &[])
    }

    /// A connector with custom options over a new backend.
    pub fn connector_with_options(&self, options: HiCacheOptions) -> Result<HiCache> {
        HiCache::with_backend(self.backend()?, self.config().load()?, options)
    }
}

/// Backends built so far, one per trial dir.
type PerTrial = Arc<std::sync::Mutex<Vec<(PathBuf, DynBackend)>>>;

/// A factory for plugins that keep data in memory: the first call of a trial builds a
/// backend with `make`, later calls of the same trial return that same backend (the stand-in
/// for "reopening the same storage").
pub fn per_trial<F>(make: F) -> impl Fn(&TrialEnv) -> Result<DynBackend> + Send + Sync + 'static
where
    F: Fn() -> Result<DynBackend> + Send + Sync + 'static,
{
    let built: PerTrial = Arc::default();
    move |env| {
        let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, b)) = built.iter().find(|(d, _)| d == env.dir()) {
            return Ok(b.clone());
        }
        let b = make()?;
        built.push((env.dir().to_path_buf(), b.clone()));
        Ok(b)
    }
}

/// One variant of a plugin under test (e.g. `ext4-direct-uring`).
struct Variant {
    name: String,
    root: Option<PathBuf>,
    factory: Factory,
    name_limit: Option<usize>,
    cancel_ops: Option<u64>,
}

/// A plugin's conformance suite: every case of [`crate::cases::ALL`] for each variant.
pub struct Suite {
    plugin: String,
    variants: Vec<Variant>,
    cases: Vec<Case>,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("plugin", &self.plugin)
            .field(
                "variants",
                &self.variants.iter().map(|v| &v.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Suite {
    /// A suite for `plugin` with every case and no variant yet.
    pub fn new(plugin: impl Into<String>) -> Self {
        Suite {
            plugin: plugin.into(),
            variants: Vec::new(),
            cases: crate::cases::ALL.to_vec(),
        }
    }

    /// Adds a variant whose trials store under `root` (`None`: the system temp dir, or
    /// `HICACHE_TEST_ROOT` when set).
    pub fn variant<F>(mut self, name: impl Into<String>, root: Option<PathBuf>, factory: F) -> Self
    where
        F: Fn(&TrialEnv) -> Result<DynBackend> + Send + Sync + 'static,
    {
        let root = root.or_else(|| std::env::var_os("HICACHE_TEST_ROOT").map(PathBuf::from));
        self.variants.push(Variant {
            name: name.into(),
            root,
            factory: Arc::new(factory),
            name_limit: None,
            cancel_ops: None,
        });
        self
    }

    /// Declares that the storage behind the last added variant accepts object names of at
    /// most `limit` bytes (a server that stores objects as files with long temporary names).
    pub fn name_limit(mut self, limit: usize) -> Self {
        if let Some(v) = self.variants.last_mut() {
            v.name_limit = Some(limit);
        }
        self
    }

    /// Sets the fewest calls of each cancellation workload for the last added variant, for
    /// storage where every call is a round trip to a slow test server: the workload still
    /// runs on until a quarter of them were dropped while pending. `HICACHE_TEST_CANCEL_OPS`,
    /// when set, wins over this.
    pub fn cancel_ops(mut self, ops: u64) -> Self {
        if let Some(v) = self.variants.last_mut() {
            v.cancel_ops = Some(ops.max(1));
        }
        self
    }

    /// Only the named cases (tests of the suite itself).
    pub fn only(mut self, names: &[&str]) -> Self {
        self.cases.retain(|c| names.contains(&c.name));
        self
    }

    /// The trials: `conformance::<case>` for a single variant, `conformance::<variant>::<case>`
    /// for several.
    pub fn trials(&self) -> Vec<Trial> {
        let runtime = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("test runtime"),
        );
        let mut trials = Vec::new();
        for v in &self.variants {
            for case in &self.cases {
                let name = if self.variants.len() == 1 {
                    format!("conformance::{}", case.name)
                } else {
                    format!("conformance::{}::{}", v.name, case.name)
                };
                let cancel_ops = v.cancel_ops;
                let (plugin, root, factory, runtime, case, name_limit) = (
                    self.plugin.clone(),
                    v.root.clone(),
                    v.factory.clone(),
                    runtime.clone(),
                    *case,
                    v.name_limit,
                );
                let report_time = std::env::var_os("HICACHE_TEST_TIMES").is_some();
                trials.push(Trial::ignorable_test(name.clone(), move || {
                    let started = std::time::Instant::now();
                    let mut env = TrialEnv::new(&plugin, root.as_deref(), factory)
                        .map_err(|e| Failed::from(format!("cannot set up the trial: {e}")))?;
                    env.name_limit = name_limit;
                    env.cancel_ops = cancel_ops;
                    let outcome = runtime.block_on((case.run)(&env));
                    if report_time {
                        // On stderr so it never mixes with the result lines test runners parse.
                        eprintln!("time: {name}: {:.2}s", started.elapsed().as_secs_f64());
                    }
                    match outcome {
                        Ok(()) => Ok(Completion::Completed),
                        Err(CaseError::Skipped(reason)) => Ok(Completion::ignored_with(reason)),
                        Err(CaseError::Failed(msg)) => Err(Failed::from(msg)),
                    }
                }));
            }
        }
        trials
    }

    /// Parses the test arguments, runs the trials, and exits like a test binary.
    pub fn run_main(self) -> std::process::ExitCode {
        let args = Arguments::from_args();
        if !args.list {
            // On stdout, beside the trial lines, so `cargo xtask ci` can count breadth (not
            // when listing: test runners parse that output).
            for v in &self.variants {
                println!(
                    "conformance: plugin {} variant {}: {} cases",
                    self.plugin,
                    v.name,
                    self.cases.len()
                );
            }
        }
        let trials = self.trials();
        libtest_mimic::run(&args, trials).exit_code()
    }

    /// Runs one case against one fresh environment of the first variant (tests of the
    /// suite itself).
    pub fn run_case(&self, name: &str) -> CaseResult {
        let v = self.variants.first().expect("a variant");
        let case = self
            .cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        let mut env = TrialEnv::new(&self.plugin, v.root.as_deref(), v.factory.clone())
            .map_err(|e| CaseError::Failed(e.to_string()))?;
        env.name_limit = v.name_limit;
        env.cancel_ops = v.cancel_ops;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on((case.run)(&env))
    }

    /// The case names, in order.
    pub fn case_names(&self) -> Vec<&'static str> {
        self.cases.iter().map(|c| c.name).collect()
    }
}

/// Writes the `main` of a conformance test binary (`[[test]] harness = false`).
///
/// One variant: `conformance_suite!("ACME", |env| acme::build(env.dir()));`
/// Several: `conformance_suite!("POSIX", { "ext4" => |env| …, "tmpfs" @ "/dev/shm" => |env| … });`
#[macro_export]
macro_rules! conformance_suite {
    ($plugin:expr, { $($variant:literal $(@ $root:expr)? => $factory:expr),+ $(,)? }) => {
        fn main() -> ::std::process::ExitCode {
            let suite = $crate::Suite::new($plugin)
                $(.variant($variant, $crate::__root!($($root)?), $factory))+;
            suite.run_main()
        }
    };
    ($plugin:expr, $factory:expr $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            $crate::Suite::new($plugin).variant("default", None, $factory).run_main()
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __root {
    () => {
        None
    };
    ($root:expr) => {
        Some(::std::path::PathBuf::from($root))
    };
}
