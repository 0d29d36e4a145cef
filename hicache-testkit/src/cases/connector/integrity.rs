//! Stored bytes that were flipped, cut, moved, foreign or garbage read as misses, never
//! as data.

use std::sync::Arc;

use hicache_core::raw::{ObjectKey, ReadItem, WriteItem};
use hicache_core::{
    HiCache, HostSlots, Layout, MissReason, MmapPool, PageKey, ReadOutcome, StorageIdentity,
};

use crate::cases::backend::{block, buffer};
use crate::check::{CaseError, CaseResult, only};
use crate::fixtures::{fill_page, keys, mha};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{PAGES, all_written};

/// Reads an object's raw bytes through the backend (used to corrupt it portably).
pub(super) async fn raw_object(
    cache: &HiCache,
    env: &TrialEnv,
    name: &ObjectKey,
    len: u64,
) -> Result<Vec<u8>, CaseError> {
    let b = cache.backend();
    let buf = buffer(env, b, len.max(block(env)))?;
    let segs = [buf.slice(0, len)];
    let r = b
        .read(&[ReadItem {
            key: name,
            segments: &segs,
        }])
        .await;
    let r = only("read", r)?;
    ensure!(
        matches!(r, Ok(ReadOutcome::Hit)),
        "raw read of {name}: {r:?}"
    );
    buf.read(0, len)
}

async fn put_raw(cache: &HiCache, env: &TrialEnv, name: &ObjectKey, bytes: &[u8]) -> CaseResult {
    let b = cache.backend();
    let buf = buffer(env, b, (bytes.len() as u64).max(block(env)))?;
    buf.fill(0, bytes)?;
    let segs = [buf.slice(0, bytes.len() as u64)];
    let r = b
        .write(&[WriteItem {
            key: name,
            segments: &segs,
        }])
        .await;
    let r = only("write", r)?;
    ensure!(r.is_ok(), "raw write of {name}: {r:?}");
    Ok(())
}

/// Stored object size of a page under the default (envelope) format.
fn stored_len(cache: &HiCache) -> u64 {
    cache
        .pool_report()
        .map(|r| r.stored_bytes_per_page / r.objects_per_page)
        .unwrap_or(0)
}

async fn corruption_fixture(
    env: &TrialEnv,
) -> Result<(HiCache, Arc<MmapPool>, Vec<PageKey>), CaseError> {
    let cache = env.default_connector()?;
    let pool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    cache.register_pool(pool.clone())?;
    let ks = keys("cr", 2);
    fill_page(&pool, 0, 11);
    fill_page(&pool, 1, 12);
    ensure!(all_written(
        &cache.batch_set(&ks, HostSlots::Pages(&[0, 1])).await?
    ));
    Ok((cache, pool, ks))
}

/// A bit flipped in a stored payload reads as a checksum miss, never as data.
pub async fn connector_bit_flip_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let name = cache.object_names(&ks[0])?.remove(0);
    let len = stored_len(&cache);
    let mut bytes = raw_object(&cache, env, &name, len).await?;
    let at = bytes.len() - 777;
    bytes[at] ^= 0x20;
    put_raw(&cache, env, &name, &bytes).await?;
    let got = cache.batch_get(&ks, HostSlots::Pages(&[4, 5])).await?;
    ensure_eq!(
        got[0].as_ref().ok(),
        Some(&ReadOutcome::Miss(MissReason::ChecksumMismatch))
    );
    ensure!(matches!(got[1], Ok(ReadOutcome::Hit)));
    ensure_eq!(cache.stats().pages_invalid, 1);
    Ok(())
}

/// A truncated object reads as a size miss.
pub async fn connector_truncated_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let name = cache.object_names(&ks[0])?.remove(0);
    let len = stored_len(&cache);
    let bytes = raw_object(&cache, env, &name, len).await?;
    let cut = len - block(env);
    put_raw(&cache, env, &name, &bytes[..cut as usize]).await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure!(
        matches!(
            got[0],
            Ok(ReadOutcome::Miss(MissReason::SizeMismatch { .. }))
        ),
        "{got:?}"
    );
    Ok(())
}

/// Another key's object under this key's name is caught by the header.
pub async fn connector_misplaced_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let (n0, n1) = (
        cache.object_names(&ks[0])?.remove(0),
        cache.object_names(&ks[1])?.remove(0),
    );
    let len = stored_len(&cache);
    let other = raw_object(&cache, env, &n1, len).await?;
    put_raw(&cache, env, &n0, &other).await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure_eq!(
        got[0].as_ref().ok(),
        Some(&ReadOutcome::Miss(MissReason::KeyMismatch))
    );
    Ok(())
}

/// An object written by another namespace, copied under this namespace's name, is caught.
pub async fn connector_foreign_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let other = env.connector(StorageIdentity::single("another-model"), &[])?;
    let opool = env.pool(mha(Layout::PageFirst, 16, PAGES))?;
    other.register_pool(opool.clone())?;
    fill_page(&opool, 0, 99);
    ensure!(all_written(
        &other.batch_set(&ks[..1], HostSlots::Pages(&[0])).await?
    ));
    let foreign = raw_object(
        &other,
        env,
        &other.object_names(&ks[0])?.remove(0),
        stored_len(&other),
    )
    .await?;
    put_raw(
        &cache,
        env,
        &cache.object_names(&ks[0])?.remove(0),
        &foreign,
    )
    .await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure_eq!(
        got[0].as_ref().ok(),
        Some(&ReadOutcome::Miss(MissReason::ForeignNamespace))
    );
    Ok(())
}

/// Garbage of the right length (no header) is a bad-header miss.
pub async fn connector_garbage_object_is_a_miss(env: &TrialEnv) -> CaseResult {
    let (cache, _pool, ks) = corruption_fixture(env).await?;
    let name = cache.object_names(&ks[0])?.remove(0);
    let len = stored_len(&cache);
    put_raw(
        &cache,
        env,
        &name,
        &crate::fixtures::pattern(len as usize, 77),
    )
    .await?;
    let got = cache.batch_get(&ks[..1], HostSlots::Pages(&[4])).await?;
    ensure!(
        matches!(got[0], Ok(ReadOutcome::Miss(MissReason::BadHeader { .. }))),
        "{got:?}"
    );
    Ok(())
}
