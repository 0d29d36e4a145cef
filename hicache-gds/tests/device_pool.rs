//! A connector pool in device memory (`RegionPool` over `cudaMalloc` memory), against the
//! testkit's stand-ins: it moves zero-copy only, on a plugin that moves device memory; its
//! pages carry their envelope without a payload checksum, and a host pool of the same
//! namespace reads them. (The suite's `connector_pool_in_variant_memory` round-trips such a
//! pool in every device variant, on the H200 with real GPU memory.)

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hicache_core::raw::DynBackend;
use hicache_core::{
    ConfigLoader, Error, HiCache, HiCacheOptions, HostSlots, Layout, MemoryBackend, MemoryRegion,
    MmapPool, PayloadCheck, ReadOutcome, RegionPool, StorageIdentity, TransferMode,
};
use hicache_gds::GDS_MT_DESCRIPTOR;
use hicache_gds::cuda::{CudaRuntime, copy_from_device, copy_to_device, device_region};
use hicache_testkit::fixtures::{keys, mha};

fn config(store: &Path, extra: &[(&str, &str)]) -> hicache_core::Config {
    let mut loader = ConfigLoader::new()
        .set("storage_dir", store.display().to_string())
        .set(
            "plugin.gds_mt.cufile_path",
            support::cufile().display().to_string(),
        )
        .set("plugin.gds_mt.threads", 2);
    for (k, v) in extra {
        loader = loader.set(*k, *v);
    }
    loader.load().unwrap()
}

fn gds_mt(store: &Path) -> DynBackend {
    std::fs::create_dir_all(store).unwrap();
    hicache_testkit::open_probed(&GDS_MT_DESCRIPTOR, &config(store, &[])).unwrap()
}

fn cuda() -> Arc<CudaRuntime> {
    Arc::new(CudaRuntime::load(Some(support::cudart())).unwrap())
}

fn connector(backend: DynBackend, store: &Path, extra: &[(&str, &str)]) -> HiCache {
    HiCache::with_backend(
        backend,
        config(store, extra),
        HiCacheOptions::new(StorageIdentity::single("m")),
    )
    .unwrap()
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// Every stored object file under `dir`.
fn objects(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(objects(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_device_pool_needs_a_plugin_that_moves_device_memory_and_zero_copy() {
    let _turn = support::serial();
    let cuda = cuda();
    let geometry = mha(Layout::PageFirst, 16, 8);
    let region = device_region(&cuda, 0, geometry.pool_bytes() as usize).unwrap();
    let pool = || Arc::new(RegionPool::new(geometry, region.clone()).unwrap());
    let dir = tempfile::tempdir().unwrap();

    let host_only = connector(Arc::new(MemoryBackend::new()), dir.path(), &[]);
    let e = host_only.register_pool(pool()).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("GDS or GDS_MT"), "{e}");

    let store = dir.path().join("kv");
    let bounced = connector(gds_mt(&store), &store, &[("transfer_mode", "bounce")]);
    let e = bounced.register_pool(pool()).unwrap_err();
    assert!(matches!(e, Error::InvalidPool { .. }), "{e:?}");
    assert!(e.to_string().contains("must move zero-copy"), "{e}");

    // A region shorter than the geometry is refused before any registration.
    let short = device_region(&cuda, 0, 4096).unwrap();
    let e = RegionPool::new(geometry, short).unwrap_err();
    assert!(e.to_string().contains("the geometry needs"), "{e}");
}

#[test]
fn device_pages_carry_no_checksum_and_a_host_pool_reads_them() {
    let _turn = support::serial();
    let cuda = cuda();
    let geometry = mha(Layout::PageFirst, 16, 8);
    let len = geometry.pool_bytes();
    let region: MemoryRegion = device_region(&cuda, 0, len as usize).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("kv");
    let backend = gds_mt(&store);
    let device = connector(backend.clone(), &store, &[]);
    let report = device
        .register_pool(Arc::new(RegionPool::new(geometry, region.clone()).unwrap()))
        .unwrap();
    assert_eq!(report.mode, TransferMode::ZeroCopy, "{report}");
    assert_eq!(report.payload_check, PayloadCheck::DeviceUnchecked);
    assert!(
        report.to_string().contains("never touch host memory"),
        "{report}"
    );

    let pattern: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
    copy_to_device(&cuda, &mut region.target(0, len, "test").unwrap(), &pattern).unwrap();
    let ks = keys("dev", 2);
    let set = run(device.batch_set(&ks, HostSlots::Pages(&[0, 1]))).unwrap();
    assert!(set.iter().all(Result::is_ok), "{set:?}");

    // A host pool of the same namespace reads them: no checksum to verify, identity checked.
    let host = connector(backend.clone(), &store, &[]);
    let pool = Arc::new(MmapPool::new(geometry).unwrap());
    let report = host.register_pool(pool.clone()).unwrap();
    assert_eq!(report.payload_check, PayloadCheck::Checksum);
    let got = run(host.batch_get(&ks, HostSlots::Pages(&[2, 3]))).unwrap();
    assert!(
        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "{got:?}"
    );
    let page = |p: u64| -> Vec<u8> {
        geometry
            .page_spans(p)
            .unwrap()
            .flat_map(|s| pattern[s.offset as usize..(s.offset + s.len) as usize].to_vec())
            .collect()
    };
    let mut back = vec![0u8; len as usize];
    pool.read_bytes(0, &mut back).unwrap();
    for (src, dst) in [(0u64, 2u64), (1, 3)] {
        let got: Vec<u8> = geometry
            .page_spans(dst)
            .unwrap()
            .flat_map(|s| back[s.offset as usize..(s.offset + s.len) as usize].to_vec())
            .collect();
        assert!(got == page(src), "page {dst}");
    }

    // What the missing checksum costs, as documented: a flipped payload byte is not caught;
    // a damaged header still is.
    let files = objects(&store);
    let file = files
        .iter()
        .find(|f| std::fs::metadata(f).unwrap().len() > 4096)
        .unwrap();
    let mut bytes = std::fs::read(file).unwrap();
    bytes[4096 + 10] ^= 0xff;
    std::fs::write(file, &bytes).unwrap();
    let got = run(device.batch_get(&ks, HostSlots::Pages(&[4, 5]))).unwrap();
    assert!(
        got.iter().all(|r| matches!(r, Ok(ReadOutcome::Hit))),
        "{got:?}"
    );
    bytes[20] ^= 0xff;
    std::fs::write(file, &bytes).unwrap();
    let got = run(device.batch_get(&ks, HostSlots::Pages(&[4, 5]))).unwrap();
    assert!(
        got.iter().any(|r| matches!(r, Ok(ReadOutcome::Miss(_)))),
        "{got:?}"
    );
    let mut out = vec![0u8; 16];
    copy_from_device(&cuda, &region.source(0, 16, "test").unwrap(), &mut out).unwrap();
    assert_eq!(out, pattern[..16]);
}
