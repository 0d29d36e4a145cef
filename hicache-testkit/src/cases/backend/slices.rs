//! Memory a backend must refuse: unknown, out-of-range, deregistered and misaligned slices,
//! each failing only its own item.

use hicache_core::Error;
use hicache_core::raw::{ReadItem, RegionId, Slice, WriteItem};

use crate::check::{CaseResult, only, per_item, skip};
use crate::fixtures::pattern;
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{block, buffer, key, write_then_read};

/// A slice of an unknown region is a typed error naming it.
pub async fn backend_unregistered_region_rejected(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let k = key(env, "unreg");
    let segs = [Slice::new(RegionId(u64::MAX - 7), 0, n)];
    let r = b
        .write(&[WriteItem {
            key: &k,
            segments: &segs,
        }])
        .await;
    let r = only("the call", r)?;
    ensure!(
        matches!(r, Err(Error::UnregisteredRegion { .. })),
        "got {r:?}"
    );
    let r = b
        .read(&[ReadItem {
            key: &k,
            segments: &segs,
        }])
        .await;
    let r = only("the call", r)?;
    ensure!(
        matches!(r, Err(Error::UnregisteredRegion { .. })),
        "got {r:?}"
    );
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
        Some(false)
    );
    Ok(())
}

/// A slice past the end of its region is a typed error with offset and length.
pub async fn backend_out_of_range_slice_rejected(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, 2 * n)?;
    let k = key(env, "oor");
    for s in [
        buf.slice(n, 2 * n),
        buf.slice(3 * n, n),
        buf.slice(u64::MAX - n + 1, n),
    ] {
        let (w, r) = write_then_read(&b, &k, &[s]).await?;
        ensure!(
            matches!(w, Err(Error::SliceOutOfRange { .. })),
            "write {s:?} gave {w:?}"
        );
        ensure!(
            matches!(r, Err(Error::SliceOutOfRange { .. })),
            "read {s:?} gave {r:?}"
        );
    }
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
        Some(false)
    );
    Ok(())
}

/// After `deregister`, the region is unknown.
pub async fn backend_deregistered_region_rejected(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, n)?;
    b.deregister(buf.id)?;
    ensure!(b.deregister(buf.id).is_err(), "second deregister succeeded");
    let k = key(env, "dereg");
    let segs = [buf.slice(0, n)];
    let r = b
        .write(&[WriteItem {
            key: &k,
            segments: &segs,
        }])
        .await;
    let r = only("the call", r)?;
    ensure!(
        matches!(r, Err(Error::UnregisteredRegion { .. })),
        "got {r:?}"
    );
    Ok(())
}

/// Under direct I/O, misaligned addresses and lengths fail before I/O.
pub async fn backend_misaligned_slice_rejected(env: &TrialEnv) -> CaseResult {
    let cap = *env.capability();
    if !cap.direct_io || cap.io_alignment <= 1 {
        return skip("the backend does not use direct I/O, so any alignment is valid");
    }
    let b = env.backend()?;
    let a = cap.io_alignment;
    let buf = buffer(env, &b, 4 * a.max(4096))?;
    let k = key(env, "misaligned");
    for s in [buf.slice(1, a), buf.slice(0, a + 1), buf.slice(a / 2, a)] {
        let (w, r) = write_then_read(&b, &k, &[s]).await?;
        ensure!(
            matches!(w, Err(Error::Misaligned { .. })),
            "write {s:?} gave {w:?}"
        );
        ensure!(
            matches!(r, Err(Error::Misaligned { .. })),
            "read {s:?} gave {r:?}"
        );
    }
    ensure_eq!(
        only("exists", b.exists(std::slice::from_ref(&k)).await)?.ok(),
        Some(false),
        "a rejected write left an object"
    );
    Ok(())
}

/// A bad item does not fail the good items of its batch.
pub async fn backend_bad_item_does_not_fail_others(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, 2 * n)?;
    buf.fill(0, &pattern(n as usize, 20))?;
    let (k1, k2, k3) = (key(env, "good1"), key(env, "bad"), key(env, "good2"));
    let good = [buf.slice(0, n)];
    let bad = [buf.slice(n, 2 * n)];
    let r = b
        .write(&[
            WriteItem {
                key: &k1,
                segments: &good,
            },
            WriteItem {
                key: &k2,
                segments: &bad,
            },
            WriteItem {
                key: &k3,
                segments: &good,
            },
        ])
        .await;
    let r = per_item("write", 3, r)?;
    ensure!(r[0].is_ok() && r[1].is_err() && r[2].is_ok(), "got {r:?}");
    let e: Vec<bool> = b
        .exists(&[k1, k2, k3])
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    ensure_eq!(e, vec![true, false, true]);
    Ok(())
}
