//! OBJ plugin parameters: typed, strict, credentials redacted everywhere.

use std::fmt;
use std::time::Duration;

use hicache_core::Setting;
use hicache_core::raw::{ParamSpec, PluginContext};
use hicache_core::{Error, Result};

use crate::NAME;

hicache_core::plugin_params! {
    /// Parameters accepted in `[plugin.obj]` (NIXL's OBJ names are accepted as aliases).
    pub struct ObjParams {
        url: Str = "url"
            => "store URL instead of S3 settings: memory:// or file:///path (embedded use), s3://bucket[/prefix]";
        bucket: Str = "bucket" => "S3 bucket (required for S3)", env(&["AWS_DEFAULT_BUCKET"]);
        endpoint: Str = "endpoint" => "endpoint URL override, e.g. http://127.0.0.1:9000",
            env(&["AWS_ENDPOINT_URL"]);
        endpoint_override: Str = "endpoint_override" => "NIXL alias of endpoint";
        region: Str = "region" => "region",
            env(&["AWS_REGION", "AWS_DEFAULT_REGION"]), default("us-east-1");
        scheme: OneOf["http", "https"] = "scheme"
            => "scheme when the endpoint has none; http allows plain HTTP";
        allow_http: Bool = "allow_http"
            => "allow plain-HTTP endpoints",
            default("true when the endpoint or scheme is http");
        access_key: Str = "access_key" => "access key id", secret, env(&["AWS_ACCESS_KEY_ID"]);
        secret_key: Str = "secret_key" => "secret access key", secret,
            env(&["AWS_SECRET_ACCESS_KEY"]);
        secrete_key: Str = "secrete_key" => "NIXL's spelling of secret_key", secret;
        session_token: Str = "session_token" => "session token", secret,
            env(&["AWS_SESSION_TOKEN"]);
        anonymous: Bool = "anonymous"
            => "send unsigned requests, for public buckets (object_store client only)",
            default("false");
        virtual_hosted: Bool = "virtual_hosted"
            => "virtual-hosted-style requests (false: path style)", default("false");
        use_virtual_addressing: Bool = "use_virtual_addressing" => "NIXL alias of virtual_hosted";
        request_timeout_ms: UInt = "request_timeout_ms" => "per-request timeout, ms", default("30000");
        retries: UInt = "retries" => "retries of a failed request, with backoff", default("3");
        retry_backoff_ms: UInt = "retry_backoff_ms" => "first retry backoff, ms, doubling",
            default("100");
        max_concurrency: UInt = "max_concurrency" => "requests in flight per batch", default("32");
        num_threads: UInt = "num_threads" => "NIXL alias of max_concurrency";
        multipart_threshold: UInt = "multipart_threshold"
            => "objects above this many bytes upload in parts", default("64 MiB");
        part_size: UInt = "part_size"
            => "bytes per multipart part (S3 wants >= 5 MiB)", default("16 MiB");
        key_prefix: Str = "key_prefix" => "prefix (namespace) of every object key";
        conditional_create: Bool = "conditional_create"
            => "create objects with If-None-Match: *", default("true");
        client: OneOf["object_store", "aws-sdk"] = "client"
            => "S3 client: object_store or aws-sdk (needs the `aws-sdk` feature)",
            default("object_store");
        throughput_target_gbps: Float = "throughput_target_gbps"
            => "NIXL/AWS-CRT tuning; accepted and ignored (no CRT client here)";
        crt_min_limit: UInt = "crtMinLimit"
            => "NIXL/AWS-CRT tuning; accepted and ignored (no CRT client here)";
    }
}

/// Parameters accepted in `[plugin.obj]` (NIXL's OBJ names are accepted as aliases).
pub const PARAMS: &[ParamSpec] = ObjParams::SPECS;

/// Which S3 client talks to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    /// The `object_store` crate (default; no copy on PUT).
    ObjectStore,
    /// The AWS SDK (`aws-sdk` feature).
    AwsSdk,
}

