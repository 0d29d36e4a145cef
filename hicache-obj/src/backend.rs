//! The OBJ backend over `object_store`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use hicache_core::raw::{
    BackendInfo, BackendKind, Capability, HostBytes, ListCursor, ListPage, Listed, ObjectKey,
    ReadItem, RegionId, RegionTable, Slice, StorageBackend, TargetSlice, Usage, WriteItem,
};
use hicache_core::{Error, MemoryRegion, ReadOutcome, Result};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use tokio::sync::Notify;

use crate::NAME;
use crate::client::ObjectClient;
use crate::config::{ObjConfig, Target};

/// The client side of the backend, shared with the tasks that run writes.
#[derive(Debug)]
struct Client {
    /// The object_store client of this config (also for the probe and the bench baseline).
    store: Arc<dyn ObjectStore>,
    /// The client that moves objects: `store` itself, or the AWS SDK's.
    objects: Box<dyn ObjectClient>,
    regions: RegionTable,
    cfg: ObjConfig,
}

impl Client {
    /// Builds the client. No request is made: the probe checks reachability.
    fn new(cfg: ObjConfig) -> Result<Self> {
        let store = build_store(&cfg)?;
        let objects = new_client(&cfg, store.clone())?;
        Ok(Client {
            store,
            objects,
            regions: RegionTable::new(NAME),
            cfg,
        })
    }

    /// The store path of an object.
    fn path(&self, key: &ObjectKey) -> Path {
        if self.cfg.key_prefix.is_empty() {
            Path::from(key.as_str())
        } else {
            Path::from(format!("{}/{}", self.cfg.key_prefix, key.as_str()))
        }
    }

    /// Pins the segments of a write for reading, as host bytes.
    fn sources(&self, segments: &[Slice]) -> Result<Vec<HostBytes>> {
        segments
            .iter()
            .map(|s| self.regions.source(s)?.into_host_bytes())
            .collect()
    }

    /// Pins the segments of a read for writing.
    fn targets(&self, segments: &[Slice]) -> Result<Vec<TargetSlice>> {
        segments.iter().map(|s| self.regions.target(s)).collect()
    }

    /// Writes one object from pinned host bytes; runs in its own task (see
    /// [`ObjBackend::write_one`]).
    async fn put(&self, key: &ObjectKey, parts: Vec<HostBytes>) -> Result<()> {
        self.objects.put(&self.path(key), key, parts).await
    }

    async fn read_one(&self, key: &ObjectKey, segments: &[Slice]) -> Result<ReadOutcome> {
        let mut parts = self.targets(segments)?;
        let expected: u64 = parts.iter().map(|s| s.len() as u64).sum();
        self.objects
            .get(&self.path(key), key, &mut parts, expected)
            .await
    }

    async fn head_one(&self, key: &ObjectKey) -> Result<bool> {
        self.objects.head(&self.path(key), key).await
    }

    async fn delete_one(&self, key: &ObjectKey) -> Result<()> {
        self.objects.delete(&self.path(key), key).await
    }
}

/// The client `cfg.client` names, over `store` for `object_store`.
fn new_client(cfg: &ObjConfig, store: Arc<dyn ObjectStore>) -> Result<Box<dyn ObjectClient>> {
    match cfg.client {
        crate::config::ClientKind::ObjectStore => Ok(Box::new(crate::client::StoreClient {
            store,
            cfg: cfg.clone(),
        })),
        #[cfg(feature = "aws-sdk")]
        crate::config::ClientKind::AwsSdk => Ok(Box::new(crate::sdk::SdkObjects::new(cfg)?)),
        #[cfg(not(feature = "aws-sdk"))]
        crate::config::ClientKind::AwsSdk => Err(hicache_core::Error::InvalidConfig {
            key: "client".into(),
            source_desc: crate::NAME.into(),
            reason: "this build has no aws-sdk client".into(),
            hint: Some(
                "build hicache with the `aws-sdk` feature, or use client = \"object_store\"".into(),
            ),
        }),
    }
}

