//! Finding plugin files in the configured dirs, loading them, and checking their tables.

use std::collections::HashMap;
use std::ffi::c_char;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hicache_core::raw::{BackendKind, ParamKind, ParamSpec, PluginDescriptor, Rejected};

use super::plugin::CPlugin;
use crate::abi::{self, hicache_plugin_entry, hicache_plugin_table_v1};

/// Why a plugin file was not loaded. Every variant names the file and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A plugin dir cannot be read.
    #[error("plugin dir {dir}: {reason}; check `plugin_dirs` / HICACHE_PLUGIN_DIR")]
    Dir {
        /// The dir.
        dir: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The file is not something hicache loads (a link, writable by others, not a file).
    #[error("{path}: not loaded: {reason}")]
    Refused {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The dynamic loader could not open the file.
    #[error(
        "{path}: cannot open: {reason}; is it a shared library built for this machine, with its own dependencies installed?"
    )]
    CannotOpen {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The file exports no `hicache_plugin_v1`.
    #[error(
        "{path}: no `hicache_plugin_v1` symbol: not a hicache plugin, or built without the export (Rust: `hicache_abi::export_plugin!`; C: define `hicache_plugin_v1` from hicache_plugin.h)"
    )]
    MissingSymbol {
        /// The file.
        path: PathBuf,
    },
    /// `hicache_plugin_v1()` returned null: the plugin could not initialise.
    #[error(
        "{path}: `hicache_plugin_v1()` returned NULL: the plugin could not initialise (see its own logs)"
    )]
    InitFailed {
        /// The file.
        path: PathBuf,
    },
    /// The table speaks another ABI version.
    #[error(
        "{path}: plugin ABI version {found}, this hicache speaks version {expected}; rebuild the plugin against this hicache's hicache_plugin.h"
    )]
    AbiVersion {
        /// The file.
        path: PathBuf,
        /// The plugin's version.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// The table is smaller than version 1's.
    #[error(
        "{path}: plugin table is {found} bytes, version {version} needs {expected}; rebuild the plugin against this hicache's hicache_plugin.h"
    )]
    TableSize {
        /// The file.
        path: PathBuf,
        /// ABI version it claims.
        version: u32,
        /// Its `struct_size`.
        found: u32,
        /// What the version needs.
        expected: u32,
    },
    /// A field of the table is missing or invalid.
    #[error("{path}: field `{field}` of the plugin table {reason}; fix the plugin")]
    BadTable {
        /// The file.
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another plugin already has that name.
    #[error(
        "{path}: plugin name {name} is already taken by {taken_by}; remove one of the two, or rename the plugin"
    )]
    DuplicateName {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
        /// Who has it: `built-in` or a file.
        taken_by: String,
    },
}

impl LoadError {
    /// The file (or dir) the error is about.
    pub fn path(&self) -> &Path {
        match self {
            LoadError::Dir { dir, .. } => dir,
            LoadError::Refused { path, .. }
            | LoadError::CannotOpen { path, .. }
            | LoadError::MissingSymbol { path }
            | LoadError::InitFailed { path }
            | LoadError::AbiVersion { path, .. }
            | LoadError::TableSize { path, .. }
            | LoadError::BadTable { path, .. }
            | LoadError::DuplicateName { path, .. } => path,
        }
    }

    /// As the registry records it.
    pub fn rejected(&self) -> Rejected {
        Rejected {
            path: self.path().to_path_buf(),
            reason: self.to_string(),
        }
    }
}

/// What loading the plugin dirs gave.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The plugins loaded, in file-name order per dir.
    pub plugins: Vec<&'static PluginDescriptor>,
    /// The files not loaded, and why.
    pub rejected: Vec<LoadError>,
}

