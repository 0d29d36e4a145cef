//! The second S3 client behind the OBJ plugin: the AWS SDK (`aws-sdk-s3`), for users who need
//! SDK-specific behaviour. Enabled by the `aws-sdk` feature and `client = "aws-sdk"`.
//!
//! Credentials come from the config (or the AWS variables its parameters fall back to); the
//! SDK's own provider chain (profiles, instance metadata) would need `aws-config`, which this
//! crate does not pull in. Unlike the object_store client, a page's segments are copied into
//! one buffer per PUT: the SDK body wants one contiguous chunk.

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;

use hicache_core::raw::{HostBytes, ObjectKey, TargetSlice};
use hicache_core::{MissReason, ReadOutcome};
use object_store::path::Path;

use crate::client::{ObjectClient, Scatter};
use crate::config::{ObjConfig, Target};
use crate::errors::Failure;

/// An S3 client from the AWS SDK.
#[derive(Debug, Clone)]
pub(crate) struct SdkClient {
    client: aws_sdk_s3::Client,
    bucket: String,
}

/// What a failed request was.
#[derive(Debug)]
pub(crate) struct SdkFailure {
    /// HTTP status, when the server answered.
    pub(crate) status: Option<u16>,
    /// The SDK's message (code and text).
    pub(crate) message: String,
    /// No answer came in time (the SDK's timeout, or the connection timed out).
    pub(crate) timed_out: bool,
}

impl std::fmt::Display for SdkFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => write!(f, "HTTP {s}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for SdkFailure {}

/// Classifies an AWS SDK failure by HTTP status, or its absence (no answer).
fn classify_sdk(e: &SdkFailure) -> Failure {
    match e.status {
        Some(401 | 403) => Failure::Denied,
        Some(404) => Failure::NotFound,
        Some(500..=599) => Failure::Transient,
        Some(_) => Failure::Other,
        None if e.timed_out => Failure::Transient,
        None => Failure::Unreachable,
    }
}

/// An AWS SDK failure of `op` on `what` as a hicache error.
pub(crate) fn sdk_error(
    op: &str,
    what: &dyn std::fmt::Display,
    e: SdkFailure,
) -> hicache_core::Error {
    classify_sdk(&e).into_error(
        format!("{op} {what} (aws-sdk): {e}"),
        std::sync::Arc::new(e),
    )
}

fn failure<E: std::error::Error + 'static>(e: SdkError<E, HttpResponse>) -> SdkFailure {
    let status = e.raw_response().map(|r| r.status().as_u16());
    let message = format!("{}", aws_sdk_s3::error::DisplayErrorContext(&e));
    let timed_out = match &e {
        SdkError::TimeoutError(_) => true,
        SdkError::DispatchFailure(d) => d.is_timeout(),
        _ => false,
    };
    SdkFailure {
        status,
        message,
        timed_out,
    }
}

impl SdkClient {
    pub(crate) fn new(cfg: &ObjConfig) -> Result<Self, String> {
        let Target::S3 {
            bucket,
            endpoint,
            region,
            access_key,
            secret_key,
            session_token,
            virtual_hosted,
            ..
        } = &cfg.target
        else {
            return Err(
                "the aws-sdk client serves S3 targets only (not memory:// or file://)".into(),
            );
        };
        let mut b = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region.clone()))
            .force_path_style(!*virtual_hosted)
            // Pages carry their own checksum (the envelope); the SDK's flexible checksums would
            // hash every page twice more and store extra metadata server-side.
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            )
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            )
            .retry_config(
                aws_sdk_s3::config::retry::RetryConfig::standard()
                    .with_max_attempts(cfg.retries as u32 + 1)
                    .with_initial_backoff(cfg.retry_backoff),
            )
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .operation_attempt_timeout(cfg.request_timeout)
                    .build(),
            );
        if let Some(e) = endpoint {
            b = b.endpoint_url(e);
        }
        // The SDK's own HTTPS client, with ring as its rustls crypto (the SDK's default,
        // aws-lc-rs, is a large C build that this crate leaves out).
        b = b.http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                    aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                ))
                .build_https(),
        );
        match (access_key, secret_key) {
            (Some(a), Some(s)) => {
                b = b.credentials_provider(Credentials::new(a, s, session_token.clone(), None, "hicache-config"));
            }
            _ => return Err("the aws-sdk client needs access_key and secret_key (or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)".into()),
        }
        Ok(SdkClient {
            client: aws_sdk_s3::Client::from_conf(b.build()),
            bucket: bucket.clone(),
        })
    }

    /// PUT; with `create`, only when absent (returns false when the key exists).
    pub(crate) async fn put(
        &self,
        key: &str,
        body: Bytes,
        create: bool,
    ) -> Result<bool, SdkFailure> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(body));
        if create {
            req = req.if_none_match("*");
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = failure(e);
                if create && f.status == Some(412) {
                    Ok(false)
                } else {
                    Err(f)
                }
            }
        }
    }

    /// Multipart upload of `body` in parts of `part_size`.
    pub(crate) async fn put_multipart(
        &self,
        key: &str,
        body: Bytes,
        part_size: usize,
    ) -> Result<(), SdkFailure> {
        let upload = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(failure)?;
        let id = upload.upload_id().unwrap_or_default().to_string();
        let result = async {
            let mut parts = Vec::new();
            for (i, chunk) in body.chunks(part_size).enumerate() {
                let n = i as i32 + 1;
                let out = self
                    .client
                    .upload_part()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(&id)
                    .part_number(n)
                    .body(ByteStream::from(body.slice_ref(chunk)))
                    .send()
                    .await
                    .map_err(failure)?;
                parts.push(
                    CompletedPart::builder()
                        .part_number(n)
                        .set_e_tag(out.e_tag().map(str::to_string))
                        .build(),
                );
            }
            self.client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .map_err(failure)
                .map(drop)
        }
        .await;
        if result.is_err() {
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(&id)
                .send()
                .await;
        }
        result
    }

    /// GET: the object's size and body, or None when it does not exist.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<(u64, ByteStream)>, SdkFailure> {
        match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => {
                let size = out.content_length().unwrap_or(0).max(0) as u64;
                Ok(Some((size, out.body)))
            }
            Err(e) => {
                let no_such_key = e.as_service_error().is_some_and(|s| s.is_no_such_key());
                let f = failure(e);
                if f.status == Some(404) || no_such_key {
                    Ok(None)
                } else {
                    Err(f)
                }
            }
        }
    }

    /// HEAD.
    pub(crate) async fn exists(&self, key: &str) -> Result<bool, SdkFailure> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                let f = failure(e);
                if f.status == Some(404) {
                    Ok(false)
                } else {
                    Err(f)
                }
            }
        }
    }

    /// DELETE (a missing key is fine).
    pub(crate) async fn delete(&self, key: &str) -> Result<(), SdkFailure> {
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = failure(e);
                if f.status == Some(404) {
                    Ok(())
                } else {
                    Err(f)
                }
            }
        }
    }
}

