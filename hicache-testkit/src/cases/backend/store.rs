//! What a store answers beyond one call: usage, persistence across instances, device
//! memory, and names at the edge of what is valid.

use std::sync::Arc;

use hicache_core::raw::{AlignedBuf, ObjectKey};
use hicache_core::{MemKind, MemoryRegion, ReadOutcome};

use crate::check::{CaseResult, skip};
use crate::fixtures::pattern;
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{block, buffer, get, key, put};

/// `usage` tells the truth as far as it reports: the bytes used cover an object just
/// written, and used and available bytes fit in the total. A plugin that reports no figure
/// at all (object stores have no capacity) is skipped, not passed.
pub async fn backend_usage(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, 4 * n)?;
    buf.fill(0, &pattern(4 * n as usize, 42))?;
    put(&b, &key(env, "usage"), &[buf.slice(0, 4 * n)]).await?;
    let u = b.usage().await?;
    if u.total_bytes.is_none() && u.used_bytes.is_none() && u.available_bytes.is_none() {
        return skip("the plugin reports no usage figures");
    }
    if let Some(used) = u.used_bytes {
        ensure!(
            used >= 4 * n,
            "{used} bytes used with a {}-byte object stored",
            4 * n
        );
    }
    if let Some(total) = u.total_bytes {
        let used = u.used_bytes.unwrap_or(0);
        let avail = u.available_bytes.unwrap_or(0);
        ensure!(
            used.checked_add(avail).is_some_and(|sum| sum <= total),
            "used {used} + available {avail} > total {total}"
        );
    }
    Ok(())
}

/// `list` pages through exactly the objects under a prefix, each once with its size, and
/// forgets removed ones. A plugin that cannot list (the trait's default) is skipped.
pub async fn backend_list_pages_through_every_object(env: &TrialEnv) -> CaseResult {
    use hicache_core::Error;
    use hicache_core::raw::list_all;
    let b = env.backend()?;
    let n = block(env);
    match b.list(env.namespace(), None, 1).await {
        Err(Error::Unsupported { .. }) => return skip("the plugin does not list objects"),
        other => drop(other?),
    }
    let buf = buffer(env, &b, 3 * n)?;
    buf.fill(0, &pattern(3 * n as usize, 7))?;
    let mut want = std::collections::BTreeMap::new();
    for i in 0..7u64 {
        let k = key(env, &format!("list-a-{i}"));
        let len = n * (1 + i % 3);
        put(&b, &k, &[buf.slice(0, len)]).await?;
        want.insert(k.as_str().to_string(), len);
    }
    for i in 0..2u64 {
        put(&b, &key(env, &format!("list-b-{i}")), &[buf.slice(0, n)]).await?;
    }
    let prefix = key(env, "list-a-");
    let listed = list_all(b.as_ref(), prefix.as_str(), 3).await?;
    let mut got = std::collections::BTreeMap::new();
    for l in &listed {
        ensure!(
            got.insert(l.key.as_str().to_string(), l.size).is_none(),
            "{} listed twice",
            l.key
        );
    }
    ensure_eq!(got, want, "a listing of 7 objects in pages of 3");
    let other = list_all(b.as_ref(), key(env, "list-b-").as_str(), 100).await?;
    ensure_eq!(other.len(), 2, "objects under the other prefix");
    let gone = key(env, "list-a-3");
    let r = b.remove(std::slice::from_ref(&gone)).await;
    ensure!(r.iter().all(|r| r.is_ok()), "{r:?}");
    // A cursor this backend never made is an error or an empty page, never a panic.
    for garbage in ["", "../..", "0/zz/\u{7f}", "\u{0}"] {
        let foreign = hicache_core::raw::ListCursor(garbage.into());
        match b.list(prefix.as_str(), Some(&foreign), 3).await {
            Ok(_) | Err(Error::InvalidBatch { .. }) => {}
            Err(e) => {
                return Err(crate::check::CaseError::Failed(format!(
                    "a foreign cursor {garbage:?} gave {e:?}, not a page or InvalidBatch"
                )));
            }
        }
    }
    let after = list_all(b.as_ref(), prefix.as_str(), 3).await?;
    ensure_eq!(after.len(), 6, "objects listed after one was removed");
    ensure!(
        after.iter().all(|l| l.key != gone),
        "a removed object is still listed"
    );
    Ok(())
}