/// Where objects go.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// An S3-compatible service.
    S3 {
        /// Bucket.
        bucket: String,
        /// Endpoint override.
        endpoint: Option<String>,
        /// Region.
        region: String,
        /// Plain HTTP allowed.
        allow_http: bool,
        /// Credentials (None: anonymous / environment chain of object_store).
        access_key: Option<String>,
        /// Secret.
        secret_key: Option<String>,
        /// Session token.
        session_token: Option<String>,
        /// Virtual-hosted style.
        virtual_hosted: bool,
    },
    /// In-process memory (`memory://`).
    Memory,
    /// A local directory (`file:///path`).
    Local(std::path::PathBuf),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::S3 {
                bucket,
                endpoint,
                region,
                allow_http,
                access_key,
                secret_key,
                session_token,
                virtual_hosted,
            } => f
                .debug_struct("S3")
                .field("bucket", bucket)
                .field("endpoint", endpoint)
                .field("region", region)
                .field("allow_http", allow_http)
                .field("access_key", &access_key.as_ref().map(|_| "***"))
                .field("secret_key", &secret_key.as_ref().map(|_| "***"))
                .field("session_token", &session_token.as_ref().map(|_| "***"))
                .field("virtual_hosted", virtual_hosted)
                .finish(),
            Target::Memory => f.write_str("Memory"),
            Target::Local(p) => f.debug_tuple("Local").field(p).finish(),
        }
    }
}

/// The validated configuration of one OBJ backend. `Debug` never shows credentials.
#[derive(Clone, Debug)]
pub struct ObjConfig {
    /// Where objects go.
    pub target: Target,
    /// Key prefix.
    pub key_prefix: String,
    /// Request timeout.
    pub request_timeout: Duration,
    /// Retries per request.
    pub retries: usize,
    /// First backoff.
    pub retry_backoff: Duration,
    /// Requests in flight per batch.
    pub max_concurrency: usize,
    /// Multipart above this many bytes.
    pub multipart_threshold: u64,
    /// Part size.
    pub part_size: u64,
    /// Use If-None-Match: * on create.
    pub conditional_create: bool,
    /// Unsigned requests.
    pub anonymous: bool,
    /// Which client.
    pub client: ClientKind,
}

impl ObjConfig {
    /// An S3 config with defaults.
    pub fn s3(bucket: impl Into<String>, endpoint: Option<String>) -> Self {
        let endpoint_is_http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        ObjConfig {
            target: Target::S3 {
                bucket: bucket.into(),
                endpoint,
                region: "us-east-1".into(),
                allow_http: endpoint_is_http,
                access_key: None,
                secret_key: None,
                session_token: None,
                virtual_hosted: false,
            },
            key_prefix: String::new(),
            request_timeout: Duration::from_secs(30),
            retries: 3,
            retry_backoff: Duration::from_millis(100),
            max_concurrency: 32,
            multipart_threshold: 64 << 20,
            part_size: 16 << 20,
            conditional_create: true,
            anonymous: false,
            client: ClientKind::ObjectStore,
        }
    }

