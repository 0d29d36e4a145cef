//! The two S3 clients behind one private trait: `object_store` (the default, zero-copy
//! puts) and, with the `aws-sdk` feature, the AWS SDK. The backend's batching, write
//! tasks and pins are the same for both; only these four requests differ.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use hicache_core::raw::{HostBytes, ObjectKey, TargetSlice};
use hicache_core::{MissReason, ReadOutcome, Result};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tokio::sync::Notify;

use crate::config::{ObjConfig, Target};
use crate::errors::store_error;

/// The requests the backend makes, one object each. `path` is the object's store path,
/// `key` names it in errors.
#[async_trait]
pub(crate) trait ObjectClient: Send + Sync + std::fmt::Debug {
    /// Writes one object from pinned host bytes; an existing object is replaced.
    async fn put(&self, path: &Path, key: &ObjectKey, parts: Vec<HostBytes>) -> Result<()>;

    /// Streams one object into pinned segments of `expected` bytes in all; a missing object
    /// or one of another size is a miss.
    async fn get(
        &self,
        path: &Path,
        key: &ObjectKey,
        parts: &mut [TargetSlice],
        expected: u64,
    ) -> Result<ReadOutcome>;

    /// Whether the object exists.
    async fn head(&self, path: &Path, key: &ObjectKey) -> Result<bool>;

    /// Removes the object; a missing one is not an error.
    async fn delete(&self, path: &Path, key: &ObjectKey) -> Result<()>;
}

/// Copies a streamed body into the pinned segments of a read, in order.
pub(crate) struct Scatter<'a> {
    parts: &'a mut [TargetSlice],
    seg: usize,
    at: usize,
    pub(crate) received: u64,
}

impl<'a> Scatter<'a> {
    pub(crate) fn new(parts: &'a mut [TargetSlice]) -> Self {
        Scatter {
            parts,
            seg: 0,
            at: 0,
            received: 0,
        }
    }

    /// Copies `data` in; false when the body is longer than the segments.
    pub(crate) fn push(&mut self, mut data: &[u8]) -> Result<bool> {
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

/// `object_store`'s client: puts borrow registered memory (no copy) for S3.
#[derive(Debug)]
pub(crate) struct StoreClient {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) cfg: ObjConfig,
}

#[async_trait]
impl ObjectClient for StoreClient {
    async fn put(&self, path: &Path, key: &ObjectKey, parts: Vec<HostBytes>) -> Result<()> {
        let total: u64 = parts.iter().map(|p| p.as_ref().len() as u64).sum();
        let lending = Arc::new(Lending::default());
        let chunks: Vec<Bytes> = match self.cfg.target {
            // Zero-copy: each buffer owns its pin, so the memory stays reserved for as long
            // as the HTTP client holds the body.
            Target::S3 { .. } => parts
                .into_iter()
                .map(|bytes| Bytes::from_owner(Lent::new(bytes, &lending)))
                .collect(),
            // The in-memory store keeps the payload's buffers as the stored object, and the
            // local store's lifetime for them is its own business: copy, so no stored object
            // ever aliases registered memory and the pins end here.
            Target::Memory | Target::Local(_) => parts
                .iter()
                .map(|p| Bytes::copy_from_slice(p.as_ref()))
                .collect(),
        };
        let result = if total > self.cfg.multipart_threshold {
            self.write_multipart(path, chunks, total).await
        } else {
            self.put_one(path, key, chunks).await
        };
        // The HTTP client's connection task may drop a request body a moment after the
        // response came back: wait for it, so that a write that returned pins nothing and
        // the caller may reuse its pages at once. Bounded by the request timeout; past it
        // the pins stay, and the region's rules keep the memory safe until they end.
        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout;
        while lending.held.load(Ordering::Acquire) > 0 {
            // `notify_one` keeps a permit when nobody waits yet, so a return between the
            // check and this wait still wakes it.
            if tokio::time::timeout_at(deadline, lending.returned.notified())
                .await
                .is_err()
            {
                tracing::debug!(%key, "the HTTP client still holds a written page's bytes");
                break;
            }
        }
        result
    }

