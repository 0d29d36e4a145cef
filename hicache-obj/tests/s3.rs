//! OBJ against real servers: wrong credentials, a missing bucket, a server killed mid-batch.

use std::sync::Arc;

use hicache_core::raw::StorageBackend;
use hicache_core::{
    ConfigLoader, HiCache, HiCacheOptions, HostSlots, Layout, PluginRegistry, ReadOutcome,
    StorageIdentity,
};
use hicache_obj::{ObjBackend, ObjConfig, Target};
use hicache_testkit::fixtures::{fill_page, keys, mha, page_bytes, pool};
use hicache_testkit::s3::{ACCESS_KEY, S3Kind, S3Server, SECRET_KEY};

/// Starts a server, or explains why the test cannot run (fatal when CI requires servers).
fn server(kind: S3Kind) -> Option<S3Server> {
    match S3Server::start(kind) {
        Ok(s) => Some(s),
        Err(e) if hicache_testkit::s3::required() => panic!("{kind:?}: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn config(endpoint: &str, bucket: &str, secret: &str) -> hicache_core::Config {
    ConfigLoader::new()
        .set("plugin", "obj")
        .set("plugin.obj.bucket", bucket)
        .set("plugin.obj.endpoint", endpoint)
        .set("plugin.obj.access_key", ACCESS_KEY)
        .set("plugin.obj.secret_key", secret)
        .set("plugin.obj.retries", "0")
        .load()
        .unwrap()
}

fn registry() -> PluginRegistry {
    PluginRegistry::from_descriptors([&hicache_obj::DESCRIPTOR]).unwrap()
}

#[test]
fn a_wrong_secret_key_is_a_clear_auth_error() {
    let Some(s) = server(S3Kind::S3sFs) else {
        return;
    };
    s.create_bucket("hicache-test").unwrap();
    let err = registry()
        .select(&config(&s.endpoint(), "hicache-test", "not-the-secret"))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("OBJ was requested but is unusable"), "{msg}");
    assert!(
        msg.contains("403") && msg.contains("credentials were refused"),
        "{msg}"
    );
    assert!(!msg.contains("not-the-secret"), "the secret leaked: {msg}");
    // The right secret works.
    registry()
        .select(&config(&s.endpoint(), "hicache-test", SECRET_KEY))
        .unwrap();
}

#[test]
fn a_missing_bucket_is_explained() {
    let Some(s) = server(S3Kind::Moto) else {
        return;
    };
    let err = registry()
        .select(&config(&s.endpoint(), "no-such-bucket", SECRET_KEY))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("NoSuchBucket") && msg.contains("bucket does not exist"),
        "{msg}"
    );
    let empty = ConfigLoader::new().set("plugin", "obj").load().unwrap();
    let err = registry().select(&empty).unwrap_err().to_string();
    assert!(
        err.contains("needs a bucket") && err.contains("AWS_DEFAULT_BUCKET"),
        "{err}"
    );
}

