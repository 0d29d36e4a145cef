//! What a case runs in: the trial's environment (a fresh dir and namespace, the plugin's
//! factory), and a case with the planted bugs it is shown to catch.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::raw::{Capability, DynBackend};
use hicache_core::{
    ConfigLoader, HiCache, HiCacheOptions, MmapPool, PoolGeometry, Result, StorageIdentity,
};

use crate::broken::Bug;
use crate::check::CaseResult;
use crate::memory::TestMemory;

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
    memory: Arc<dyn TestMemory>,
    pub(crate) name_limit: Option<usize>,
    pub(crate) cancel_ops: Option<u64>,
    pub(crate) concurrency_ops: Option<u64>,
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
                    hicache_core::Error::io(
                        plugin.to_string(),
                        "create test root",
                        Some(r.to_path_buf()),
                        e,
                    )
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
            hicache_core::Error::io(
                plugin.to_string(),
                "create test dir",
                root.map(Path::to_path_buf),
                e,
            )
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
            memory: crate::memory::host(),
            name_limit: None,
            cancel_ops: None,
            concurrency_ops: None,
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
    /// hicache's own limit (set with [`Suite::name_limit`](crate::Suite::name_limit)).
    pub fn name_limit(&self) -> Option<usize> {
        self.name_limit
    }

    /// Calls each cancellation workload makes at least (half of them under a timeout or
    /// `select!`; a workload continues up to 4× that until a quarter of it was dropped while
    /// pending, when at least 1 call in 10 is): `HICACHE_TEST_CANCEL_OPS` when set, else the
    /// variant's [`Suite::cancel_ops`](crate::Suite::cancel_ops), else 1000.
    pub fn cancel_ops(&self) -> u64 {
        workload_length("HICACHE_TEST_CANCEL_OPS", self.cancel_ops, 1000)
    }

    /// Operations of the concurrency case, spread over its three threads:
    /// `HICACHE_TEST_CONCURRENCY_OPS` when set, else the variant's
    /// [`Suite::concurrency_ops`](crate::Suite::concurrency_ops), else 10 000.
    pub fn concurrency_ops(&self) -> u64 {
        workload_length("HICACHE_TEST_CONCURRENCY_OPS", self.concurrency_ops, 10_000)
    }

    /// The plugin under test.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// The memory the backend cases register (host memory unless the variant gives other
    /// memory with [`Suite::memory`](crate::Suite::memory)).
    pub fn memory(&self) -> Arc<dyn TestMemory> {
        self.memory.clone()
    }

    /// A fresh, zeroed host pool for the connector cases, from the variant's memory
    /// ([`TestMemory::pool`]: anonymous by default, shared memory for
    /// [`SharedHostMemory`](crate::memory::SharedHostMemory)).
    pub fn pool(&self, geometry: PoolGeometry) -> Result<Arc<MmapPool>> {
        self.memory.pool(geometry).map(Arc::new)
    }

    /// Sets the memory the backend cases register.
    pub(crate) fn set_memory(&mut self, memory: Arc<dyn TestMemory>) {
        self.memory = memory;
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

/// Opens `plugin` for `config` as selection does — parameters checked, probe run, build
/// with the probe's findings — for a factory that tests one plugin by name; an unusable
/// probe is the error, with its verdict.
pub fn open_probed(
    plugin: &'static hicache_core::raw::PluginDescriptor,
    config: &hicache_core::Config,
) -> Result<DynBackend> {
    let params = hicache_core::raw::params_for(plugin, config)?;
    let ctx = hicache_core::raw::PluginContext::new(config, &params);
    let probe = plugin.probe(&ctx);
    if !probe.verdict().is_usable() {
        return Err(hicache_core::Error::PluginUnusable {
            plugin: plugin.name.into(),
            reason: probe.verdict().to_string(),
            hint: None,
        });
    }
    plugin.build(&ctx.with_findings(probe.findings()))
}

/// A workload's length: the environment variable `var` when it holds a number, else the
/// variant's setting, else `default`.
fn workload_length(var: &str, variant: Option<u64>, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .or(variant)
        .unwrap_or(default)
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
