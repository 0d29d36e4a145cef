//! The functional probe: the endpoint answers, the bucket exists, and the credentials allow a
//! put, get and delete of a probe object.

use bytes::Bytes;
use hicache_core::Verdict;
use hicache_core::raw::{PluginContext, Probe};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::backend::ObjBackend;
use crate::config::ObjConfig;
use crate::errors::{classify, describe};

/// What the OBJ probe hands to the plugin's build: the configuration it validated and
/// proved with a round trip.
#[derive(Clone, Debug)]
pub struct ObjFindings {
    /// The validated configuration.
    pub config: ObjConfig,
}

pub(crate) fn probe(ctx: &PluginContext<'_>) -> Probe {
    let cfg = match ObjConfig::from_context(ctx) {
        Ok(c) => c,
        Err(e) => return Probe::unusable(e.to_string(), "fix the [plugin.obj] parameters"),
    };
    let location = cfg.location();
    let client = match cfg.client {
        crate::config::ClientKind::ObjectStore => "object_store",
        crate::config::ClientKind::AwsSdk => "aws-sdk",
    };
    let findings = ObjFindings {
        config: cfg.clone(),
    };
    // A thread of its own: the probe may be called from inside an async runtime.
    let handle = std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                return Verdict::unusable(
                    format!("cannot start a runtime: {e}"),
                    "check thread limits",
                );
            }
        };
        rt.block_on(round_trip(cfg))
    });
    let verdict = handle
        .join()
        .unwrap_or_else(|_| Verdict::unusable("the probe panicked", "report a bug"));
    let usable = verdict.is_usable();
    let probe = Probe::from(verdict).fact(&location, "client", client);
    if usable {
        probe
            .fact(&location, "round trip", "put, get and delete ok")
            .with_findings(findings)
    } else {
        probe
    }
}

async fn round_trip(cfg: ObjConfig) -> Verdict {
    let location = cfg.location();
    let backend = match ObjBackend::new(cfg) {
        Ok(b) => b,
        Err(e) => return Verdict::unusable(e.to_string(), "fix the [plugin.obj] parameters"),
    };
    let store = backend.store();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!(".hicache-probe-{}-{nonce:x}", std::process::id());
    let path = if backend.config().key_prefix.is_empty() {
        Path::from(name)
    } else {
        Path::from(format!("{}/{name}", backend.config().key_prefix))
    };
    let data = Bytes::from(vec![0x5a_u8; 4096]);
    let fail = |step: &str, e: object_store::Error| {
        let text = describe(&e);
        let hint = if !classify(&e).hint().is_empty() {
            "see the hint in the reason".to_string()
        } else {
            format!("check that {location} exists and these credentials may {step} objects")
        };
        Verdict::unusable(
            format!("{step} of a probe object in {location} failed: {text}"),
            hint,
        )
    };
    if let Err(e) = store.put(&path, PutPayload::from(data.clone())).await {
        return fail("put", e);
    }
    match store.get(&path).await {
        Ok(r) => match r.bytes().await {
            Ok(b) if b == data => {}
            Ok(_) => {
                let _ = store.delete(&path).await;
                return Verdict::unusable(
                    format!("{location} returned other bytes than the probe wrote"),
                    "check the endpoint is the store you mean",
                );
            }
            Err(e) => return fail("get", e),
        },
        Err(e) => return fail("get", e),
    }
    if let Err(e) = store.delete(&path).await {
        return fail("delete", e);
    }
    Verdict::usable(format!(
        "{location}: put, get and delete of a probe object ok"
    ))
}