#[test]
fn credentials_never_show_in_debug_or_config_show() {
    let cfg = config("http://127.0.0.1:1", "b", "top-secret-value");
    assert!(!format!("{cfg:?}").contains("top-secret-value"));
    assert!(!format!("{:?}", cfg.entries()).contains("top-secret-value"));
    let mut obj = ObjConfig::s3("b", Some("http://127.0.0.1:1".into()));
    if let Target::S3 {
        secret_key,
        access_key,
        ..
    } = &mut obj.target
    {
        *secret_key = Some("top-secret-value".into());
        *access_key = Some("AKIA-visible-id".into());
    }
    assert!(!format!("{obj:?}").contains("top-secret-value"));
    assert!(!format!("{obj:?}").contains("AKIA-visible-id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_batch_gives_per_item_errors_then_recovers() {
    let Some(mut s) = server(S3Kind::S3sFs) else {
        return;
    };
    s.create_bucket("hicache-test").unwrap();
    let mut cfg = ObjConfig::s3("hicache-test", Some(s.endpoint()));
    if let Target::S3 {
        access_key,
        secret_key,
        ..
    } = &mut cfg.target
    {
        *access_key = Some(ACCESS_KEY.into());
        *secret_key = Some(SECRET_KEY.into());
    }
    // One quick retry: a request on a pooled connection to the killed server fails once
    // after the restart, as it would in production.
    cfg.retries = 1;
    cfg.retry_backoff = std::time::Duration::from_millis(10);
    cfg.request_timeout = std::time::Duration::from_secs(5);
    cfg.max_concurrency = 4;
    let backend = Arc::new(ObjBackend::new(cfg).unwrap());
    let cache = HiCache::with_backend(
        backend.clone(),
        ConfigLoader::new().load().unwrap(),
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    let geometry = mha(Layout::PageFirst, 16, 256);
    let pool = pool(geometry);
    cache.register_pool(pool.clone()).unwrap();
    let ks = keys("kill", 128);
    let src: Vec<u64> = (0..128).collect();
    let data: Vec<Vec<u8>> = src
        .iter()
        .map(|p| fill_page(&pool, *p, *p as u32))
        .collect();
    // Kill the server while the batch is in flight.
    let cache = Arc::new(cache);
    let writer = {
        let (cache, ks, src) = (cache.clone(), ks.clone(), src.clone());
        tokio::spawn(async move { cache.batch_set(&ks, HostSlots::Pages(&src)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(40)).await;
    s.kill();
    let set = writer.await.unwrap().unwrap();
    assert_eq!(set.len(), 128, "one result per page");
    let failed = set.iter().filter(|r| r.is_err()).count();
    assert!(
        failed > 0,
        "the kill landed after the batch; nothing was tested"
    );
    // A dead server is a transport failure: each item says so, and says it may pass later.
    for r in set.iter().filter_map(|r| r.as_ref().err()) {
        assert!(r.to_string().contains("OBJ"), "{r}");
        assert!(r.is_retryable(), "{r:?}");
    }
    // Reads while the server is down are errors, not wrong data.
    let down = cache
        .batch_get(&ks[..4], HostSlots::Pages(&[200, 201, 202, 203]))
        .await
        .unwrap();
    assert!(
        down.iter()
            .all(|r| r.as_ref().is_err_and(|e| e.is_retryable())),
        "{down:?}"
    );
    // Back up: the failed pages can be written again and everything reads back exactly.
    s.restart().unwrap();
    let retry: Vec<usize> = (0..128).filter(|i| set[*i].is_err()).collect();
    let rk: Vec<_> = retry.iter().map(|i| ks[*i].clone()).collect();
    let rp: Vec<u64> = retry.iter().map(|i| *i as u64).collect();
    let again = cache.batch_set(&rk, HostSlots::Pages(&rp)).await.unwrap();
    assert!(
        again.iter().all(|r| r.is_ok()),
        "{:?}",
        again.iter().find(|r| r.is_err())
    );
    let dst: Vec<u64> = (128..256).collect();
    let got = cache.batch_get(&ks, HostSlots::Pages(&dst)).await.unwrap();
    assert!(
        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "{:?}",
        got.iter().find(|r| !matches!(r, Ok(ReadOutcome::Hit)))
    );
    for (i, d) in data.iter().enumerate() {
        assert_eq!(&page_bytes(&pool, 128 + i as u64), d, "page {i}");
    }
    assert_eq!(backend.info().name, "OBJ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_pages_upload_in_parts() {
    let Some(s) = server(S3Kind::Moto) else {
        return;
    };
    s.create_bucket("hicache-multipart").unwrap();
    let mut cfg = ObjConfig::s3("hicache-multipart", Some(s.endpoint()));
    if let Target::S3 {
        access_key,
        secret_key,
        ..
    } = &mut cfg.target
    {
        *access_key = Some(ACCESS_KEY.into());
        *secret_key = Some(SECRET_KEY.into());
    }
    // 7.5 MiB pages (plus the envelope) over a 6 MiB threshold: parts of 5 MiB and the rest.
    cfg.multipart_threshold = 6 << 20;
    cfg.part_size = 5 << 20;
    let backend = Arc::new(ObjBackend::new(cfg).unwrap());
    let cache = HiCache::with_backend(
        backend,
        ConfigLoader::new().load().unwrap(),
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap();
    let geometry = hicache_core::PoolGeometry::new(
        hicache_core::AttentionKind::Mha {
            kv_heads: 8,
            head_dim: 128,
        },
        24,
        hicache_core::Dtype::Bf16,
        80,
        Layout::PageFirst,
        4,
    )
    .unwrap();
    assert!(geometry.page_bytes() > 6 << 20);
    let pool = pool(geometry);
    cache.register_pool(pool.clone()).unwrap();
    let ks = keys("mp", 2);
    let data: Vec<Vec<u8>> = (0..2).map(|p| fill_page(&pool, p, 77 + p as u32)).collect();
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1]))
        .await
        .unwrap();
    assert!(
        set.iter().all(|r| r.is_ok()),
        "{:?}",
        set.iter().find(|r| r.is_err())
    );
    let got = cache
        .batch_get(&ks, HostSlots::Pages(&[2, 3]))
        .await
        .unwrap();
    assert!(
        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "{:?}",
        got
    );
    assert_eq!(page_bytes(&pool, 2), data[0]);
    assert_eq!(page_bytes(&pool, 3), data[1]);
}

/// The embedded stores keep their own copy: changing (or freeing) the host page after a
/// write never changes the stored object, and the write leaves no pin behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_stores_never_alias_registered_memory() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "memory://".to_string(),
        format!("file://{}", dir.path().display()),
    ] {
        let config = ConfigLoader::new()
            .set("plugin", "obj")
            .set("plugin.obj.url", url.as_str())
            .load()
            .unwrap();
        let cache = HiCache::open(
            &registry(),
            config,
            HiCacheOptions::new(StorageIdentity::single("alias")),
        )
        .unwrap();
        let geometry = mha(Layout::PageFirst, 16, 4);
        let pool = pool(geometry);
        cache.register_pool(pool.clone()).unwrap();
        let ks = keys("al", 1);
        let written = fill_page(&pool, 0, 1);
        let set = cache.batch_set(&ks, HostSlots::Pages(&[0])).await.unwrap();
        assert!(set[0].is_ok(), "{url}: {set:?}");
        let memory = hicache_core::HostPool::memory(pool.as_ref()).unwrap();
        assert_eq!(memory.in_flight(), 0, "{url}: pins left after the write");
        fill_page(&pool, 0, 2);
        let got = cache.batch_get(&ks, HostSlots::Pages(&[1])).await.unwrap();
        assert!(matches!(got[0], Ok(ReadOutcome::Hit)), "{url}: {got:?}");
        assert_eq!(
            page_bytes(&pool, 1),
            written,
            "{url}: the stored object changed"
        );
    }
}

/// Once a write to a server has returned, the HTTP client holds none of its (zero-copy)
/// buffers: the caller may overwrite the page at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_write_leaves_no_pin() {
    let Some(s) = server(S3Kind::Moto) else {
        return;
    };
    s.create_bucket("hicache-pins").unwrap();
    let cache = HiCache::open(
        &registry(),
        config(&s.endpoint(), "hicache-pins", SECRET_KEY),
        HiCacheOptions::new(StorageIdentity::single("pins")),
    )
    .unwrap();
    let geometry = mha(Layout::PageFirst, 16, 8);
    let pool = pool(geometry);
    cache.register_pool(pool.clone()).unwrap();
    let memory = hicache_core::HostPool::memory(pool.as_ref()).unwrap();
    let ks = keys("pn", 4);
    for p in 0..4 {
        fill_page(&pool, p, 10 + p as u32);
    }
    for round in 0..5 {
        let set = cache
            .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
            .await
            .unwrap();
        assert!(set.iter().all(|r| r.is_ok()), "{set:?}");
        assert_eq!(
            memory.in_flight(),
            0,
            "round {round}: pins after the write returned"
        );
    }
}
