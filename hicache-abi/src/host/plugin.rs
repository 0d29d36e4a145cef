//! A loaded plugin's probe and build, through its C table.

use std::path::Path;
use std::sync::Arc;

use hicache_core::raw::{
    BackendInfo, Capability, DynBackend, LoadedPlugin, PluginContext, Probe, RegionTable,
};
use hicache_core::{Error, Result};

use super::backend::{Instance, LoadedBackend};
use super::config::CConfig;
use crate::abi::{self, hicache_error, hicache_info, hicache_plugin_table_v1, hicache_probe, text};

/// One loaded plugin: its checked table and where it came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CPlugin {
    pub(crate) name: &'static str,
    pub(crate) version: &'static str,
    pub(crate) path: &'static Path,
    pub(crate) table: hicache_plugin_table_v1,
}

// SAFETY: the table holds function pointers and pointers to strings the plugin keeps for
// the process's life; the ABI makes every function callable from any thread.
unsafe impl Send for CPlugin {}
// SAFETY: as above; nothing here is mutated after loading.
unsafe impl Sync for CPlugin {}

impl CPlugin {
    pub(crate) fn contract(&self, detail: impl Into<String>) -> Error {
        Error::PluginContract {
            plugin: format!("{} ({})", self.name, self.path.display()),
            detail: detail.into(),
        }
    }

    pub(crate) fn failed(&self, what: &str, err: &hicache_error) -> Error {
        let message = text(&err.message);
        Error::backend(
            self.name,
            format!(
                "{what} failed: {}",
                if message.is_empty() {
                    "the plugin gave no reason"
                } else {
                    &message
                }
            ),
        )
    }
}

impl LoadedPlugin for CPlugin {
    fn probe(&self, ctx: &PluginContext<'_>) -> Probe {
        let config = match CConfig::new(ctx) {
            Ok(c) => c,
            Err(reason) => {
                return Probe::unusable(reason, "remove the NUL byte from the config");
            }
        };
        let raw = config.raw();
        let mut out = hicache_probe::empty();
        let Some(probe) = self.table.probe else {
            return Probe::unusable("the plugin has no probe", "fix the plugin");
        };
        // SAFETY: the config and the out buffer live across the call; the plugin writes
        // at most the buffer's size (ABI) and `text` never reads past it.
        let status = unsafe { probe(&raw, &mut out) };
        let detail = text(&out.detail);
        let probe = if status == abi::OK {
            Probe::usable(if detail.is_empty() {
                "the plugin's probe passed".to_string()
            } else {
                detail
            })
        } else {
            let hint = text(&out.hint);
            Probe::unusable(
                if detail.is_empty() {
                    format!("the plugin's probe failed (status {status}) without a reason")
                } else {
                    detail
                },
                if hint.is_empty() {
                    "see the plugin's documentation".to_string()
                } else {
                    hint
                },
            )
        };
        probe
            .fact(self.name, "loaded from", self.path.display().to_string())
            .fact(self.name, "version", self.version)
    }

    fn build(&self, ctx: &PluginContext<'_>) -> Result<DynBackend> {
        let config = CConfig::new(ctx)
            .map_err(|reason| Error::invalid_config("storage_dir", "the config", reason))?;
        let raw = config.raw();
        let (Some(open), Some(info)) = (self.table.open, self.table.info) else {
            return Err(self.contract("open or info is NULL"));
        };
        let mut err = hicache_error::empty();
        let mut ptr = std::ptr::null_mut();
        // SAFETY: config, out pointer and error buffer live across the call (ABI).
        let status = unsafe { open(&raw, &mut ptr, &mut err) };
        if status != abi::OK {
            return Err(self.failed("open", &err));
        }
        if ptr.is_null() {
            return Err(self.contract("open succeeded but gave a NULL instance"));
        }
        let plugin = *self;
        let instance = Arc::new(Instance { plugin, ptr });
        let mut out = hicache_info::empty();
        // SAFETY: a live instance and host-owned buffers (ABI).
        let status = unsafe { info(ptr, &mut out, &mut err) };
        if status != abi::OK {
            return Err(self.failed("info", &err));
        }
        let capability = self.capability(&out)?;
        let info = BackendInfo {
            name: self.name.to_string(),
            version: self.version.to_string(),
            kind: BackendKind::from_table(self.table.kind),
            capability,
            location: text(&out.location),
        };
        Ok(Arc::new(LoadedBackend {
            plugin: *self,
            instance,
            regions: RegionTable::new(self.name),
            info,
        }))
    }
}

use hicache_core::raw::BackendKind;

trait FromTable {
    fn from_table(kind: u32) -> Self;
}

impl FromTable for BackendKind {
    fn from_table(kind: u32) -> Self {
        if kind == abi::KIND_OBJECT {
            BackendKind::Object
        } else {
            BackendKind::File
        }
    }
}

impl CPlugin {
    /// The instance's capability, checked by core's one rule (`Capability::problems`): an
    /// invalid one would break transfers, so it fails the build naming the field.
    fn capability(&self, out: &hicache_info) -> Result<Capability> {
        let c = out.capability;
        let mut cap = Capability::default();
        cap.direct_io = c.direct_io != 0;
        cap.io_alignment = c.io_alignment;
        cap.gpu_direct = c.gpu_direct != 0;
        cap.host_memory = c.host_memory != 0;
        cap.device_memory = c.device_memory != 0;
        cap.atomic_publish = c.atomic_publish != 0;
        cap.max_object_size = (c.max_object_size != 0).then_some(c.max_object_size);
        cap.max_segments = c.max_segments;
        cap.persistent = c.persistent != 0;
        let problems = cap.problems();
        if !problems.is_empty() {
            return Err(self.contract(format!("capability.{}", problems.join("; capability."))));
        }
        Ok(cap)
    }
}
