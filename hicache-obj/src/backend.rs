//! The OBJ backend over `object_store`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use hicache_core::raw::{
    BackendInfo, BackendKind, Capability, HostBytes, ObjectKey, ReadItem, RegionId, RegionTable,
    Slice, StorageBackend, TargetSlice, Usage, WriteItem,
};
use hicache_core::{Error, MemKind, MemoryRegion, MissReason, ReadOutcome, Result};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig,
};
use tokio::sync::Notify;

use crate::NAME;
use crate::config::{ObjConfig, Target};
#[cfg(feature = "aws-sdk")]
use crate::errors::sdk_error;
use crate::errors::store_error;

/// Copies a streamed body into the pinned segments of a read, in order.
struct Scatter<'a> {
    parts: &'a mut [TargetSlice],
    seg: usize,
    at: usize,
    received: u64,
}

impl<'a> Scatter<'a> {
    fn new(parts: &'a mut [TargetSlice]) -> Self {
        Scatter {
            parts,
            seg: 0,
            at: 0,
            received: 0,
        }
    }

    /// Copies `data` in; false when the body is longer than the segments.
    fn push(&mut self, mut data: &[u8]) -> Result<bool> {
        while !data.is_empty() {
            let Some(dst) = self.parts.get_mut(self.seg) else {
                self.received += data.len() as u64;
                return Ok(false);
            };
            let n = (dst.len() - self.at).min(data.len());
            dst.copy_from(self.at, &data[..n])?;
            self.at += n;
            self.received += n as u64;
            data = &data[n..];
            if self.at == dst.len() {
                self.seg += 1;
                self.at = 0;
            }
        }
        Ok(true)
    }
}

/// The client side of the backend, shared with the tasks that run writes.
#[derive(Debug)]
struct Client {
    store: Arc<dyn ObjectStore>,
    #[cfg(feature = "aws-sdk")]
    sdk: Option<crate::sdk::SdkClient>,
    regions: RegionTable,
    cfg: ObjConfig,
}

impl Client {
    /// Builds the client. No request is made: the probe checks reachability.
    fn new(cfg: ObjConfig) -> Result<Self> {
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
                    b.build().map_err(|e| {
                        Error::invalid_config("bucket/endpoint", NAME, e.to_string())
                    })?,
                )
            }
        };
        #[cfg(feature = "aws-sdk")]
        let sdk = match cfg.client {
            crate::config::ClientKind::AwsSdk => Some(
                crate::sdk::SdkClient::new(&cfg)
                    .map_err(|r| Error::invalid_config("client", NAME, r))?,
            ),
            crate::config::ClientKind::ObjectStore => None,
        };
        #[cfg(not(feature = "aws-sdk"))]
        if cfg.client == crate::config::ClientKind::AwsSdk {
            return Err(Error::InvalidConfig {
                key: "client".into(),
                source_desc: NAME.into(),
                reason: "this build has no aws-sdk client".into(),
                hint: Some(
                    "build hicache with the `aws-sdk` feature, or use client = \"object_store\""
                        .into(),
                ),
            });
        }
        Ok(Client {
            store,
            #[cfg(feature = "aws-sdk")]
            sdk,
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
        #[cfg(feature = "aws-sdk")]
        if let Some(sdk) = &self.sdk {
            return self.sdk_write(sdk, key, &parts).await;
        }
        let total: u64 = parts.iter().map(|p| p.as_ref().len() as u64).sum();
        let chunks: Vec<Bytes> = match self.cfg.target {
            // Zero-copy: each buffer owns its pin, so the memory stays reserved for as long
            // as the HTTP client holds the body (it drops it once the request has ended).
            Target::S3 { .. } => parts.into_iter().map(Bytes::from_owner).collect(),
            // The in-memory store keeps the payload's buffers as the stored object, and the
            // local store's lifetime for them is its own business: copy, so no stored object
            // ever aliases registered memory and the pins end here.
            Target::Memory | Target::Local(_) => parts
                .iter()
                .map(|p| Bytes::copy_from_slice(p.as_ref()))
                .collect(),
        };
        let path = self.path(key);
        if total > self.cfg.multipart_threshold {
            return self.write_multipart(&path, chunks, total).await;
        }
        let payload: PutPayload = chunks.into_iter().collect();
        let create = self.cfg.conditional_create && !matches!(self.cfg.target, Target::Local(_));
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        match self
            .store
            .put_opts(&path, payload.clone(), PutOptions::from(mode))
            .await
        {
            Ok(_) => Ok(()),
            // The key exists: replace it (writing an existing key replaces it, atomically).
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::NotImplemented { .. }) => self
                .store
                .put_opts(&path, payload, PutOptions::from(PutMode::Overwrite))
                .await
                .map(drop)
                .map_err(|e| store_error("put", key, e)),
            // A server may answer a conditional create of an existing key (412) before it has
            // read the body and close the connection: the client then sees a broken pipe, not
            // the 412. Writing replaces the key anyway, so one plain overwrite settles it; a
            // real failure (auth, bucket, server down) fails that too and is reported.
            Err(first) if create => {
                tracing::debug!(%key, error = %first, "conditional create failed; overwriting once");
                self.store
                    .put_opts(&path, payload, PutOptions::from(PutMode::Overwrite))
                    .await
                    .map(drop)
                    .map_err(|e| store_error("put", key, e))
            }
            Err(e) => Err(store_error("put", key, e)),
        }
    }

    async fn write_multipart(&self, path: &Path, chunks: Vec<Bytes>, total: u64) -> Result<()> {
        let mut upload = self
            .store
            .put_multipart(path)
            .await
            .map_err(|e| store_error("start multipart upload", path, e))?;
        let part = self.cfg.part_size as usize;
        let mut pending: Vec<Bytes> = Vec::new();
        let mut pending_len = 0usize;
        let mut parts = Vec::new();
        for mut chunk in chunks {
            while !chunk.is_empty() {
                let take = (part - pending_len).min(chunk.len());
                pending.push(chunk.split_to(take));
                pending_len += take;
                if pending_len == part {
                    parts.push(upload.put_part(std::mem::take(&mut pending).into_iter().collect()));
                    pending_len = 0;
                }
            }
        }
        if pending_len > 0 {
            parts.push(upload.put_part(pending.into_iter().collect()));
        }
        let result = async {
            futures::future::try_join_all(parts).await?;
            upload.complete().await
        }
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = upload.abort().await;
                Err(store_error(
                    &format!("multipart upload of {total} bytes"),
                    path,
                    e,
                ))
            }
        }
    }

    async fn read_one(&self, key: &ObjectKey, segments: &[Slice]) -> Result<ReadOutcome> {
        let mut parts = self.targets(segments)?;
        let expected: u64 = parts.iter().map(|s| s.len() as u64).sum();
        #[cfg(feature = "aws-sdk")]
        if let Some(sdk) = &self.sdk {
            return self.sdk_read(sdk, key, &mut parts, expected).await;
        }
        let result = match self
            .store
            .get_opts(&self.path(key), GetOptions::default())
            .await
        {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => {
                return Ok(ReadOutcome::Miss(MissReason::NotFound));
            }
            Err(e) => return Err(store_error("get", key, e)),
        };
        if result.meta.size != expected {
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected,
                found: result.meta.size,
            }));
        }
        // Copy each received chunk straight into its place in the segments.
        let mut stream = result.into_stream();
        let mut scatter = Scatter::new(&mut parts);
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| store_error("get body", key, e))?
        {
            if !scatter.push(&chunk)? {
                break;
            }
        }
        let received = scatter.received;
        if received != expected {
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected,
                found: received,
            }));
        }
        Ok(ReadOutcome::Hit)
    }
}