    async fn get(
        &self,
        path: &Path,
        key: &ObjectKey,
        parts: &mut [TargetSlice],
        expected: u64,
    ) -> Result<ReadOutcome> {
        let result = match self.store.get_opts(path, GetOptions::default()).await {
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
        let mut scatter = Scatter::new(parts);
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

    async fn head(&self, path: &Path, key: &ObjectKey) -> Result<bool> {
        match self.store.head(path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error("head", key, e)),
        }
    }

    async fn delete(&self, path: &Path, key: &ObjectKey) -> Result<()> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error("delete", key, e)),
        }
    }
}

/// How many of one write's buffers the HTTP client still holds.
#[derive(Default)]
struct Lending {
    held: AtomicUsize,
    returned: Notify,
}

/// Registered bytes lent to the HTTP client; dropping the last one of a write wakes its
/// `put`.
struct Lent {
    bytes: HostBytes,
    lending: Arc<Lending>,
}

impl Lent {
    fn new(bytes: HostBytes, lending: &Arc<Lending>) -> Self {
        lending.held.fetch_add(1, Ordering::AcqRel);
        Lent {
            bytes,
            lending: lending.clone(),
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.lending.held.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.lending.returned.notify_one();
        }
    }
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

impl StoreClient {
    /// One PUT: a conditional create, or a plain overwrite when the key exists.
    async fn put_one(&self, path: &Path, key: &ObjectKey, chunks: Vec<Bytes>) -> Result<()> {
        let payload: PutPayload = chunks.into_iter().collect();
        let create = self.cfg.conditional_create && !matches!(self.cfg.target, Target::Local(_));
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        match self
            .store
            .put_opts(path, payload.clone(), PutOptions::from(mode))
            .await
        {
            Ok(_) => Ok(()),
            // The key exists: replace it (writing an existing key replaces it, atomically).
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::NotImplemented { .. }) => self
                .store
                .put_opts(path, payload, PutOptions::from(PutMode::Overwrite))
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
                    .put_opts(path, payload, PutOptions::from(PutMode::Overwrite))
                    .await
                    .map(drop)
                    .map_err(|e| store_error("put", key, e))
            }
            Err(e) => Err(store_error("put", key, e)),
        }
    }
}

impl StoreClient {
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
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use hicache_core::MemoryRegion;
    use hicache_core::raw::{AlignedBuf, RegionTable, Slice};
    use object_store::memory::InMemory;

    use super::*;

    /// A zero-copy put returns when the client has let go of the page's bytes, not when the
    /// response came: here the "client" (an in-memory store, which keeps the payload as the
    /// object) lets go 100 ms later, when the object is deleted, and only then do the pins
    /// end. A holder that never lets go is waited for up to the request timeout.
    #[tokio::test]
    async fn a_put_returns_once_the_client_dropped_the_bytes() {
        let regions = RegionTable::new("test");
        let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
        let memory = region.clone();
        let id = regions.insert(region);
        let slice = Slice {
            region: id,
            offset: 0,
            len: 4096,
        };
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut cfg = ObjConfig::s3("bucket", None);
        cfg.request_timeout = Duration::from_secs(10);
        let client = StoreClient {
            store: store.clone(),
            cfg,
        };
        let key = ObjectKey::new("page").unwrap();
        let path = Path::from("page");

        let releaser = {
            let (store, path) = (store.clone(), path.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                store.delete(&path).await.unwrap();
            })
        };
        let started = Instant::now();
        let parts = vec![regions.source(&slice).unwrap().into_host_bytes().unwrap()];
        client.put(&path, &key, parts).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(memory.in_flight(), 0, "a returned put still pins the page");
        releaser.await.unwrap();

        // Held past the timeout: the put returns at the timeout, the pin stays until the
        // holder lets go.
        let mut cfg = client.cfg.clone();
        cfg.request_timeout = Duration::from_millis(50);
        let client = StoreClient { store, cfg };
        let parts = vec![regions.source(&slice).unwrap().into_host_bytes().unwrap()];
        let started = Instant::now();
        client.put(&path, &key, parts).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(memory.in_flight(), 1);
        client.store.delete(&path).await.unwrap();
        assert_eq!(memory.in_flight(), 0);
    }
}