/// Device memory is refused by a plugin that cannot move it, with a typed error.
pub async fn backend_device_memory_rejected(env: &TrialEnv) -> CaseResult {
    if env.capability().device_memory {
        return skip("the plugin accepts device memory");
    }
    let b = env.backend()?;
    let mut host = AlignedBuf::zeroed(4096, 4096)?;
    let addr = host.as_mut_ptr();
    // SAFETY: the region owns the buffer (nothing else reaches its bytes) and is never used
    // for a transfer: registration must fail first.
    let region = unsafe {
        MemoryRegion::with_owner(addr, 4096, MemKind::Device { device: 0 }, Arc::new(host))
    };
    ensure!(
        b.register(region).is_err(),
        "device memory was accepted by a host-only plugin"
    );
    Ok(())
}

/// Objects survive a new backend instance over the same storage.
pub async fn backend_persists_across_instances(env: &TrialEnv) -> CaseResult {
    if !env.capability().persistent {
        return skip("the plugin does not persist data across instances");
    }
    let n = block(env);
    let k = key(env, "persist");
    let data = pattern(n as usize, 40);
    {
        let b = env.backend()?;
        let buf = buffer(env, &b, n)?;
        buf.fill(0, &data)?;
        put(&b, &k, &[buf.slice(0, n)]).await?;
    }
    let b2 = env.backend()?;
    let buf = buffer(env, &b2, n)?;
    ensure_eq!(get(&b2, &k, &[buf.slice(0, n)]).await?, ReadOutcome::Hit);
    ensure_eq!(buf.read(0, n)?, data);
    Ok(())
}

/// Names with every allowed kind of character, and the longest allowed names (two that
/// differ only in their last byte): each holds its own bytes, so a plugin that maps several
/// names onto one object (by hashing, truncating or dropping a part) fails.
pub async fn backend_unusual_but_valid_names(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let max = hicache_core::raw::MAX_OBJECT_KEY_LEN;
    let limit = env.name_limit().map_or(max, |l| l.min(max));
    let long = |last: char| {
        format!(
            "{}-{}{last}",
            env.namespace(),
            "L".repeat(limit - env.namespace().len() - 2)
        )
    };
    let names = [
        format!("{}-a_b-c:d=e+f@g", env.namespace()),
        format!("{}-ü€", env.namespace()),
        format!("{}-x.y.z", env.namespace()),
        long('a'),
        long('b'),
    ];
    let src = buffer(env, &b, names.len() as u64 * n)?;
    let dst = buffer(env, &b, names.len() as u64 * n)?;
    for (i, name) in names.iter().enumerate() {
        let at = i as u64 * n;
        src.fill(at, &pattern(n as usize, 41 + i as u32))?;
        put(&b, &ObjectKey::new(name.clone())?, &[src.slice(at, n)]).await?;
    }
    for (i, name) in names.iter().enumerate() {
        let at = i as u64 * n;
        let k = ObjectKey::new(name.clone())?;
        ensure_eq!(
            get(&b, &k, &[dst.slice(at, n)]).await?,
            ReadOutcome::Hit,
            "name {name:?}"
        );
        ensure!(
            dst.read(at, n)? == src.read(at, n)?,
            "name {name:?} holds another name's bytes"
        );
    }
    Ok(())
}

/// Names that would escape a storage root cannot even be formed.
pub async fn backend_path_escapes_are_unrepresentable(_env: &TrialEnv) -> CaseResult {
    for bad in [
        "../etc/passwd",
        "a/b",
        "..",
        ".",
        "/abs",
        "nul\0byte",
        "new\nline",
        "back\\slash",
        ".hidden",
    ] {
        ensure!(
            ObjectKey::new(bad).is_err(),
            "{bad:?} was accepted as an object name"
        );
        ensure!(
            hicache_core::PageKey::new(bad).is_err(),
            "{bad:?} was accepted as a page key"
        );
    }
    Ok(())
}
