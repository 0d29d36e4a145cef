//! Writers racing on one key, and disjoint batches at once.

use hicache_core::ReadOutcome;
use hicache_core::raw::{ObjectKey, ReadItem, Slice, WriteItem};

use crate::check::{CaseError, CaseResult, only};
use crate::fixtures::pattern;
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{block, buffer, buffer_in, get, key, put};

/// Two writers of one key at once, and a reader beside them: every read of a plugin that
/// declares atomic publish sees one complete version (never a mix, never a gap once the key
/// exists), and the last write leaves one complete version.
pub async fn backend_concurrent_writers_same_key(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let buf = buffer(env, &b, 4 * n)?;
    let (va, vb) = (pattern(2 * n as usize, 31), pattern(2 * n as usize, 32));
    buf.fill(0, &va)?;
    buf.fill(2 * n, &vb)?;
    let k = key(env, "race");
    put(&b, &k, &[buf.slice(0, 2 * n)]).await?;
    let atomic = env.capability().atomic_publish;
    let done = std::sync::atomic::AtomicBool::new(false);
    let writers = async {
        for _ in 0..20 {
            let (sa, sb) = ([buf.slice(0, 2 * n)], [buf.slice(2 * n, 2 * n)]);
            let (ia, ib) = (
                [WriteItem {
                    key: &k,
                    segments: &sa,
                }],
                [WriteItem {
                    key: &k,
                    segments: &sb,
                }],
            );
            let (ra, rb) = tokio::join!(b.write(&ia), b.write(&ib));
            let (ra, rb) = (only("write", ra)?, only("write", rb)?);
            ensure!(ra.is_ok() && rb.is_ok(), "{ra:?} {rb:?}");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        Ok::<(), CaseError>(())
    };
    let reader = async {
        let out = buffer(env, &b, 2 * n)?;
        let mut reads = 0u32;
        while reads < 3 || !done.load(std::sync::atomic::Ordering::Acquire) {
            reads += 1;
            // A plugin whose reads finish without waiting would otherwise never let the
            // writers run again.
            tokio::task::yield_now().await;
            let got = get(&b, &k, &[out.slice(0, 2 * n)]).await?;
            if !atomic {
                continue;
            }
            ensure_eq!(got, ReadOutcome::Hit, "read {reads} during overwrites");
            let bytes = out.read(0, 2 * n)?;
            ensure!(
                bytes == va || bytes == vb,
                "read {reads} during overwrites mixes versions"
            );
        }
        Ok::<(), CaseError>(())
    };
    // The first failure on either side ends both (the reader waits for the writers' end).
    tokio::try_join!(writers, reader)?;
    let out = buffer(env, &b, 2 * n)?;
    ensure_eq!(get(&b, &k, &[out.slice(0, 2 * n)]).await?, ReadOutcome::Hit);
    let got = out.read(0, 2 * n)?;
    ensure!(got == va || got == vb, "the object mixes both writers");
    Ok(())
}

/// Batches from several tasks at once on disjoint keys stay correct.
pub async fn backend_concurrent_disjoint_batches(env: &TrialEnv) -> CaseResult {
    let b = env.backend()?;
    let n = block(env);
    let tasks: Vec<_> = (0..4u32)
        .map(|t| {
            let b = b.clone();
            let memory = env.memory();
            let prefix = format!("{}-cd{t}", env.namespace());
            tokio::spawn(async move {
                let buf = buffer_in(memory, &b, 16 * n).map_err(|e| e.to_string())?;
                for round in 0..5u32 {
                    let ks: Vec<ObjectKey> = (0..8)
                        .map(|i| ObjectKey::new(format!("{prefix}-{i}")).expect("key"))
                        .collect();
                    for i in 0..8 {
                        buf.fill(
                            i * n,
                            &pattern(n as usize, t * 1000 + round * 10 + i as u32),
                        )
                        .map_err(|e| e.to_string())?;
                    }
                    let segs: Vec<[Slice; 1]> = (0..8).map(|i| [buf.slice(i * n, n)]).collect();
                    let items: Vec<WriteItem<'_>> = ks
                        .iter()
                        .zip(&segs)
                        .map(|(k, s)| WriteItem {
                            key: k,
                            segments: s,
                        })
                        .collect();
                    if b.write(&items).await.iter().any(|r| r.is_err()) {
                        return Err("write failed".to_string());
                    }
                    let dsegs: Vec<[Slice; 1]> =
                        (0..8).map(|i| [buf.slice((8 + i) * n, n)]).collect();
                    let items: Vec<ReadItem<'_>> = ks
                        .iter()
                        .zip(&dsegs)
                        .map(|(k, s)| ReadItem {
                            key: k,
                            segments: s,
                        })
                        .collect();
                    if !b
                        .read(&items)
                        .await
                        .iter()
                        .all(|r| matches!(r, Ok(ReadOutcome::Hit)))
                    {
                        return Err("read missed".to_string());
                    }
                    let back = buf.read(8 * n, 8 * n).map_err(|e| e.to_string())?;
                    if back != buf.read(0, 8 * n).map_err(|e| e.to_string())? {
                        return Err(format!("task {t} round {round}: wrong bytes"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in tasks {
        let r = t
            .await
            .map_err(|e| crate::CaseError::Failed(format!("task panicked: {e}")))?;
        ensure!(r.is_ok(), "{r:?}");
    }
    Ok(())
}
