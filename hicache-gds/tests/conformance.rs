//! The whole conformance suite for GDS and GDS_MT through the real FFI path, against the
//! testkit's stand-in cuFile and CUDA runtime (built with the system's C compiler): each
//! plugin with host memory, and with "device" memory from the stand-in runtime
//! (`cudaMalloc` there is `malloc`, so this proves the plumbing — registration of device
//! regions, offsets, batches — not GPU DMA; the H200 run in the README does that).
//!
//! Each backend is opened as selection opens it: config, parameters checked, probe, build
//! with the probe's findings. GDS runs with small batches (8 requests of at most 8 KiB), so
//! objects are split into several requests and one call needs several batches.
//!
//! On a CUDA machine the same binary runs against NVIDIA's libraries and real GPU memory:
//! `HICACHE_GDS_CUFILE=/usr/local/cuda/lib64/libcufile.so.0
//! HICACHE_GDS_CUDART=/usr/local/cuda/lib64/libcudart.so` (both, or neither), with
//! `HICACHE_TEST_ROOT` on a filesystem cuFile can register files in.

mod support;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use hicache_core::raw::{DynBackend, PluginDescriptor, SourceSlice, TargetSlice};
use hicache_core::{ConfigLoader, Error, MemoryRegion, Result};
use hicache_gds::cuda::{CudaRuntime, copy_from_device, copy_to_device, device_region};
use hicache_gds::{GDS_DESCRIPTOR, GDS_MT_DESCRIPTOR};
use hicache_testkit::memory::TestMemory;
use hicache_testkit::{Suite, TrialEnv};

/// The libraries under test: NVIDIA's when `HICACHE_GDS_CUFILE` and `HICACHE_GDS_CUDART`
/// name them, else the stand-ins.
fn libraries() -> &'static (PathBuf, PathBuf) {
    static LIBS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    LIBS.get_or_init(|| {
        match (
            std::env::var_os("HICACHE_GDS_CUFILE"),
            std::env::var_os("HICACHE_GDS_CUDART"),
        ) {
            (Some(cufile), Some(cudart)) => (cufile.into(), cudart.into()),
            (None, None) => (support::cufile().into(), support::cudart().into()),
            _ => panic!("set both HICACHE_GDS_CUFILE and HICACHE_GDS_CUDART, or neither"),
        }
    })
}

/// Opens `plugin` over the trial dir through its probe and build.
fn open(plugin: &'static PluginDescriptor, env: &TrialEnv) -> Result<DynBackend> {
    let section = format!("plugin.{}", plugin.name.to_ascii_lowercase());
    let mut loader = ConfigLoader::new()
        .set("storage_dir", env.dir().join("store").display().to_string())
        .set(
            format!("{section}.cufile_path"),
            libraries().0.display().to_string(),
        )
        .set(format!("{section}.threads"), 4);
    if plugin.name == hicache_gds::GDS {
        loader = loader
            .set(format!("{section}.batch_limit"), 8)
            .set(format!("{section}.max_request_size"), 8192);
    }
    hicache_testkit::open_probed(plugin, &loader.load()?)
}

/// Device 0's memory (the stand-in runtime's "device" memory, or a GPU's), copied with
/// `cudaMemcpy`.
struct Device(Arc<CudaRuntime>);

impl Device {
    fn shared() -> Arc<dyn TestMemory> {
        let cuda = CudaRuntime::load(Some(&libraries().1)).expect("the CUDA runtime loads");
        Arc::new(Device(Arc::new(cuda)))
    }
}

fn cuda_error(e: hicache_gds::GdsError) -> Error {
    e.into_error("test memory")
}

impl TestMemory for Device {
    fn alloc(&self, len: u64) -> Result<MemoryRegion> {
        device_region(&self.0, 0, len as usize).map_err(cuda_error)
    }

    fn copy_in(&self, to: &mut TargetSlice, bytes: &[u8]) -> Result<()> {
        copy_to_device(&self.0, to, bytes).map_err(cuda_error)
    }

    fn copy_out(&self, from: &SourceSlice) -> Result<Vec<u8>> {
        let mut out = vec![0; from.len()];
        copy_from_device(&self.0, from, &mut out).map_err(cuda_error)?;
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("device 0 of {}", self.0.path().display())
    }
}

fn main() -> std::process::ExitCode {
    let device = Device::shared();
    Suite::new("GDS")
        .variant("gds_mt_host", None, |env| open(&GDS_MT_DESCRIPTOR, env))
        .variant("gds_mt_device", None, |env| open(&GDS_MT_DESCRIPTOR, env))
        .memory(device.clone())
        .variant("gds_host", None, |env| open(&GDS_DESCRIPTOR, env))
        .variant("gds_device", None, |env| open(&GDS_DESCRIPTOR, env))
        .memory(device)
        .run_main()
}
