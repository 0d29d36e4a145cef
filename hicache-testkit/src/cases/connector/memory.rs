//! A pool in the variant's own memory ([`TestMemory`](crate::memory::TestMemory)): host
//! buffers for most variants, GPU memory for a plugin that moves it. A device pool's pages
//! move zero-copy, their envelope header from host staging, with no payload checksum.

use std::sync::Arc;

use hicache_core::{
    HostSlots, Layout, MemKind, PayloadCheck, PoolGeometry, RegionPool, TransferMode,
};

use crate::check::{CaseResult, skip};
use crate::fixtures::{keys, mha};
use crate::trial::TrialEnv;
use crate::{ensure, ensure_eq};

use super::{PAGES, all_hits, all_written};

/// The bytes of `page`'s spans, in order, from a copy of the whole pool.
fn page_of(geometry: &PoolGeometry, pool: &[u8], page: u64) -> hicache_core::Result<Vec<u8>> {
    let mut out = Vec::new();
    for span in geometry.page_spans(page)? {
        out.extend_from_slice(&pool[span.offset as usize..(span.offset + span.len) as usize]);
    }
    Ok(out)
}

/// Pages of a pool in the variant's memory round-trip; a device pool moves zero-copy and
/// says its payloads are not checksummed.
pub async fn connector_pool_in_variant_memory(env: &TrialEnv) -> CaseResult {
    let geometry = mha(Layout::PageFirst, 16, PAGES);
    let memory = env.memory();
    let len = geometry.pool_bytes();
    let region = memory.alloc(len)?;
    let device = region.kind() != MemKind::Host;
    if device && !env.capability().accepts(region.kind()) {
        return skip("the variant's memory is device memory, which the plugin does not move");
    }
    let cache = env.default_connector()?;
    let report = cache.register_pool(Arc::new(RegionPool::new(geometry, region.clone())?))?;
    if device {
        ensure_eq!(report.mode, TransferMode::ZeroCopy, "{report}");
        ensure_eq!(
            report.payload_check,
            PayloadCheck::DeviceUnchecked,
            "{report}"
        );
    } else {
        ensure_eq!(report.payload_check, PayloadCheck::Checksum, "{report}");
    }
    let pattern: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8 ^ 0x5a).collect();
    memory.copy_in(&mut region.target(0, len, "test pool")?, &pattern)?;
    let ks = keys("vm", 4);
    let set = cache
        .batch_set(&ks, HostSlots::Pages(&[0, 1, 2, 3]))
        .await?;
    ensure!(all_written(&set), "{}: set {set:?}", memory.describe());
    memory.copy_in(
        &mut region.target(0, len, "test pool")?,
        &vec![0u8; len as usize],
    )?;
    let targets = [6u64, 8, 9, 11];
    let got = cache.batch_get(&ks, HostSlots::Pages(&targets)).await?;
    ensure!(all_hits(&got), "{}: get {got:?}", memory.describe());
    let back = memory.copy_out(&region.source(0, len, "test pool")?)?;
    for (source, target) in targets.iter().enumerate() {
        ensure!(
            page_of(&geometry, &back, *target)? == page_of(&geometry, &pattern, source as u64)?,
            "{}: page {target} holds other bytes than page {source} had",
            memory.describe()
        );
    }
    // Pages no read targeted are untouched.
    for guard in [4u64, 5, 7, 10] {
        ensure!(
            page_of(&geometry, &back, guard)?.iter().all(|b| *b == 0),
            "{}: guard page {guard} was written",
            memory.describe()
        );
    }
    cache.unregister_pool().await;
    Ok(())
}
