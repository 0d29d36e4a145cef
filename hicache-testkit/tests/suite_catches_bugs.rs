//! A case that cannot fail is a bug. Every case names the planted bugs it catches
//! ([`Proof::Catches`]) or says why no plugin can fail it ([`Proof::CoreOnly`]); these tests
//! run each named pair against a [`BrokenBackend`] and require a failure.

use std::sync::Arc;

use hicache_core::raw::DynBackend;
use hicache_core::{
    ConfigLoader, HiCache, HiCacheOptions, HostSlots, ReadOutcome, StorageIdentity,
};
use hicache_testkit::broken::{BrokenBackend, Bug};
use hicache_testkit::broken_suite;
use hicache_testkit::cases::ALL;
use hicache_testkit::fixtures::{keys, mha, pool};
use hicache_testkit::{CaseError, Proof, Suite};

/// Runs every case of `module` against each bug it names.
fn cases_catch_their_bugs(module: &str) {
    let mut checked = 0;
    for case in ALL.iter().filter(|c| c.name.starts_with(module)) {
        match case.proof {
            Proof::Catches(bugs) => {
                assert!(!bugs.is_empty(), "{} names no bug", case.name);
                for bug in bugs {
                    match broken_suite(*bug).run_case(case.name) {
                        Err(CaseError::Failed(_)) => checked += 1,
                        other => panic!("{} did not catch {bug:?}: {other:?}", case.name),
                    }
                }
            }
            Proof::CoreOnly(why) => assert!(why.len() > 20, "{}: say why", case.name),
        }
    }
    assert!(checked > 0, "no case of {module}");
}

#[test]
fn backend_cases_catch_their_bugs() {
    cases_catch_their_bugs("backend_");
}

#[test]
fn connector_cases_catch_their_bugs() {
    cases_catch_their_bugs("connector_");
}

#[test]
fn fault_cases_catch_their_bugs() {
    cases_catch_their_bugs("faults_");
}

#[test]
fn cancel_cases_catch_their_bugs() {
    cases_catch_their_bugs("cancel_");
}

#[test]
fn model_cases_catch_their_bugs() {
    cases_catch_their_bugs("model_");
}

#[test]
fn hybrid_cases_catch_their_bugs() {
    cases_catch_their_bugs("hybrid_");
}

/// Every planted bug is caught by some case, and only a few cases rest on core alone.
#[test]
fn every_bug_is_caught_and_few_cases_are_core_only() {
    for bug in Bug::ALL {
        assert!(
            ALL.iter()
                .any(|c| matches!(c.proof, Proof::Catches(b) if b.contains(bug))),
            "no case names {bug:?}"
        );
    }
    let core_only = ALL
        .iter()
        .filter(|c| matches!(c.proof, Proof::CoreOnly(_)))
        .count();
    assert!(core_only * 10 <= ALL.len(), "{core_only} core-only cases");
    assert!(
        ALL.iter().all(|c| [
            "backend_",
            "connector_",
            "faults_",
            "cancel_",
            "model_",
            "hybrid_"
        ]
        .iter()
        .any(|m| c.name.starts_with(m))),
        "a case outside the six modules would go unchecked"
    );
}

/// A plugin that answers a batch with too few or too many results fails every item of it:
/// zipping would count an unanswered write as written and an unanswered read as a hit.
#[tokio::test]
async fn the_connector_fails_every_item_when_results_are_out_of_step() {
    for bug in [Bug::DropsLastResult, Bug::ExtraResult] {
        let backend: DynBackend = Arc::new(BrokenBackend::new(bug));
        let cache = HiCache::with_backend(
            backend,
            ConfigLoader::new().load().unwrap(),
            HiCacheOptions::new(StorageIdentity::single("m")),
        )
        .unwrap();
        let pool = pool(mha(hicache_core::Layout::PageFirst, 16, 8));
        cache.register_pool(pool).unwrap();
        let ks = keys("step", 3);
        let set = cache
            .batch_set(&ks, HostSlots::Pages(&[0, 1, 2]))
            .await
            .unwrap();
        assert_eq!(set.len(), 3);
        assert!(set.iter().all(|r| r.is_err()), "{bug:?}: {set:?}");
        let got = cache
            .batch_get(&ks, HostSlots::Pages(&[4, 5, 6]))
            .await
            .unwrap();
        assert!(
            got.iter().all(|r| !matches!(r, Ok(ReadOutcome::Hit))),
            "{bug:?}: {got:?}"
        );
        assert_eq!(cache.batch_exists(&ks).await.unwrap(), 0, "{bug:?}");
        let removed = cache.batch_remove(&ks).await.unwrap();
        assert!(removed.iter().all(|r| r.is_err()), "{bug:?}: {removed:?}");
    }
}

#[test]
fn the_suite_has_unique_case_names() {
    let names = Suite::new("X").case_names();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len());
}
