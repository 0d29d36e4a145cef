//! Hybrid models: sidecar pools beside the KV pool, and the multi-pool calls SGLang's v2
//! storage interface makes (`batch_exists_v2`, `batch_get_v2`, `batch_set_v2`).
//!
//! A sidecar's objects are keyed by the same page keys as the KV pages. Each registered pool
//! decides once, at registration, which objects make up one of its pages (its `parts`), and
//! existence checks, writes and reads all name objects through that one decision: SGLang's
//! NIXL backend derives the objects per page one way for existence and another for
//! transfers, and where the two disagree (conv-only Mamba, layer-first and K/V pools) the
//! pages it writes are never found.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;

use crate::backend::ReadOutcome;
use crate::error::{Error, Result};
use crate::key::{Namespace, NamingScheme, ObjectKey, ObjectNamer, PageKey};
use crate::pool::{PoolName, SidecarPool};

use super::mode::choose_sidecar_mode;
use super::plan::host_pages;
use super::shape::PageShape;
use super::{HiCache, HostSlots, PoolReport, PoolState, Registration, SetOutcome, TransferMode};

/// Which pages of a sidecar must be stored for a prefix to be restorable (SGLang's
/// `PoolHitPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HitPolicy {
    /// Every page of the prefix (state kept per page).
    AllPages,
    /// The last `window` pages of the prefix, or all of a shorter prefix (a sliding window,
    /// a recurrent state restored from its latest pages).
    TrailingPages {
        /// Pages at the end of the prefix a read needs (at least 1).
        window: usize,
    },
}

/// One sidecar pool asked about by [`HiCache::batch_exists_v2`].
#[derive(Clone, Copy, Debug)]
pub struct PoolQuery<'a> {
    /// The pool.
    pub pool: &'a PoolName,
    /// What it needs of a prefix.
    pub policy: HitPolicy,
}

/// What [`HiCache::batch_exists_v2`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExistsV2 {
    /// Leading pages whose KV objects are stored.
    pub kv_hit: usize,
    /// Per pool asked about, in order: the longest prefix (at most `kv_hit`) whose pages this
    /// pool alone could restore under its policy (0: none).
    pub pool_hits: Vec<(PoolName, usize)>,
    /// Every prefix length, ascending, that a read of the KV pool and of every pool asked
    /// about would restore in full. Under a trailing policy this set can have holes.
    pub restorable: Vec<usize>,
    /// The longest restorable prefix (the last of `restorable`, or 0).
    pub hit: usize,
}

/// Which pool a v2 transfer moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolId<'a> {
    /// The KV pool ([`HiCache::register_pool`]).
    Kv,
    /// A sidecar ([`HiCache::register_sidecar`]).
    Sidecar(&'a PoolName),
}

impl std::fmt::Display for PoolId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolId::Kv => f.write_str(PoolName::KV),
            PoolId::Sidecar(name) => write!(f, "{name}"),
        }
    }
}

/// One pool's pages in a v2 call: keys and the host pages of that pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolTransfer<'a> {
    /// The pool.
    pub pool: PoolId<'a>,
    /// Page keys (a sidecar's pages are keyed by the KV page keys).
    pub keys: &'a [PageKey],
    /// The pool's host pages, one per key (token indices in runs of the pool's page size).
    pub slots: HostSlots<'a>,
}

