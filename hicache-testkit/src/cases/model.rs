//! Model-based cases: random sequences of set, get, exists and remove through the connector,
//! checked after every step against a reference map, with proptest shrinking a failure to a
//! minimal sequence.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hicache_core::{
    HiCache, HostPool, HostSlots, Layout, MissReason, MmapPool, PageKey, ReadOutcome, SetOutcome,
    StorageIdentity,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::check::{CaseError, CaseResult};
use crate::fixtures::{fill_page, mha, page_bytes};
use crate::trial::TrialEnv;

/// Keys a sequence uses: few, so overwrites, misses and removals of stored pages are common.
const KEYS: usize = 6;

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    /// Store each key with the page of its seed (distinct keys).
    Set(Vec<(usize, u32)>),
    /// Read each key.
    Get(Vec<usize>),
    /// The stored prefix of a key list.
    Exists(Vec<usize>),
    /// Remove each key.
    Remove(Vec<usize>),
}

fn key_list(max: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0..KEYS, 1..=max)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::btree_map(0..KEYS, 0u32..4, 1..=3)
            .prop_map(|m| Op::Set(m.into_iter().collect())),
        4 => key_list(3).prop_map(Op::Get),
        2 => key_list(KEYS).prop_map(Op::Exists),
        2 => key_list(2).prop_map(Op::Remove),
    ]
}

/// Sequences per page format: `HICACHE_TEST_MODEL_CASES` when set, else 24.
fn sequences() -> u32 {
    std::env::var("HICACHE_TEST_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

/// The keys of one run of one sequence: fresh names, so runs (and proptest's shrinking
/// reruns) never see each other's pages.
fn run_keys() -> Vec<PageKey> {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    crate::fixtures::keys(&format!("md{run:x}x"), KEYS)
}

/// Runs `ops` against `cache` and the reference map, failing at the first disagreement.
async fn check_sequence(cache: &HiCache, pool: &MmapPool, ops: &[Op]) -> Result<(), String> {
    let ks = run_keys();
    // Host slot `k` holds key k's page to write; reads land in slots KEYS.. .
    let mut model: HashMap<usize, u32> = HashMap::new();
    let fail = |step: usize, what: String| Err(format!("step {step}: {what}"));
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Set(items) => {
                let keys: Vec<PageKey> = items.iter().map(|(k, _)| ks[*k].clone()).collect();
                let slots: Vec<u64> = items.iter().map(|(k, _)| *k as u64).collect();
                for (k, seed) in items {
                    fill_page(pool, *k as u64, *seed);
                }
                let r = cache
                    .batch_set(&keys, HostSlots::Pages(&slots))
                    .await
                    .map_err(|e| e.to_string())?;
                for ((k, seed), r) in items.iter().zip(&r) {
                    match r {
                        Ok(SetOutcome::Written) => {
                            model.insert(*k, *seed);
                        }
                        other => return fail(step, format!("set of key {k}: {other:?}")),
                    }
                }
            }
            Op::Get(list) => {
                let keys: Vec<PageKey> = list.iter().map(|k| ks[*k].clone()).collect();
                let targets: Vec<u64> = (0..list.len()).map(|i| (KEYS + i) as u64).collect();
                let r = cache
                    .batch_get(&keys, HostSlots::Pages(&targets))
                    .await
                    .map_err(|e| e.to_string())?;
                for ((k, target), r) in list.iter().zip(&targets).zip(&r) {
                    match (model.get(k), r) {
                        (Some(seed), Ok(ReadOutcome::Hit)) => {
                            let want = crate::fixtures::pattern(
                                pool.geometry().page_bytes() as usize,
                                *seed,
                            );
                            if page_bytes(pool, *target) != want {
                                return fail(step, format!("key {k}: a hit with the wrong page"));
                            }
                        }
                        (None, Ok(ReadOutcome::Miss(MissReason::NotFound))) => {}
                        (want, got) => {
                            return fail(
                                step,
                                format!("key {k}: stored seed {want:?}, read {got:?}"),
                            );
                        }
                    }
                }
            }
            Op::Exists(list) => {
                let keys: Vec<PageKey> = list.iter().map(|k| ks[*k].clone()).collect();
                let got = cache.batch_exists(&keys).await.map_err(|e| e.to_string())?;
                let want = list.iter().take_while(|k| model.contains_key(k)).count();
                if got != want {
                    return fail(step, format!("exists of {list:?}: {got}, model {want}"));
                }
            }
            Op::Remove(list) => {
                let keys: Vec<PageKey> = list.iter().map(|k| ks[*k].clone()).collect();
                let r = cache.batch_remove(&keys).await.map_err(|e| e.to_string())?;
                for (k, r) in list.iter().zip(&r) {
                    if let Err(e) = r {
                        return fail(step, format!("remove of key {k}: {e}"));
                    }
                    model.remove(k);
                }
            }
        }
    }
    Ok(())
}

/// Random sequences of set/get/exists/remove (overwrites, misses, removals, both page
/// formats) agree with a reference map after every step; a failure is shrunk to a minimal
/// sequence, printed with the step that disagreed.
pub async fn model_sequences_match_a_reference_map(env: &TrialEnv) -> CaseResult {
    let geometry = mha(Layout::PageFirst, 16, (2 * KEYS) as u64);
    let mut runs = Vec::new();
    for format in ["envelope", "raw"] {
        let cache =
            Arc::new(env.connector(StorageIdentity::single("model"), &[("page_format", format)])?);
        let pool = env.pool(geometry)?;
        cache.register_pool(pool.clone())?;
        runs.push((format, cache, pool));
    }
    let handle = tokio::runtime::Handle::current();
    let cases = sequences();
    // proptest drives its runner synchronously: on a blocking thread, each sequence entering
    // the runtime through its handle.
    let outcome = tokio::task::spawn_blocking(move || {
        for (format, cache, pool) in runs {
            let config = Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            };
            let mut runner = TestRunner::new(config);
            let strategy = proptest::collection::vec(op(), 1..40);
            let result = runner.run(&strategy, |ops| {
                handle
                    .block_on(check_sequence(&cache, &pool, &ops))
                    .map_err(TestCaseError::fail)
            });
            if let Err(e) = result {
                return Err(format!("{format} pages: {e}"));
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| CaseError::Failed(format!("the model runner panicked: {e}")))?;
    outcome.map_err(CaseError::Failed)
}
