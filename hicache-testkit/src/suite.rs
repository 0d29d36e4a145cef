//! Turning cases into `libtest-mimic` trials: one fresh environment per trial.

use std::path::PathBuf;
use std::sync::Arc;

use hicache_core::Result;
use hicache_core::raw::DynBackend;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

use crate::broken::{BrokenBackend, Bug};
use crate::check::{CaseError, CaseResult};
use crate::memory::TestMemory;
use crate::trial::{Case, Factory, TrialEnv, per_trial};

/// One variant of a plugin under test (e.g. `ext4-direct-uring`).
struct Variant {
    name: String,
    setup: Setup,
}

/// What every trial of a variant starts from: where it stores, how it builds the backend,
/// and the variant's settings, applied to each fresh environment in one place.
#[derive(Clone)]
struct Setup {
    root: Option<PathBuf>,
    factory: Factory,
    name_limit: Option<usize>,
    cancel_ops: Option<u64>,
    concurrency_ops: Option<u64>,
    memory: Option<Arc<dyn TestMemory>>,
}

impl Setup {
    /// A fresh environment for one trial of `plugin`, with the variant's settings.
    fn env(&self, plugin: &str) -> Result<TrialEnv> {
        let mut env = TrialEnv::new(plugin, self.root.as_deref(), self.factory.clone())?;
        env.name_limit = self.name_limit;
        env.cancel_ops = self.cancel_ops;
        env.concurrency_ops = self.concurrency_ops;
        if let Some(memory) = &self.memory {
            env.set_memory(memory.clone());
        }
        Ok(env)
    }
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
            setup: Setup {
                root,
                factory: Arc::new(factory),
                name_limit: None,
                cancel_ops: None,
                concurrency_ops: None,
                memory: None,
            },
        });
        self
    }

    /// Makes the backend cases of the last added variant register `memory` instead of host
    /// memory (device memory, for a plugin that accepts it). The connector cases register
    /// the connector's host pools either way.
    pub fn memory(mut self, memory: Arc<dyn TestMemory>) -> Self {
        if let Some(v) = self.variants.last_mut() {
            v.setup.memory = Some(memory);
        }
        self
    }

    /// Declares that the storage behind the last added variant accepts object names of at
    /// most `limit` bytes (a server that stores objects as files with long temporary names).
    pub fn name_limit(mut self, limit: usize) -> Self {
        if let Some(v) = self.variants.last_mut() {
            v.setup.name_limit = Some(limit);
        }
        self
    }

    /// Sets the fewest calls of each cancellation workload for the last added variant, for
    /// storage where every call is a round trip to a slow test server: the workload still
    /// runs on until a quarter of them were dropped while pending. `HICACHE_TEST_CANCEL_OPS`,
    /// when set, wins over this.
    pub fn cancel_ops(mut self, ops: u64) -> Self {
        if let Some(v) = self.variants.last_mut() {
            v.setup.cancel_ops = Some(ops.max(1));
        }
        self
    }

    /// Sets the operations of the concurrency case (prefetch, backup and existence threads at
    /// once) for the last added variant, for storage where every call is a round trip to a
    /// slow test server: the three threads still race on the same keys, for fewer rounds.
    /// `HICACHE_TEST_CONCURRENCY_OPS`, when set, wins over this.
    pub fn concurrency_ops(mut self, ops: u64) -> Self {
        if let Some(v) = self.variants.last_mut() {
            v.setup.concurrency_ops = Some(ops.max(3));
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
                let (plugin, setup, runtime, case) =
                    (self.plugin.clone(), v.setup.clone(), runtime.clone(), *case);
                let report_time = std::env::var_os("HICACHE_TEST_TIMES").is_some();
                trials.push(Trial::ignorable_test(name.clone(), move || {
                    let started = std::time::Instant::now();
                    let env = setup
                        .env(&plugin)
                        .map_err(|e| Failed::from(format!("cannot set up the trial: {e}")))?;
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
        let env = v
            .setup
            .env(&self.plugin)
            .map_err(|e| CaseError::Failed(e.to_string()))?;
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

/// A suite whose only variant is a [`BrokenBackend`](crate::broken::BrokenBackend) with `bug` (one instance per trial,
/// so objects outlive a backend handle, except under [`Bug::ForgetsOnReopen`]).
pub fn broken_suite(bug: Bug) -> Suite {
    let shared = per_trial(move || Ok(Arc::new(BrokenBackend::new(bug)) as DynBackend));
    Suite::new(format!("{bug:?}")).variant("broken", None, move |env: &TrialEnv| {
        if bug == Bug::ForgetsOnReopen {
            Ok(Arc::new(BrokenBackend::new(bug)) as DynBackend)
        } else {
            shared(env)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hicache_core::MemoryBackend;

    fn memory_suite() -> Suite {
        Suite::new("MEMORY").variant(
            "memory",
            None,
            per_trial(|| Ok(Arc::new(MemoryBackend::new()) as DynBackend)),
        )
    }

    /// The environment variables win over a variant's settings, so each check runs only
    /// where its variable is unset (CI leaves them unset for this crate).
    fn unset(var: &str) -> bool {
        std::env::var_os(var).is_none()
    }

    #[test]
    fn a_variants_settings_reach_each_fresh_environment() {
        let suite = memory_suite()
            .name_limit(100)
            .cancel_ops(7)
            .concurrency_ops(30);
        let env = suite.variants[0].setup.env(&suite.plugin).unwrap();
        assert_eq!(env.name_limit(), Some(100));
        if unset("HICACHE_TEST_CANCEL_OPS") {
            assert_eq!(env.cancel_ops(), 7);
        }
        if unset("HICACHE_TEST_CONCURRENCY_OPS") {
            assert_eq!(env.concurrency_ops(), 30);
        }
    }

    #[test]
    fn without_settings_the_workloads_run_their_full_length() {
        let suite = memory_suite();
        let env = suite.variants[0].setup.env(&suite.plugin).unwrap();
        assert_eq!(env.name_limit(), None);
        if unset("HICACHE_TEST_CANCEL_OPS") {
            assert_eq!(env.cancel_ops(), 1000);
        }
        if unset("HICACHE_TEST_CONCURRENCY_OPS") {
            assert_eq!(env.concurrency_ops(), 10_000);
        }
    }

    #[test]
    fn settings_apply_to_the_last_added_variant_only() {
        let suite = memory_suite().concurrency_ops(30).variant(
            "second",
            None,
            per_trial(|| Ok(Arc::new(MemoryBackend::new()) as DynBackend)),
        );
        assert_eq!(suite.variants[0].setup.concurrency_ops, Some(30));
        assert_eq!(suite.variants[1].setup.concurrency_ops, None);
    }
}
