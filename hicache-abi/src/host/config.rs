//! A plugin's config in C form: storage dirs and parameters as text, owned here for the
//! duration of one call.

use std::ffi::{CString, c_char};
use std::os::unix::ffi::OsStrExt;

use hicache_core::raw::PluginContext;

use crate::abi::{hicache_config, hicache_param_value};

/// Owns every string and array a [`hicache_config`] points into.
pub(crate) struct CConfig {
    _dirs: Vec<CString>,
    dir_ptrs: Vec<*const c_char>,
    _texts: Vec<(CString, CString)>,
    params: Vec<hicache_param_value>,
    use_direct_io: bool,
}

impl CConfig {
    /// The context's storage dirs and parameters. A NUL byte inside one (which C cannot
    /// carry) is an error naming it.
    pub(crate) fn new(ctx: &PluginContext<'_>) -> Result<Self, String> {
        let dirs = ctx
            .config
            .storage_dirs
            .value
            .iter()
            .map(|d| {
                CString::new(d.as_os_str().as_bytes())
                    .map_err(|_| format!("storage dir {} holds a NUL byte", d.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let texts = ctx
            .params
            .to_plugin_text()
            .into_iter()
            .map(|(name, value)| {
                let value = CString::new(value)
                    .map_err(|_| format!("the value of parameter `{name}` holds a NUL byte"))?;
                let name = CString::new(name)
                    .map_err(|_| format!("parameter name `{name}` holds a NUL byte"))?;
                Ok((name, value))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let dir_ptrs = dirs.iter().map(|d| d.as_ptr()).collect();
        let params = texts
            .iter()
            .map(|(n, v)| hicache_param_value {
                name: n.as_ptr(),
                value: v.as_ptr(),
            })
            .collect();
        Ok(CConfig {
            _dirs: dirs,
            dir_ptrs,
            _texts: texts,
            params,
            use_direct_io: ctx.config.use_direct_io.value,
        })
    }

    /// The C view; valid while `self` lives (the vectors' buffers do not move).
    pub(crate) fn raw(&self) -> hicache_config {
        hicache_config {
            storage_dirs: self.dir_ptrs.as_ptr(),
            n_storage_dirs: self.dir_ptrs.len() as u32,
            use_direct_io: self.use_direct_io.into(),
            params: self.params.as_ptr(),
            n_params: self.params.len() as u32,
            reserved: 0,
        }
    }
}