/// The object_store client of a config: in memory, a local dir, or S3 (signed with ring).
fn build_store(cfg: &ObjConfig) -> Result<Arc<dyn ObjectStore>> {
    let store: Arc<dyn ObjectStore> = match &cfg.target {
        Target::Memory => Arc::new(object_store::memory::InMemory::new()),
        Target::Local(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(NAME, "create dir", Some(dir.clone()), e))?;
            Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|e| {
                    Error::backend(NAME, format!("local store at {}: {e}", dir.display()))
                })?,
            )
        }
        Target::S3 {
            bucket,
            endpoint,
            region,
            allow_http,
            access_key,
            secret_key,
            session_token,
            virtual_hosted,
        } => {
            crate::tls::ensure_provider();
            // from_env: the standard AWS chain (environment, web identity, container and
            // instance credentials) unless the config names credentials.
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_region(region)
                .with_allow_http(*allow_http)
                .with_virtual_hosted_style_request(*virtual_hosted)
                .with_conditional_put(if cfg.conditional_create {
                    S3ConditionalPut::ETagMatch
                } else {
                    S3ConditionalPut::Disabled
                })
                .with_client_options(
                    ClientOptions::new()
                        .with_allow_http(*allow_http)
                        .with_timeout(cfg.request_timeout)
                        .with_connect_timeout(
                            cfg.request_timeout.min(std::time::Duration::from_secs(5)),
                        ),
                )
                .with_retry(RetryConfig {
                    backoff: BackoffConfig {
                        init_backoff: cfg.retry_backoff,
                        max_backoff: cfg.retry_backoff * 16,
                        base: 2.0,
                    },
                    max_retries: cfg.retries,
                    retry_timeout: cfg.request_timeout * (cfg.retries as u32 + 1),
                });
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            if let (Some(a), Some(s)) = (access_key, secret_key) {
                b = b.with_access_key_id(a).with_secret_access_key(s);
                if let Some(t) = session_token {
                    b = b.with_token(t);
                }
            }
            if cfg.anonymous {
                b = b.with_skip_signature(true);
            }
            Arc::new(
                b.build()
                    .map_err(|e| Error::invalid_config("bucket/endpoint", NAME, e.to_string()))?,
            )
        }
    };
    Ok(store)
}

/// S3-compatible (or in-memory, or local-directory) object storage.
///
/// A write runs in its own task that owns its pinned buffers, so a write whose call was
/// dropped still ends (the HTTP client may already be sending it) and releases its pins only
/// then; until it ends, later calls on the same key wait for it, so an abandoned write can
/// never land after a newer one.
#[derive(Debug)]
pub struct ObjBackend {
    client: Arc<Client>,
    /// Writes still running, by object path.
    pending: Arc<Mutex<HashMap<String, Arc<Pending>>>>,
}

/// A write still running.
#[derive(Debug, Default)]
struct Pending {
    done: AtomicBool,
    ended: Notify,
}

impl ObjBackend {
    /// Builds the client. No request is made: the probe checks reachability.
    pub fn new(cfg: ObjConfig) -> Result<Self> {
        Ok(ObjBackend {
            client: Arc::new(Client::new(cfg)?),
            pending: Arc::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ObjConfig {
        &self.client.cfg
    }

    /// The object_store client (the raw baseline of the benchmark uses it).
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.client.store
    }

    /// The store path of an object.
    pub fn path(&self, key: &ObjectKey) -> Path {
        self.client.path(key)
    }

    fn pending_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Pending>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no write of `path` is running.
    async fn settle(&self, path: &str) {
        loop {
            let Some(pending) = self.pending_map().get(path).cloned() else {
                return;
            };
            let mut ended = std::pin::pin!(pending.ended.notified());
            ended.as_mut().enable();
            if !pending.done.load(Ordering::Acquire) {
                ended.await;
            }
            // The task removed its entry before signalling; a newer write may have one.
        }
    }

    fn capability(&self) -> Capability {
        let mut capability = Capability::default();
        capability.host_memory = true;
        capability.atomic_publish = true;
        capability.max_segments = 1024;
        capability.persistent = !matches!(self.client.cfg.target, Target::Memory);
        capability.io_alignment = 1;
        capability
    }

    async fn write_one(&self, key: &ObjectKey, segments: &[Slice]) -> Result<()> {
        self.capability().check_segments(key, segments.len())?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::backend(
                NAME,
                "OBJ writes need a tokio runtime (object_store runs on tokio)",
            )
        })?;
        let path = self.client.path(key).to_string();
        self.settle(&path).await;
        let parts = self.client.sources(segments)?;
        let pending = Arc::new(Pending::default());
        self.pending_map().insert(path.clone(), pending.clone());
        let (client, map, owned) = (self.client.clone(), self.pending.clone(), key.clone());
        let task = runtime.spawn(async move {
            let result = client.put(&owned, parts).await;
            {
                let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
                if map.get(&path).is_some_and(|p| Arc::ptr_eq(p, &pending)) {
                    map.remove(&path);
                }
            }
            pending.done.store(true, Ordering::Release);
            pending.ended.notify_waiters();
            result
        });
        task.await.unwrap_or_else(|e| {
            Err(Error::backend(
                NAME,
                format!("the write task of {key} failed: {e}"),
            ))
        })
    }