impl Client {
    async fn head_one(&self, key: &ObjectKey) -> Result<bool> {
        #[cfg(feature = "aws-sdk")]
        if let Some(sdk) = &self.sdk {
            return sdk
                .exists(self.path(key).as_ref())
                .await
                .map_err(|e| sdk_error("head", key, e));
        }
        match self.store.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error("head", key, e)),
        }
    }

    async fn delete_one(&self, key: &ObjectKey) -> Result<()> {
        #[cfg(feature = "aws-sdk")]
        if let Some(sdk) = &self.sdk {
            return sdk
                .delete(self.path(key).as_ref())
                .await
                .map_err(|e| sdk_error("delete", key, e));
        }
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error("delete", key, e)),
        }
    }
}

#[cfg(feature = "aws-sdk")]
impl Client {
    async fn sdk_write(
        &self,
        sdk: &crate::sdk::SdkClient,
        key: &ObjectKey,
        parts: &[HostBytes],
    ) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.as_ref().len()).sum();
        let mut body = Vec::with_capacity(total);
        for p in parts {
            body.extend_from_slice(p.as_ref());
        }
        let body = Bytes::from(body);
        let path = self.path(key);
        let name: &str = path.as_ref();
        if total as u64 > self.cfg.multipart_threshold {
            return sdk
                .put_multipart(name, body, self.cfg.part_size as usize)
                .await
                .map_err(|e| sdk_error("multipart put", key, e));
        }
        let create = self.cfg.conditional_create;
        let created = match sdk.put(name, body.clone(), create).await {
            Ok(created) => created,
            // As with object_store: a conditional create answered early (412 before the body
            // was read) can surface as a transport error; one plain overwrite settles it.
            Err(first) if create => {
                tracing::debug!(%key, error = %first, "conditional create failed; overwriting once");
                false
            }
            Err(e) => return Err(sdk_error("put", key, e)),
        };
        if !created {
            // The key exists: replace it.
            sdk.put(name, body, false)
                .await
                .map_err(|e| sdk_error("put", key, e))?;
        }
        Ok(())
    }

    async fn sdk_read(
        &self,
        sdk: &crate::sdk::SdkClient,
        key: &ObjectKey,
        parts: &mut [TargetSlice],
        expected: u64,
    ) -> Result<ReadOutcome> {
        let Some((size, mut body)) = sdk
            .get(self.path(key).as_ref())
            .await
            .map_err(|e| sdk_error("get", key, e))?
        else {
            return Ok(ReadOutcome::Miss(MissReason::NotFound));
        };
        if size != expected {
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected,
                found: size,
            }));
        }
        let mut scatter = Scatter::new(parts);
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| Error::backend(NAME, format!("get body {key}: {e}")))?
        {
            if !scatter.push(&chunk)? {
                break;
            }
        }
        if scatter.received != expected {
            return Ok(ReadOutcome::Miss(MissReason::SizeMismatch {
                expected,
                found: scatter.received,
            }));
        }
        Ok(ReadOutcome::Hit)
    }
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
        if region.kind() != MemKind::Host {
            return Err(Error::Unsupported {
                backend: NAME.into(),
                operation: format!(
                    "registering {} memory (OBJ moves host memory)",
                    region.kind()
                ),
            });
        }
        Ok(self.client.regions.insert(region))
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

    async fn usage(&self) -> Result<Usage> {
        // Object stores have no fixed capacity to report.
        Ok(Usage::default())
    }
}