    /// Reads the plugin context.
    pub fn from_context(ctx: &PluginContext<'_>) -> Result<Self> {
        let p = ObjParams::from_params(ctx.params);
        let invalid =
            |key: &str, source: String, reason: String| Error::invalid_config(key, source, reason);
        for (name, given) in [
            ("throughput_target_gbps", p.throughput_target_gbps.is_some()),
            ("crtMinLimit", p.crt_min_limit.is_some()),
        ] {
            if given {
                tracing::warn!(
                    param = name,
                    "tunes NIXL's AWS CRT client, which hicache does not use; ignored"
                );
            }
        }
        let text = |s: &Option<Setting<String>>| s.as_ref().map(|s| s.value.clone());
        let flag = |s: &Option<Setting<bool>>| s.as_ref().map(|s| s.value);
        let mut cfg = match &p.url {
            Some(url) => {
                from_url(&url.value).map_err(|r| invalid("url", url.source.to_string(), r))?
            }
            None => {
                let bucket = text(&p.bucket).unwrap_or_default();
                if bucket.is_empty() {
                    return Err(Error::InvalidConfig {
                        key: "bucket".into(),
                        source_desc: source_or(&p.bucket, "not set"),
                        reason: "the OBJ plugin needs a bucket".into(),
                        hint: Some("set [plugin.obj] bucket = \"...\" or AWS_DEFAULT_BUCKET, or url = \"memory://\" for an in-process store".into()),
                    });
                }
                let mut endpoint = text(&p.endpoint).or(text(&p.endpoint_override));
                if let (Some(e), Some(s)) = (&endpoint, text(&p.scheme))
                    && !e.contains("://")
                {
                    endpoint = Some(format!("{s}://{e}"));
                }
                ObjConfig::s3(bucket, endpoint)
            }
        };
        if let Target::S3 {
            region,
            allow_http,
            access_key,
            secret_key,
            session_token,
            virtual_hosted,
            endpoint,
            ..
        } = &mut cfg.target
        {
            if let Some(r) = text(&p.region) {
                *region = r;
            }
            let http_endpoint = endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://"));
            *allow_http = flag(&p.allow_http)
                .unwrap_or(http_endpoint || text(&p.scheme).as_deref() == Some("http"));
            if http_endpoint && !*allow_http {
                return Err(invalid(
                    "allow_http",
                    source_or(&p.allow_http, NAME),
                    "the endpoint is plain HTTP but allow_http is false".into(),
                ));
            }
            *access_key = text(&p.access_key);
            *secret_key = text(&p.secret_key).or(text(&p.secrete_key));
            *session_token = text(&p.session_token);
            if access_key.is_some() != secret_key.is_some() {
                return Err(invalid(
                    "access_key/secret_key",
                    source_or(&p.access_key, NAME),
                    "give both the access key and the secret key, or neither".into(),
                ));
            }
            *virtual_hosted = flag(&p.virtual_hosted)
                .or(flag(&p.use_virtual_addressing))
                .unwrap_or(false);
        }
        if let Some(prefix) = &p.key_prefix {
            if prefix.value.contains("..") || prefix.value.starts_with('/') {
                return Err(invalid(
                    "key_prefix",
                    prefix.source.to_string(),
                    format!("`{}` must be relative and contain no `..`", prefix.value),
                ));
            }
            cfg.key_prefix = prefix.value.trim_end_matches('/').to_string();
        }
        if let Some(ms) = &p.request_timeout_ms {
            cfg.request_timeout = Duration::from_millis(ms.value.max(1));
        }
        if let Some(n) = &p.retries {
            cfg.retries = n.value as usize;
        }
        if let Some(ms) = &p.retry_backoff_ms {
            cfg.retry_backoff = Duration::from_millis(ms.value.max(1));
        }
        if let Some(n) = p.max_concurrency.as_ref().or(p.num_threads.as_ref()) {
            if n.value == 0 || n.value > 4096 {
                return Err(invalid(
                    "max_concurrency",
                    n.source.to_string(),
                    format!("{} is outside 1..=4096", n.value),
                ));
            }
            cfg.max_concurrency = n.value as usize;
        }
        if let Some(n) = &p.multipart_threshold {
            cfg.multipart_threshold = n.value;
        }
        if let Some(n) = &p.part_size {
            if n.value < 5 << 20 {
                return Err(invalid(
                    "part_size",
                    n.source.to_string(),
                    format!("{} bytes is below S3's 5 MiB minimum part size", n.value),
                ));
            }
            cfg.part_size = n.value;
        }
        if let Some(b) = flag(&p.conditional_create) {
            cfg.conditional_create = b;
        }
        cfg.anonymous = flag(&p.anonymous).unwrap_or(false);
        if text(&p.client).as_deref() == Some("aws-sdk") {
            cfg.client = ClientKind::AwsSdk;
            if cfg.anonymous {
                return Err(Error::InvalidConfig {
                    key: "anonymous".into(),
                    source_desc: source_or(&p.anonymous, NAME),
                    reason: "the aws-sdk client signs every request".into(),
                    hint: Some(
                        "use client = \"object_store\" for unsigned requests, or give credentials"
                            .into(),
                    ),
                });
            }
        }
        Ok(cfg)
    }

    /// Where the objects go, for humans (no credentials).
    pub fn location(&self) -> String {
        let base = match &self.target {
            Target::S3 {
                bucket, endpoint, ..
            } => match endpoint {
                Some(e) => format!("s3://{bucket} at {e}"),
                None => format!("s3://{bucket}"),
            },
            Target::Memory => "memory://".into(),
            Target::Local(p) => format!("file://{}", p.display()),
        };
        if self.key_prefix.is_empty() {
            base
        } else {
            format!("{base}/{}", self.key_prefix)
        }
    }
}

fn from_url(url: &str) -> std::result::Result<ObjConfig, String> {
    let mut cfg = ObjConfig::s3(String::new(), None);
    if url == "memory://" || url == "memory:///" {
        cfg.target = Target::Memory;
    } else if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(format!("`{url}` needs an absolute path (file:///dir)"));
        }
        cfg.target = Target::Local(path.into());
    } else if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!("`{url}` names no bucket"));
        }
        cfg = ObjConfig::s3(bucket, None);
        cfg.key_prefix = prefix.trim_end_matches('/').to_string();
    } else {
        return Err(format!(
            "`{url}` is not memory://, file:///path or s3://bucket[/prefix]"
        ));
    }
    Ok(cfg)
}

/// Where a parameter came from, or `otherwise` when it was not given.
fn source_or<T>(given: &Option<Setting<T>>, otherwise: &str) -> String {
    given
        .as_ref()
        .map(|s| s.source.to_string())
        .unwrap_or_else(|| otherwise.into())
}
