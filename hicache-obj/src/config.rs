//! OBJ plugin parameters: typed, strict, credentials redacted everywhere.

use std::fmt;
use std::time::Duration;

use hicache_core::{Error, ParamKind, ParamSpec, PluginContext, Result};

use crate::NAME;

/// Parameters accepted in `[plugin.obj]` (NIXL's OBJ names are accepted as aliases).
pub const PARAMS: &[ParamSpec] = &[
    ParamSpec::new(
        "url",
        ParamKind::Str,
        "store URL instead of S3 settings: memory:// or file:///path (embedded use), s3://bucket[/prefix]",
    ),
    ParamSpec::new("bucket", ParamKind::Str, "S3 bucket (required for S3)")
        .env(&["AWS_DEFAULT_BUCKET"]),
    ParamSpec::new(
        "endpoint",
        ParamKind::Str,
        "endpoint URL override, e.g. http://127.0.0.1:9000",
    )
    .env(&["AWS_ENDPOINT_URL"]),
    ParamSpec::new(
        "endpoint_override",
        ParamKind::Str,
        "NIXL alias of endpoint",
    ),
    ParamSpec::new("region", ParamKind::Str, "region (default us-east-1)")
        .env(&["AWS_REGION", "AWS_DEFAULT_REGION"]),
    ParamSpec::new(
        "scheme",
        ParamKind::OneOf(&["http", "https"]),
        "scheme when the endpoint has none; http allows plain HTTP",
    ),
    ParamSpec::new(
        "allow_http",
        ParamKind::Bool,
        "allow plain-HTTP endpoints (default: true when the endpoint or scheme is http)",
    ),
    ParamSpec::new("access_key", ParamKind::Str, "access key id")
        .secret()
        .env(&["AWS_ACCESS_KEY_ID"]),
    ParamSpec::new("secret_key", ParamKind::Str, "secret access key")
        .secret()
        .env(&["AWS_SECRET_ACCESS_KEY"]),
    ParamSpec::new(
        "secrete_key",
        ParamKind::Str,
        "NIXL's spelling of secret_key",
    )
    .secret(),
    ParamSpec::new("session_token", ParamKind::Str, "session token")
        .secret()
        .env(&["AWS_SESSION_TOKEN"]),
    ParamSpec::new(
        "virtual_hosted",
        ParamKind::Bool,
        "virtual-hosted-style requests (default false: path style)",
    ),
    ParamSpec::new(
        "use_virtual_addressing",
        ParamKind::Bool,
        "NIXL alias of virtual_hosted",
    ),
    ParamSpec::new(
        "request_timeout_ms",
        ParamKind::UInt,
        "per-request timeout (default 30000)",
    ),
    ParamSpec::new(
        "retries",
        ParamKind::UInt,
        "retries of a failed request, with backoff (default 3)",
    ),
    ParamSpec::new(
        "retry_backoff_ms",
        ParamKind::UInt,
        "first retry backoff, doubling (default 100)",
    ),
    ParamSpec::new(
        "max_concurrency",
        ParamKind::UInt,
        "requests in flight per batch (default 32)",
    ),
    ParamSpec::new(
        "num_threads",
        ParamKind::UInt,
        "NIXL alias of max_concurrency",
    ),
    ParamSpec::new(
        "multipart_threshold",
        ParamKind::UInt,
        "objects above this many bytes upload in parts (default 64 MiB)",
    ),
    ParamSpec::new(
        "part_size",
        ParamKind::UInt,
        "bytes per multipart part (default 16 MiB; S3 wants >= 5 MiB)",
    ),
    ParamSpec::new(
        "key_prefix",
        ParamKind::Str,
        "prefix (namespace) of every object key",
    ),
    ParamSpec::new(
        "conditional_create",
        ParamKind::Bool,
        "create objects with If-None-Match: * (default true)",
    ),
    ParamSpec::new(
        "throughput_target_gbps",
        ParamKind::Float,
        "NIXL/AWS-CRT tuning; accepted and ignored (no CRT client here)",
    ),
    ParamSpec::new(
        "crtMinLimit",
        ParamKind::UInt,
        "NIXL/AWS-CRT tuning; accepted and ignored (no CRT client here)",
    ),
];

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
        let p = ctx.params;
        let invalid = |key: &str, reason: String| {
            Error::invalid_config(
                key,
                p.source(key)
                    .map(ToString::to_string)
                    .unwrap_or_else(|| NAME.into()),
                reason,
            )
        };
        for ignored in ["throughput_target_gbps", "crtMinLimit"] {
            if p.source(ignored).is_some() {
                tracing::warn!(
                    param = ignored,
                    "tunes NIXL's AWS CRT client, which hicache does not use; ignored"
                );
            }
        }
        let mut cfg = match p.str("url") {
            Some(url) => from_url(url).map_err(|r| invalid("url", r))?,
            None => {
                let bucket = p.str("bucket").unwrap_or_default().to_string();
                if bucket.is_empty() {
                    return Err(Error::InvalidConfig {
                        key: "bucket".into(),
                        source_desc: p.source("bucket").map(ToString::to_string).unwrap_or_else(|| "not set".into()),
                        reason: "the OBJ plugin needs a bucket".into(),
                        hint: Some("set [plugin.obj] bucket = \"...\" or AWS_DEFAULT_BUCKET, or url = \"memory://\" for an in-process store".into()),
                    });
                }
                let mut endpoint = p
                    .str("endpoint")
                    .or(p.str("endpoint_override"))
                    .map(str::to_string);
                let scheme = p.str("scheme");
                if let (Some(e), Some(s)) = (&endpoint, scheme)
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
            if let Some(r) = p.str("region") {
                *region = r.to_string();
            }
            let http_endpoint = endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://"));
            *allow_http = p
                .bool("allow_http")
                .unwrap_or(http_endpoint || p.str("scheme") == Some("http"));
            if http_endpoint && !*allow_http {
                return Err(invalid(
                    "allow_http",
                    "the endpoint is plain HTTP but allow_http is false".into(),
                ));
            }
            *access_key = p.str("access_key").map(str::to_string);
            *secret_key = p
                .str("secret_key")
                .or(p.str("secrete_key"))
                .map(str::to_string);
            *session_token = p.str("session_token").map(str::to_string);
            if access_key.is_some() != secret_key.is_some() {
                return Err(invalid(
                    "access_key/secret_key",
                    "give both the access key and the secret key, or neither".into(),
                ));
            }
            *virtual_hosted = p
                .bool("virtual_hosted")
                .or(p.bool("use_virtual_addressing"))
                .unwrap_or(false);
        }
        if let Some(prefix) = p.str("key_prefix") {
            if prefix.contains("..") || prefix.starts_with('/') {
                return Err(invalid(
                    "key_prefix",
                    format!("`{prefix}` must be relative and contain no `..`"),
                ));
            }
            cfg.key_prefix = prefix.trim_end_matches('/').to_string();
        }
        if let Some(ms) = p.uint("request_timeout_ms") {
            cfg.request_timeout = Duration::from_millis(ms.max(1));
        }
        if let Some(n) = p.uint("retries") {
            cfg.retries = n as usize;
        }
        if let Some(ms) = p.uint("retry_backoff_ms") {
            cfg.retry_backoff = Duration::from_millis(ms.max(1));
        }
        if let Some(n) = p.uint("max_concurrency").or(p.uint("num_threads")) {
            if n == 0 || n > 4096 {
                return Err(invalid(
                    "max_concurrency",
                    format!("{n} is outside 1..=4096"),
                ));
            }
            cfg.max_concurrency = n as usize;
        }
        if let Some(n) = p.uint("multipart_threshold") {
            cfg.multipart_threshold = n;
        }
        if let Some(n) = p.uint("part_size") {
            if n < 5 << 20 {
                return Err(invalid(
                    "part_size",
                    format!("{n} bytes is below S3's 5 MiB minimum part size"),
                ));
            }
            cfg.part_size = n;
        }
        if let Some(b) = p.bool("conditional_create") {
            cfg.conditional_create = b;
        }
        cfg.anonymous = p.bool("anonymous").unwrap_or(false);
        if p.str("client") == Some("aws-sdk") {
            cfg.client = ClientKind::AwsSdk;
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