/// Files already loaded in this process, by real path: a plugin is loaded once and kept
/// (never unloaded), whichever registry asks for it again.
static LOADED: Mutex<Vec<(PathBuf, Result<&'static PluginDescriptor, LoadError>)>> =
    Mutex::new(Vec::new());

/// Loads every `*.so` file of `dirs` (in file-name order), refusing names in `taken` (the
/// built-in plugins) and names loaded earlier in this call. A file is opened at most once
/// per process: asking again returns what the first load gave.
pub fn load_dirs(dirs: &[PathBuf], taken: &[&'static PluginDescriptor]) -> Loaded {
    let mut out = Loaded::default();
    let mut names: HashMap<String, String> = taken
        .iter()
        .map(|d| (d.name.to_ascii_uppercase(), d.origin.to_string()))
        .collect();
    for dir in dirs {
        let files = match plugin_files(dir) {
            Ok(files) => files,
            Err(e) => {
                out.rejected.push(e);
                continue;
            }
        };
        for path in files {
            match load_file(&path) {
                Ok(d) => {
                    let key = d.name.to_ascii_uppercase();
                    if let Some(taken_by) = names.get(&key) {
                        if *taken_by == d.origin.to_string() {
                            continue; // the same file listed twice
                        }
                        out.rejected.push(LoadError::DuplicateName {
                            path,
                            name: d.name.to_string(),
                            taken_by: taken_by.clone(),
                        });
                        continue;
                    }
                    names.insert(key, d.origin.to_string());
                    out.plugins.push(d);
                }
                Err(e) => out.rejected.push(e),
            }
        }
    }
    out
}

/// The `*.so` files of a plugin dir, sorted by name.
fn plugin_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let dir_error = |reason: String| LoadError::Dir {
        dir: dir.to_path_buf(),
        reason,
    };
    let entries = std::fs::read_dir(dir).map_err(|e| dir_error(e.to_string()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| dir_error(e.to_string()))?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "so") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Loads one plugin file (once per process; see [`load_dirs`]).
pub fn load_file(path: &Path) -> Result<&'static PluginDescriptor, LoadError> {
    // Checked before resolving: a link is refused as a link, even one that leads nowhere.
    check_file(path)?;
    let real = path.canonicalize().map_err(|e| LoadError::CannotOpen {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, result)) = loaded.iter().find(|(p, _)| *p == real) {
        return result.clone();
    }
    let result = open(path);
    loaded.push((real, result.clone()));
    result
}

fn open(path: &Path) -> Result<&'static PluginDescriptor, LoadError> {
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: loading runs the library's initialisers. The file sits in a plugin dir the
    // user configured, as a regular file no other user may write (checked above): putting
    // it there is the decision to trust it, as with any plugin system.
    let library =
        unsafe { libloading::os::unix::Library::open(Some(path), flags) }.map_err(|e| {
            LoadError::CannotOpen {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
    // The library is never unloaded: code of it may run as long as the process does.
    let library: &'static libloading::os::unix::Library = Box::leak(Box::new(library));
    // SAFETY: the symbol's type is the ABI's entry type (hicache_plugin.h); a plugin that
    // exports the name with another type breaks the ABI, which nothing on this side can
    // detect.
    let entry = unsafe { library.get::<hicache_plugin_entry>(abi::ENTRY) }.map_err(|_| {
        LoadError::MissingSymbol {
            path: path.to_path_buf(),
        }
    })?;
    // SAFETY: the entry takes no arguments and returns a pointer (ABI).
    let table = unsafe { entry() };
    if table.is_null() {
        return Err(LoadError::InitFailed {
            path: path.to_path_buf(),
        });
    }
    // SAFETY: every version of the table starts with two u32s (version, size); only those
    // are read before the version and size are known.
    let (version, size) = unsafe {
        let head = table.cast::<u32>();
        (head.read(), head.add(1).read())
    };
    if version != abi::ABI_VERSION {
        return Err(LoadError::AbiVersion {
            path: path.to_path_buf(),
            found: version,
            expected: abi::ABI_VERSION,
        });
    }
    let expected = abi::TABLE_V1_BASE_SIZE as u32;
    if size < expected {
        return Err(LoadError::TableSize {
            path: path.to_path_buf(),
            version,
            found: size,
            expected,
        });
    }
    // Fields past the plugin's struct_size (added to version 1 after it was built) stay
    // NULL; bytes past ours (a newer header) are not read.
    let copied = (size as usize).min(size_of::<hicache_plugin_table_v1>());
    let mut own = std::mem::MaybeUninit::<hicache_plugin_table_v1>::zeroed();
    // SAFETY: the plugin declared a version-1 table of `size` bytes, of which the first
    // `copied` are copied, so later changes on the plugin's side cannot reach the host. All
    // zero bytes are a valid table (integers, null pointers, `None` function pointers), so
    // the copy over a zeroed table is a valid table whatever `copied` is.
    let table = unsafe {
        std::ptr::copy_nonoverlapping(table.cast::<u8>(), own.as_mut_ptr().cast::<u8>(), copied);
        own.assume_init()
    };
    describe(path, table)
}

/// Refuses links (they may lead outside the plugin dirs), non-files, and files other
/// users may write (anyone who can would run code in this process).
fn check_file(path: &Path) -> Result<(), LoadError> {
    let refused = |reason: &str| LoadError::Refused {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let meta = std::fs::symlink_metadata(path).map_err(|e| LoadError::CannotOpen {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if meta.file_type().is_symlink() {
        return Err(refused(
            "a symbolic link; plugins load only from files inside the plugin dirs (copy the library there)",
        ));
    }
    if !meta.is_file() {
        return Err(refused("not a regular file"));
    }
    if meta.permissions().mode() & 0o002 != 0 {
        return Err(refused(
            "writable by every user, so anyone could run code in this process; `chmod o-w` it",
        ));
    }
    Ok(())
}

/// Checks the table and turns it into a descriptor (strings copied and kept for the
/// process's life).
fn describe(
    path: &Path,
    table: hicache_plugin_table_v1,
) -> Result<&'static PluginDescriptor, LoadError> {
    let bad = |field: &str, reason: &str| LoadError::BadTable {
        path: path.to_path_buf(),
        field: field.to_string(),
        reason: reason.to_string(),
    };
    let name = table_text(table.name, 64).ok_or_else(|| bad("name", "is NULL or not text"))?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(bad(
            "name",
            &format!("is {name:?}; use 1 to 64 letters, digits, '_' or '-'"),
        ));
    }
    let version =
        table_text(table.version, 64).ok_or_else(|| bad("version", "is NULL or not text"))?;
    let summary =
        table_text(table.summary, 200).ok_or_else(|| bad("summary", "is NULL or not text"))?;
    let kind = match table.kind {
        abi::KIND_FILE => BackendKind::File,
        abi::KIND_OBJECT => BackendKind::Object,
        other => {
            return Err(bad(
                "kind",
                &format!("is {other}; use HICACHE_KIND_FILE or HICACHE_KIND_OBJECT"),
            ));
        }
    };
    let missing = [
        ("probe", table.probe.is_none()),
        ("open", table.open.is_none()),
        ("close", table.close.is_none()),
        ("info", table.info.is_none()),
        ("register_memory", table.register_memory.is_none()),
        ("deregister_memory", table.deregister_memory.is_none()),
        ("submit", table.submit.is_none()),
        ("usage", table.usage.is_none()),
    ];
    if let Some((field, _)) = missing.iter().find(|(_, none)| *none) {
        return Err(bad(
            field,
            "is NULL; every function of the table is required",
        ));
    }
    let params = params(path, &table)?;
    let path: &'static Path = Box::leak(path.to_path_buf().into_boxed_path());
    let name: &'static str = name.leak();
    let plugin: &'static CPlugin = Box::leak(Box::new(CPlugin {
        name,
        version: version.leak(),
        path,
        table,
    }));
    let descriptor = PluginDescriptor::loaded(name, kind, summary.leak(), plugin, path)
        .with_priority(table.priority)
        .with_params(params);
    Ok(Box::leak(Box::new(descriptor)))
}

const MAX_PARAMS: u32 = 256;

fn params(path: &Path, table: &hicache_plugin_table_v1) -> Result<&'static [ParamSpec], LoadError> {
    let bad = |field: String, reason: &str| LoadError::BadTable {
        path: path.to_path_buf(),
        field,
        reason: reason.to_string(),
    };
    if table.n_params == 0 {
        return Ok(&[]);
    }
    if table.n_params > MAX_PARAMS {
        return Err(bad(
            "n_params".into(),
            &format!("is {}; at most {MAX_PARAMS} are allowed", table.n_params),
        ));
    }
    if table.params.is_null() {
        return Err(bad("params".into(), "is NULL while n_params is not 0"));
    }
    // SAFETY: the plugin declares `n_params` entries at `params`, alive for the process's
    // life (ABI); the count is bounded above.
    let specs = unsafe { std::slice::from_raw_parts(table.params, table.n_params as usize) };
    let mut out: Vec<ParamSpec> = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let field = |f: &str| format!("params[{i}].{f}");
        let name =
            table_text(s.name, 64).ok_or_else(|| bad(field("name"), "is NULL or not text"))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad(
                field("name"),
                &format!("is {name:?}; use letters, digits and '_'"),
            ));
        }
        if out.iter().any(|p| p.name == name) {
            return Err(bad(field("name"), &format!("repeats parameter `{name}`")));
        }
        let doc = table_text(s.doc, 400).ok_or_else(|| bad(field("doc"), "is NULL or not text"))?;
        let kind = match s.r#type {
            abi::PARAM_BOOL => ParamKind::Bool,
            abi::PARAM_UINT => ParamKind::UInt,
            abi::PARAM_FLOAT => ParamKind::Float,
            abi::PARAM_STR => ParamKind::Str,
            other => {
                return Err(bad(
                    field("type"),
                    &format!("is {other}; use one of HICACHE_PARAM_*"),
                ));
            }
        };
        let mut spec = ParamSpec::new(name.leak(), kind, doc.leak());
        if !s.default_value.is_null() {
            let shown = table_text(s.default_value, 200)
                .ok_or_else(|| bad(field("default_value"), "is not text"))?;
            spec = spec.default(shown.leak());
        }
        if s.secret != 0 {
            spec = spec.secret();
        }
        out.push(spec);
    }
    Ok(out.leak())
}

/// A NUL-terminated string of the table, read up to `max` bytes: `None` when null, longer,
/// or not UTF-8.
fn table_text(p: *const c_char, max: usize) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null string of the table is NUL-terminated and alive for the process's
    // life (ABI); at most `max + 1` bytes are read, stopping at the first NUL.
    let bytes = unsafe { bounded_c_str(p, max + 1) };
    if bytes.len() > max {
        return None;
    }
    String::from_utf8(bytes.to_vec()).ok()
}

/// The bytes before the first NUL, reading at most `limit` bytes.
///
/// # Safety
/// `p` must be readable up to its NUL or `limit` bytes, whichever comes first.
pub(crate) unsafe fn bounded_c_str<'a>(p: *const c_char, limit: usize) -> &'a [u8] {
    let mut n = 0;
    // SAFETY: the caller guarantees bytes up to the NUL (or `limit`) are readable.
    while n < limit && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: the `n` bytes just read.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }
}