/// The AWS SDK's client as the backend's [`ObjectClient`]: a put copies the object's
/// segments into one body (the SDK takes owned bytes).
#[derive(Debug)]
pub(crate) struct SdkObjects {
    sdk: SdkClient,
    cfg: ObjConfig,
}

impl SdkObjects {
    pub(crate) fn new(cfg: &ObjConfig) -> hicache_core::Result<Self> {
        Ok(SdkObjects {
            sdk: SdkClient::new(cfg)
                .map_err(|r| hicache_core::Error::invalid_config("client", crate::NAME, r))?,
            cfg: cfg.clone(),
        })
    }
}

#[async_trait::async_trait]
impl ObjectClient for SdkObjects {
    async fn put(
        &self,
        path: &Path,
        key: &ObjectKey,
        parts: Vec<HostBytes>,
    ) -> hicache_core::Result<()> {
        let total: usize = parts.iter().map(|p| p.as_ref().len()).sum();
        let mut body = Vec::with_capacity(total);
        for p in &parts {
            body.extend_from_slice(p.as_ref());
        }
        let body = Bytes::from(body);
        let name: &str = path.as_ref();
        if total as u64 > self.cfg.multipart_threshold {
            return self
                .sdk
                .put_multipart(name, body, self.cfg.part_size as usize)
                .await
                .map_err(|e| sdk_error("multipart put", key, e));
        }
        let create = self.cfg.conditional_create;
        let created = match self.sdk.put(name, body.clone(), create).await {
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
            self.sdk
                .put(name, body, false)
                .await
                .map_err(|e| sdk_error("put", key, e))?;
        }
        Ok(())
    }

    async fn get(
        &self,
        path: &Path,
        key: &ObjectKey,
        parts: &mut [TargetSlice],
        expected: u64,
    ) -> hicache_core::Result<ReadOutcome> {
        let Some((size, mut body)) = self
            .sdk
            .get(path.as_ref())
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
        while let Some(chunk) = body.try_next().await.map_err(|e| {
            hicache_core::Error::backend(crate::NAME, format!("get body {key}: {e}"))
        })? {
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

    async fn head(&self, path: &Path, key: &ObjectKey) -> hicache_core::Result<bool> {
        self.sdk
            .exists(path.as_ref())
            .await
            .map_err(|e| sdk_error("head", key, e))
    }

    async fn delete(&self, path: &Path, key: &ObjectKey) -> hicache_core::Result<()> {
        self.sdk
            .delete(path.as_ref())
            .await
            .map_err(|e| sdk_error("delete", key, e))
    }
}

#[cfg(test)]
mod tests {
    use super::SdkClient;
    use crate::config::{ObjConfig, Target};
    use crate::tls::FirstBytes;

    /// The SDK client built with ring speaks TLS to an https endpoint, and a server that
    /// answers garbage is an error, not a panic.
    #[test]
    fn https_requests_speak_tls_through_ring() {
        let server = FirstBytes::listen();
        let mut cfg = ObjConfig::s3("bucket", Some(server.endpoint()));
        if let Target::S3 {
            access_key,
            secret_key,
            ..
        } = &mut cfg.target
        {
            *access_key = Some("id".into());
            *secret_key = Some("secret".into());
        }
        cfg.retries = 0;
        cfg.request_timeout = std::time::Duration::from_secs(5);
        let client = SdkClient::new(&cfg).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(client.exists("page"));
        assert!(result.is_err(), "{result:?}");
        server.assert_client_hello();
    }
}
