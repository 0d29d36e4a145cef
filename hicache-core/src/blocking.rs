//! The blocking face of the connector, for engines that call from plain threads.

use std::future::Future;
use std::sync::Arc;

use crate::backend::ReadOutcome;
use crate::connector::{
    ExistsV2, HiCache, HostSlots, PoolQuery, PoolReport, PoolTransfer, SetOutcome, Stats,
};
use crate::error::{Error, Result};
use crate::key::PageKey;
use crate::pool::{HostPool, PoolName, SidecarPool};

/// A blocking façade over [`HiCache`] for callers without an async runtime.
///
/// It owns a small multi-thread runtime (two workers); calls may come from any number of
/// threads. Called from inside an async runtime, where blocking would stall that runtime's
/// worker, each method returns [`Error::BlockingInAsync`] instead of blocking (or panicking,
/// as a nested `block_on` would): use the async [`HiCache`] there ([`inner`](Self::inner)).
/// Dropping it inside an async runtime is fine: its runtime then shuts down in the background.
#[derive(Debug)]
pub struct BlockingHiCache {
    inner: Arc<HiCache>,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

impl BlockingHiCache {
    /// Wraps a connector.
    pub fn new(inner: HiCache) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hicache-rt")
            .enable_all()
            .build()
            .map_err(|e| Error::io(crate::error::Component::Connector, "start runtime", None, e))?;
        Ok(BlockingHiCache {
            inner: Arc::new(inner),
            runtime: Some(runtime),
        })
    }

    /// The async connector.
    pub fn inner(&self) -> &Arc<HiCache> {
        &self.inner
    }

    /// Runs `f` to completion on the owned runtime, unless the caller is itself inside an
    /// async runtime.
    fn block_on<T>(&self, operation: &'static str, f: impl Future<Output = T>) -> Result<T> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::BlockingInAsync { operation });
        }
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        Ok(runtime.block_on(f))
    }

    /// See [`HiCache::register_pool`].
    pub fn register_pool(&self, pool: Arc<dyn HostPool>) -> Result<PoolReport> {
        self.inner.register_pool(pool)
    }

    /// See [`HiCache::pool_report`].
    pub fn pool_report(&self) -> Option<PoolReport> {
        self.inner.pool_report()
    }

    /// See [`HiCache::stats`].
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// See [`HiCache::batch_set`].
    pub fn batch_set(
        &self,
        keys: &[PageKey],
        slots: HostSlots<'_>,
    ) -> Result<Vec<Result<SetOutcome>>> {
        self.block_on("batch_set", self.inner.batch_set(keys, slots))?
    }

    /// See [`HiCache::batch_get`].
    pub fn batch_get(
        &self,
        keys: &[PageKey],
        slots: HostSlots<'_>,
    ) -> Result<Vec<Result<ReadOutcome>>> {
        self.block_on("batch_get", self.inner.batch_get(keys, slots))?
    }

    /// See [`HiCache::batch_exists`].
    pub fn batch_exists(&self, keys: &[PageKey]) -> Result<usize> {
        self.block_on("batch_exists", self.inner.batch_exists(keys))?
    }

    /// See [`HiCache::exists`].
    pub fn exists(&self, key: &PageKey) -> Result<bool> {
        self.block_on("exists", self.inner.exists(key))?
    }

    /// See [`HiCache::batch_remove`].
    pub fn batch_remove(&self, keys: &[PageKey]) -> Result<Vec<Result<()>>> {
        self.block_on("batch_remove", self.inner.batch_remove(keys))?
    }

    /// See [`HiCache::register_sidecar`].
    pub fn register_sidecar(&self, pool: SidecarPool) -> Result<PoolReport> {
        self.inner.register_sidecar(pool)
    }

    /// See [`HiCache::unregister_sidecar`].
    pub fn unregister_sidecar(&self, name: &PoolName) -> Result<bool> {
        self.block_on("unregister_sidecar", self.inner.unregister_sidecar(name))
    }

    /// See [`HiCache::batch_exists_v2`].
    pub fn batch_exists_v2(&self, keys: &[PageKey], pools: &[PoolQuery<'_>]) -> Result<ExistsV2> {
        self.block_on("batch_exists_v2", self.inner.batch_exists_v2(keys, pools))?
    }

    /// See [`HiCache::batch_set_v2`].
    pub fn batch_set_v2(
        &self,
        transfers: &[PoolTransfer<'_>],
    ) -> Result<Vec<Vec<Result<SetOutcome>>>> {
        self.block_on("batch_set_v2", self.inner.batch_set_v2(transfers))?
    }

    /// See [`HiCache::batch_get_v2`].
    pub fn batch_get_v2(
        &self,
        transfers: &[PoolTransfer<'_>],
    ) -> Result<Vec<Vec<Option<Result<ReadOutcome>>>>> {
        self.block_on("batch_get_v2", self.inner.batch_get_v2(transfers))?
    }

    /// See [`HiCache::clear`].
    pub fn clear(&self) -> Result<u64> {
        self.block_on("clear", self.inner.clear())?
    }

    /// See [`HiCache::unregister_pool`].
    pub fn unregister_pool(&self) -> Result<()> {
        self.block_on("unregister_pool", self.inner.unregister_pool())
    }

    /// See [`HiCache::close`]: unregisters the pool, blocking the thread until no transfer
    /// uses it. Idempotent.
    pub fn close(&self) {
        self.inner.close()
    }
}

impl Drop for BlockingHiCache {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its workers, which tokio forbids inside another
        // runtime; there it is let go in the background instead.
        if let Some(runtime) = self.runtime.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            runtime.shutdown_background();
        }
    }
}
