//! What can go wrong with cuFile and the CUDA runtime, each with its name and, where one
//! helps, a hint.

use std::path::PathBuf;

use crate::cufile::sys;

/// A failure of cuFile or of the CUDA runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GdsError {
    /// No candidate library could be loaded.
    #[error("cannot load {library}: {}; {fix}", tried.iter().map(|(p, why)| format!("{} ({why})", p.display())).collect::<Vec<_>>().join(", "))]
    NotFound {
        /// Which library.
        library: &'static str,
        /// Each path or name tried, with why it failed.
        tried: Vec<(PathBuf, String)>,
        /// What to do.
        fix: &'static str,
    },
    /// The library lacks a function hicache needs.
    #[error("{path}: no symbol {symbol}; it is not the library expected, or one too old", path = path.display())]
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The function.
        symbol: &'static str,
    },
    /// A CUDA runtime call returned an error.
    #[error("{call} failed: {name} ({code})")]
    Cuda {
        /// The function.
        call: &'static str,
        /// The `cudaError_t`.
        code: i32,
        /// Its name, as the runtime gives it.
        name: String,
    },
    /// A cuFile call returned an error.
    #[error("{call} failed: {name} ({code}){cuda}{hint}", name = sys::op_error_name(*code), cuda = if *code == sys::CUDA_DRIVER_ERROR { format!(", CUDA error {cu_err}") } else { String::new() }, hint = sys::op_error_hint(*code).map(|h| format!("; {h}")).unwrap_or_default())]
    Call {
        /// The function.
        call: &'static str,
        /// The `CUfileOpError`.
        code: i32,
        /// The `CUresult`, for [`sys::CUDA_DRIVER_ERROR`].
        cu_err: i32,
    },
    /// A batch request ended without completing.
    #[error("a batch request ended {status} (ret {ret})")]
    BatchStatus {
        /// `CUfileStatus_t`'s name.
        status: &'static str,
        /// The request's `ret`.
        ret: isize,
    },
    /// Waiting for a batch failed with requests still pending: their memory may still be
    /// used by cuFile and must never be reused.
    #[error("{pending} batch requests may still be in flight: {source}")]
    Abandoned {
        /// Requests not known to have ended.
        pending: usize,
        /// Why waiting failed.
        #[source]
        source: Box<GdsError>,
    },
    /// A read or write failed with an OS error.
    #[error("{call} failed: {source}")]
    Os {
        /// The function.
        call: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl GdsError {
    /// The `CUfileOpError` of a failed call.
    pub fn code(&self) -> Option<i32> {
        match self {
            GdsError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// As hicache reports it, under `plugin`'s name.
    pub fn into_error(self, plugin: &'static str) -> hicache_core::Error {
        match self {
            GdsError::Os { call, source } => hicache_core::Error::io(plugin, call, None, source),
            other => hicache_core::Error::backend_with_source(plugin, other.to_string(), other),
        }
    }
}