impl HiCache {
    /// Registers the sidecar pool `pool` under its name: decides its transfer mode,
    /// registers its buffers for zero-copy, sets up its staging. A sidecar of the same name
    /// is replaced; calls already running finish on it, and its memory is deregistered once
    /// they have ([`unregister_sidecar`](Self::unregister_sidecar) waits for that).
    ///
    /// Under `naming = "sglang"` its objects are named as SGLang's NIXL backend names a
    /// hybrid pool's: `{key}{suffix}_{pool}` for a page stored as one object (bounce, or one
    /// span per page), and per span in zero-copy (`_k`/`_v` for two spans, Mamba's
    /// `_temporal`/`_conv_{i}`, else `_{i}`); Mamba always carries the TP rank, so a
    /// rank-replicated Mamba pool is refused there.
    pub fn register_sidecar(&self, pool: SidecarPool) -> Result<PoolReport> {
        let name = pool.name().clone();
        let geometry = pool.geometry().clone();
        let naming = self.config.naming.value;
        if naming == NamingScheme::Sglang && name.is_mamba() && geometry.rank_replicated() {
            return Err(Error::InvalidPool {
                reason: "SGLang names Mamba objects per TP rank (Mamba state is TP-sharded): register the mamba pool with rank_replicated = false".into(),
            });
        }
        let shape = PageShape::of_sidecar(&geometry);
        let bases: Vec<u64> = pool.memory().iter().map(|m| m.addr() as u64).collect();
        let (mode, reason) = choose_sidecar_mode(&shape, &bases, &self.info, &self.config);
        let identity = &self.options.identity;
        let namespace = Namespace::sidecar(identity, &name, &geometry);
        let replicated = geometry.rank_replicated();
        let namer = ObjectNamer::sidecar(naming, &namespace, identity, replicated, &name);
        let spans = shape.spans_per_page();
        let tags: Vec<Option<String>> = match (naming, mode) {
            (NamingScheme::Sglang, TransferMode::ZeroCopy) if spans > 1 => (0..spans)
                .map(|i| {
                    Some(match (name.is_mamba(), spans) {
                        (true, _) if i == 0 => "_temporal".to_string(),
                        (true, _) => format!("_conv_{}", i - 1),
                        (false, 2) => if i == 0 { "_k" } else { "_v" }.to_string(),
                        (false, _) => format!("_{i}"),
                    })
                })
                .collect(),
            _ => vec![None],
        };
        let state = self.build_state(Registration {
            what: format!("sidecar {name}"),
            shape,
            memory: pool.memory().to_vec(),
            pool: None,
            mode,
            reason,
            namespace,
            namer,
            tags,
            replicated,
        })?;
        let report = state.report.clone();
        let old = self
            .sidecars
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, Arc::new(state));
        // A replaced sidecar deregisters once its last call returns (its drop waits for
        // transfers that still pin it); its memory region keeps its owner alive until then.
        drop(old);
        Ok(report)
    }

    /// Unregisters the sidecar `name`: later calls naming it fail, and this returns once no
    /// transfer uses its memory any more and it has been deregistered, so the caller may
    /// free it. Returns whether it was registered.
    pub async fn unregister_sidecar(&self, name: &PoolName) -> bool {
        let state = self
            .sidecars
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        match state {
            Some(state) => {
                super::retire(state).await;
                true
            }
            None => false,
        }
    }

    /// The report of the sidecar named `name`, if one is registered.
    pub fn sidecar_report(&self, name: &PoolName) -> Option<PoolReport> {
        self.sidecar(name).ok().map(|s| s.report.clone())
    }

    /// The names of the registered sidecars.
    pub fn sidecar_names(&self) -> Vec<PoolName> {
        self.sidecars
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// The object names a page of the sidecar `name` is stored under (for tools and tests).
    pub fn sidecar_object_names(&self, name: &PoolName, key: &PageKey) -> Result<Vec<ObjectKey>> {
        let state = self.sidecar(name)?;
        state
            .parts
            .iter()
            .map(|p| state.object_key(key, p))
            .collect()
    }

    fn sidecar(&self, name: &PoolName) -> Result<Arc<PoolState>> {
        self.sidecars
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| Error::InvalidBatch {
                reason: format!(
                    "no sidecar pool named {name} is registered: register it with register_sidecar before moving its pages"
                ),
            })
    }

    fn pool_state(&self, id: PoolId<'_>) -> Result<Arc<PoolState>> {
        match id {
            PoolId::Kv => self.current(),
            PoolId::Sidecar(name) => self.sidecar(name),
        }
    }

    /// How much of `keys` a read could restore: the KV pool's stored prefix, and within it
    /// the prefixes every pool in `pools` could restore under its policy.
    ///
    /// Each pool is checked on the pages of the KV prefix with the same object names its
    /// transfers use. A prefix length `L` is restorable by an [`HitPolicy::AllPages`] pool
    /// when its pages `0..L` are all stored, by a [`HitPolicy::TrailingPages`] pool when its
    /// pages `L-window..L` are (all of `0..L` when `L < window`); `restorable` is what every
    /// pool allows, so it never holds a prefix some pool cannot restore.
    ///
    /// Errors: no KV pool, a pool that is not registered, a window of 0.
    pub async fn batch_exists_v2(
        &self,
        keys: &[PageKey],
        pools: &[PoolQuery<'_>],
    ) -> Result<ExistsV2> {
        let kv_state = self.current()?;
        let states: Vec<Arc<PoolState>> = pools
            .iter()
            .map(|q| {
                if q.policy == (HitPolicy::TrailingPages { window: 0 }) {
                    return Err(Error::InvalidBatch {
                        reason: format!(
                            "pool {}: a trailing-pages window must be at least 1",
                            q.pool
                        ),
                    });
                }
                self.sidecar(q.pool)
            })
            .collect::<Result<_>>()?;
        let started = std::time::Instant::now();
        let kv_hit = self.presence(&kv_state, keys, true).await.len();
        // restorable[L] for L in 0..=kv_hit; 0 never counts.
        let mut restorable = vec![true; kv_hit + 1];
        restorable[0] = false;
        let mut pool_hits = Vec::with_capacity(pools.len());
        for (q, state) in pools.iter().zip(&states) {
            let stored = if kv_hit == 0 {
                Vec::new()
            } else {
                self.presence(state, &keys[..kv_hit], q.policy == HitPolicy::AllPages)
                    .await
            };
            let allows = restorable_by(&stored, kv_hit, q.policy);
            let best = (1..=kv_hit).rev().find(|&l| allows[l]).unwrap_or(0);
            pool_hits.push((q.pool.clone(), best));
            for (r, a) in restorable.iter_mut().zip(allows) {
                *r &= a;
            }
        }
        let restorable: Vec<usize> = (1..=kv_hit).filter(|&l| restorable[l]).collect();
        let hit = restorable.last().copied().unwrap_or(0);
        self.meters.exists(started.elapsed(), keys.len(), hit);
        Ok(ExistsV2 {
            kv_hit,
            pool_hits,
            restorable,
            hit,
        })
    }

    /// Writes each transfer's pages to its pool. One result list per transfer, in order, one
    /// result per key. Every transfer is checked (pool registered, slots in range) before any
    /// I/O; a rank that does not write a pool (rank-replicated pools above TP rank 0) gets
    /// [`SetOutcome::SkippedNotWriter`] for it.
    pub async fn batch_set_v2(
        &self,
        transfers: &[PoolTransfer<'_>],
    ) -> Result<Vec<Vec<Result<SetOutcome>>>> {
        let planned = self.plan_transfers(transfers)?;
        let mut out = Vec::with_capacity(transfers.len());
        for (t, (state, pages)) in transfers.iter().zip(&planned) {
            out.push(self.set_pages(state, t.keys, pages).await);
        }
        Ok(out)
    }

    /// Reads each transfer's pages into its pool. One result list per transfer, in order,
    /// one entry per key: `Some(result)` for a page that was read, `None` for a sidecar page
    /// that was not.
    ///
    /// When the call holds a KV transfer it is read first, and a sidecar page is read only
    /// if its key is within the KV prefix that read restored (a sidecar without its KV
    /// pages restores nothing); the other sidecar pages come back `None` with no I/O. Without
    /// a KV transfer every sidecar page is read. Every transfer is checked before any I/O;
    /// at most one KV transfer.
    pub async fn batch_get_v2(
        &self,
        transfers: &[PoolTransfer<'_>],
    ) -> Result<Vec<Vec<Option<Result<ReadOutcome>>>>> {
        let planned = self.plan_transfers(transfers)?;
        let kv_at = transfers.iter().position(|t| t.pool == PoolId::Kv);
        let mut out: Vec<Vec<Option<Result<ReadOutcome>>>> =
            transfers.iter().map(|_| Vec::new()).collect();
        let mut restored: Option<HashSet<&PageKey>> = None;
        if let Some(k) = kv_at {
            let (state, pages) = &planned[k];
            let results = self.get_pages(state, transfers[k].keys, pages).await;
            let prefix = results
                .iter()
                .take_while(|r| matches!(r, Ok(ReadOutcome::Hit)))
                .count();
            restored = Some(transfers[k].keys[..prefix].iter().collect());
            out[k] = results.into_iter().map(Some).collect();
        }
        for (i, (t, (state, pages))) in transfers.iter().zip(&planned).enumerate() {
            if Some(i) == kv_at {
                continue;
            }
            let wanted: Vec<usize> = (0..t.keys.len())
                .filter(|&j| restored.as_ref().is_none_or(|r| r.contains(&t.keys[j])))
                .collect();
            if wanted.len() == t.keys.len() {
                // Every page is read: no copy of the keys.
                let results = self.get_pages(state, t.keys, pages).await;
                out[i] = results.into_iter().map(Some).collect();
                continue;
            }
            let keys: Vec<PageKey> = wanted.iter().map(|&j| t.keys[j].clone()).collect();
            let hosts: Vec<u64> = wanted.iter().map(|&j| pages[j]).collect();
            let mut results = self.get_pages(state, &keys, &hosts).await.into_iter();
            let mut row: Vec<Option<Result<ReadOutcome>>> =
                (0..t.keys.len()).map(|_| None).collect();
            for &j in &wanted {
                row[j] = results.next();
            }
            out[i] = row;
        }
        Ok(out)
    }

    /// Each transfer's pool and host pages, checked before any I/O.
    fn plan_transfers(
        &self,
        transfers: &[PoolTransfer<'_>],
    ) -> Result<Vec<(Arc<PoolState>, Vec<u64>)>> {
        if transfers.iter().filter(|t| t.pool == PoolId::Kv).count() > 1 {
            return Err(Error::InvalidBatch {
                reason: "a v2 call moves the KV pool at most once".into(),
            });
        }
        transfers
            .iter()
            .map(|t| {
                let state = self.pool_state(t.pool)?;
                let pages =
                    host_pages(&state.shape, t.keys.len(), t.slots).map_err(|e| match e {
                        Error::InvalidBatch { reason } => Error::InvalidBatch {
                            reason: format!("pool {}: {reason}", t.pool),
                        },
                        e => e,
                    })?;
                Ok((state, pages))
            })
            .collect()
    }
}

/// `allows[L]` for `L` in `0..=kv_hit`: whether a pool whose pages `0..stored.len()` are
/// stored as `stored` says (absent beyond) restores a prefix of `L` pages under `policy`.
fn restorable_by(stored: &[bool], kv_hit: usize, policy: HitPolicy) -> Vec<bool> {
    let at = |i: usize| stored.get(i).copied().unwrap_or(false);
    // run = stored pages ending just before L.
    let mut run = 0usize;
    std::iter::once(false)
        .chain((1..=kv_hit).map(|l| {
            run = if at(l - 1) { run + 1 } else { 0 };
            match policy {
                HitPolicy::AllPages => run == l,
                HitPolicy::TrailingPages { window } => run >= window.min(l),
            }
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(stored: &[u8], policy: HitPolicy) -> Vec<usize> {
        let stored: Vec<bool> = stored.iter().map(|b| *b == 1).collect();
        let kv = stored.len();
        let allows = restorable_by(&stored, kv, policy);
        (1..=kv).filter(|&l| allows[l]).collect()
    }

    #[test]
    fn all_pages_restores_up_to_the_first_gap() {
        assert_eq!(set(&[1, 1, 0, 1], HitPolicy::AllPages), vec![1, 2]);
        assert_eq!(set(&[0, 1, 1], HitPolicy::AllPages), Vec::<usize>::new());
        assert_eq!(set(&[1, 1, 1], HitPolicy::AllPages), vec![1, 2, 3]);
    }

    #[test]
    fn trailing_pages_needs_only_the_window_and_may_leave_holes() {
        let w2 = HitPolicy::TrailingPages { window: 2 };
        // Pages 0 and 2 missing: only L = 5 has both of its last two pages.
        assert_eq!(set(&[0, 1, 0, 1, 1], w2), vec![5]);
        assert_eq!(set(&[1, 0, 1, 1, 0, 1, 1], w2), vec![1, 4, 7]);
        let w1 = HitPolicy::TrailingPages { window: 1 };
        assert_eq!(set(&[0, 1, 0, 1], w1), vec![2, 4]);
        // A prefix shorter than the window needs all of its pages.
        let w3 = HitPolicy::TrailingPages { window: 3 };
        assert_eq!(set(&[1, 1, 0], w3), vec![1, 2]);
        // Beyond what was checked nothing is stored.
        assert_eq!(
            restorable_by(&[true], 3, w1),
            vec![false, true, false, false]
        );
    }
}