    async fn read_one(&self, key: &ObjectKey, segments: &[Slice]) -> Result<ReadOutcome> {
        self.capability().check_segments(key, segments.len())?;
        self.settle(self.client.path(key).as_ref()).await;
        self.client.read_one(key, segments).await
    }

    async fn head_one(&self, key: &ObjectKey) -> Result<bool> {
        self.settle(self.client.path(key).as_ref()).await;
        self.client.head_one(key).await
    }

    async fn delete_one(&self, key: &ObjectKey) -> Result<()> {
        self.settle(self.client.path(key).as_ref()).await;
        self.client.delete_one(key).await
    }
}

#[async_trait]
impl StorageBackend for ObjBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: BackendKind::Object,
            capability: self.capability(),
            location: self.client.cfg.location(),
        }
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        self.client.regions.register(region, &self.capability())
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        self.client.regions.remove(id).map(drop)
    }

    async fn write(&self, batch: &[WriteItem<'_>]) -> Vec<Result<()>> {
        let ops: Vec<_> = batch
            .iter()
            .map(|i| self.write_one(i.key, i.segments))
            .collect();
        futures::stream::iter(ops)
            .buffered(self.client.cfg.max_concurrency)
            .collect()
            .await
    }

    async fn read(&self, batch: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        let ops: Vec<_> = batch
            .iter()
            .map(|i| self.read_one(i.key, i.segments))
            .collect();
        futures::stream::iter(ops)
            .buffered(self.client.cfg.max_concurrency)
            .collect()
            .await
    }

    async fn exists(&self, keys: &[ObjectKey]) -> Vec<Result<bool>> {
        let ops: Vec<_> = keys.iter().map(|k| self.head_one(k)).collect();
        futures::stream::iter(ops)
            .buffered(self.client.cfg.max_concurrency)
            .collect()
            .await
    }

    async fn remove(&self, keys: &[ObjectKey]) -> Vec<Result<()>> {
        let ops: Vec<_> = keys.iter().map(|k| self.delete_one(k)).collect();
        futures::stream::iter(ops)
            .buffered(self.client.cfg.max_concurrency)
            .collect()
            .await
    }

    /// Lists through the object_store client whichever client moves pages (both reach the
    /// same bucket). S3 and the memory store list in key order, so a page stops at `limit`;
    /// a local dir lists in no order, so everything after the cursor is read and sorted.
    async fn list(
        &self,
        prefix: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<ListPage> {
        let limit = limit.max(1);
        let key_prefix = &self.client.cfg.key_prefix;
        let base = (!key_prefix.is_empty()).then(|| Path::from(key_prefix.as_str()));
        let depth = base.as_ref().map_or(0, |b| b.parts().count()) + 1;
        let sorted = !matches!(self.client.cfg.target, Target::Local(_));
        let after = cursor.map(|c| Path::from(c.0.as_str()));
        let mut stream = match &after {
            Some(offset) => self.client.store.list_with_offset(base.as_ref(), offset),
            None => self.client.store.list(base.as_ref()),
        };
        let mut found: Vec<(Path, Listed)> = Vec::new();
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| crate::errors::store_error("list", &"objects", e))?;
            // Objects of this plugin sit directly under the key prefix, named by their key.
            if meta.location.parts().count() != depth {
                continue;
            }
            let Some(name) = meta.location.filename() else {
                continue;
            };
            if !name.starts_with(prefix) {
                continue;
            }
            let Ok(key) = ObjectKey::new(name) else {
                continue;
            };
            let modified = std::time::SystemTime::from(meta.last_modified);
            found.push((
                meta.location.clone(),
                Listed::new(key, meta.size, Some(modified)),
            ));
            if sorted && found.len() > limit {
                break;
            }
        }
        found.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        let more = found.len() > limit;
        found.truncate(limit);
        let next = if more {
            found.last().map(|(p, _)| ListCursor(p.to_string()))
        } else {
            None
        };
        Ok(ListPage {
            objects: found.into_iter().map(|(_, l)| l).collect(),
            next,
        })
    }

    async fn usage(&self) -> Result<Usage> {
        // Object stores have no fixed capacity to report.
        Ok(Usage::default())
    }
}
