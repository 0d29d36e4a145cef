//! PANICKY: a deliberately broken Rust plugin whose backend panics in every batch (and,
//! with `probe_panics = true`, in its probe). hicache's tests load it to prove that
//! `export_plugin!` stops each panic at the ABI boundary and the host reports it as an
//! error of that plugin.

use std::sync::Arc;

use hicache_core::raw::{
    BackendInfo, BackendKind, Capability, DynBackend, MemoryRegion, ObjectKey, PluginContext,
    PluginDescriptor, Probe, ReadItem, RegionId, RegionTable, StorageBackend, Usage, WriteItem,
};
use hicache_core::{ReadOutcome, Result};

hicache_core::plugin_params! {
    /// PANICKY's parameters.
    pub struct PanickyParams {
        probe_panics: Bool = "probe_panics" => "panic in the probe too";
    }
}

/// The plugin's descriptor, exported below.
pub static DESCRIPTOR: PluginDescriptor = PluginDescriptor::new(
    "PANICKY",
    BackendKind::File,
    "panics in every batch (a test of the ABI boundary)",
    probe,
    build,
)
.with_params(PanickyParams::SPECS);

hicache_abi::export_plugin!(DESCRIPTOR);

fn probe(ctx: &PluginContext<'_>) -> Probe {
    let params = PanickyParams::from_params(ctx.params);
    if params.probe_panics.is_some_and(|p| p.value) {
        panic!("PANICKY's probe panicked on purpose");
    }
    Probe::usable("always")
}

fn build(_: &PluginContext<'_>) -> Result<DynBackend> {
    Ok(Arc::new(Panicky(RegionTable::new("PANICKY"))))
}

#[derive(Debug)]
struct Panicky(RegionTable);

#[async_trait::async_trait]
impl StorageBackend for Panicky {
    fn info(&self) -> BackendInfo {
        let mut capability = Capability::default();
        capability.io_alignment = 1;
        capability.host_memory = true;
        capability.max_segments = 1;
        BackendInfo {
            name: "PANICKY".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: BackendKind::File,
            capability,
            location: "nowhere".into(),
        }
    }

    fn register(&self, region: MemoryRegion) -> Result<RegionId> {
        self.0.register(region, &self.info().capability)
    }

    fn deregister(&self, id: RegionId) -> Result<()> {
        self.0.deregister(id)
    }

    async fn write(&self, _: &[WriteItem<'_>]) -> Vec<Result<()>> {
        panic!("PANICKY's write panicked on purpose")
    }

    async fn read(&self, _: &[ReadItem<'_>]) -> Vec<Result<ReadOutcome>> {
        panic!("PANICKY's read panicked on purpose")
    }

    async fn exists(&self, _: &[ObjectKey]) -> Vec<Result<bool>> {
        panic!("PANICKY's exists panicked on purpose")
    }

    async fn remove(&self, _: &[ObjectKey]) -> Vec<Result<()>> {
        panic!("PANICKY's remove panicked on purpose")
    }

    async fn usage(&self) -> Result<Usage> {
        panic!("PANICKY's usage panicked on purpose")
    }
}
