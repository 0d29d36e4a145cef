//! The C definitions of `include/hicache_plugin.h`, one for one. A test compiles the header
//! and checks every size, offset and constant here against it.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// The ABI version this crate speaks.
pub const ABI_VERSION: u32 = 1;
/// The entry symbol every plugin exports, NUL-terminated.
pub const ENTRY: &[u8] = b"hicache_plugin_v1\0";

/// Success.
pub const OK: i32 = 0;
/// Read: no object under that key.
pub const MISS_NOT_FOUND: i32 = 1;
/// Read: the stored length differs; `value` is it.
pub const MISS_SIZE: i32 = 2;
/// An I/O or other failure.
pub const ERR_IO: i32 = -1;
/// Unavailable for now; retryable.
pub const ERR_UNAVAILABLE: i32 = -2;
/// Out of time; `value` is the limit in milliseconds.
pub const ERR_TIMEOUT: i32 = -3;
/// Not supported.
pub const ERR_UNSUPPORTED: i32 = -4;
/// Invalid request.
pub const ERR_INVALID: i32 = -5;
/// The plugin caught a panic of its own.
pub const ERR_PANIC: i32 = -6;

/// FILE plugin.
pub const KIND_FILE: u32 = 0;
/// OBJ plugin.
pub const KIND_OBJECT: u32 = 1;

/// Boolean parameter.
pub const PARAM_BOOL: u32 = 1;
/// Unsigned integer parameter.
pub const PARAM_UINT: u32 = 2;
/// Float parameter.
pub const PARAM_FLOAT: u32 = 3;
/// Text parameter.
pub const PARAM_STR: u32 = 4;

/// Host memory.
pub const MEM_HOST: u32 = 0;
/// CUDA device memory.
pub const MEM_DEVICE: u32 = 1;

/// Write batch.
pub const OP_WRITE: u32 = 1;
/// Read batch.
pub const OP_READ: u32 = 2;
/// Exists batch.
pub const OP_EXISTS: u32 = 3;
/// Remove batch.
pub const OP_REMOVE: u32 = 4;

/// A usage figure that is not known.
pub const UNKNOWN: u64 = u64::MAX;
/// Size of every text buffer the host lends the plugin.
pub const TEXT_LEN: usize = 512;

/// `hicache_param_spec`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_param_spec {
    /// Name.
    pub name: *const c_char,
    /// `PARAM_*`.
    pub r#type: u32,
    /// Nonzero: a credential.
    pub secret: u32,
    /// One line of documentation.
    pub doc: *const c_char,
    /// The default as shown, or null.
    pub default_value: *const c_char,
}

/// `hicache_param_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_param_value {
    /// Name.
    pub name: *const c_char,
    /// Value as text.
    pub value: *const c_char,
}

/// `hicache_config`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_config {
    /// Storage dirs, in routing order.
    pub storage_dirs: *const *const c_char,
    /// How many.
    pub n_storage_dirs: u32,
    /// Nonzero: bypass the page cache.
    pub use_direct_io: u32,
    /// Set parameters.
    pub params: *const hicache_param_value,
    /// How many.
    pub n_params: u32,
    /// Zero.
    pub reserved: u32,
}

/// `hicache_error`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_error {
    /// NUL-terminated text.
    pub message: [c_char; TEXT_LEN],
}

/// `hicache_probe`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_probe {
    /// What was checked, or why unusable.
    pub detail: [c_char; TEXT_LEN],
    /// What to do, when unusable.
    pub hint: [c_char; TEXT_LEN],
}

/// `hicache_capability`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hicache_capability {
    /// Alignment in bytes; 1 when anything goes.
    pub io_alignment: u64,
    /// 0: unbounded.
    pub max_object_size: u64,
    /// At least 1.
    pub max_segments: u32,
    /// Flag.
    pub direct_io: u8,
    /// Flag.
    pub gpu_direct: u8,
    /// Flag.
    pub host_memory: u8,
    /// Flag.
    pub device_memory: u8,
    /// Flag.
    pub atomic_publish: u8,
    /// Flag.
    pub persistent: u8,
    /// Zero.
    pub reserved: [u8; 6],
}

/// `hicache_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_info {
    /// What the instance can do.
    pub capability: hicache_capability,
    /// Where it stores data.
    pub location: [c_char; TEXT_LEN],
}

/// `hicache_usage`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_usage {
    /// Total bytes or `UNKNOWN`.
    pub total_bytes: u64,
    /// Used bytes or `UNKNOWN`.
    pub used_bytes: u64,
    /// Available bytes or `UNKNOWN`.
    pub available_bytes: u64,
}

/// `hicache_segment`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_segment {
    /// Address of the range.
    pub addr: *mut c_void,
    /// Length.
    pub len: u64,
    /// Region id.
    pub region: u64,
    /// Offset in the region.
    pub offset: u64,
}

/// `hicache_item`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_item {
    /// Key bytes, NUL-terminated after `key_len`.
    pub key: *const c_char,
    /// Key length.
    pub key_len: u32,
    /// Segment count.
    pub n_segments: u32,
    /// Segments.
    pub segments: *const hicache_segment,
}

/// `hicache_batch`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_batch {
    /// `OP_*`.
    pub op: u32,
    /// Item count.
    pub n_items: u32,
    /// Items.
    pub items: *const hicache_item,
}

/// `hicache_result`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_result {
    /// The item's index in its batch.
    pub index: u32,
    /// A status.
    pub status: i32,
    /// Depends on the status.
    pub value: u64,
    /// Null or NUL-terminated text.
    pub message: *const c_char,
}

/// `hicache_complete_fn`.
pub type hicache_complete_fn =
    unsafe extern "C" fn(token: *mut c_void, results: *const hicache_result, n_results: u32);

/// `hicache_plugin_table_v1`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_plugin_table_v1 {
    /// `ABI_VERSION`.
    pub abi_version: u32,
    /// `size_of::<hicache_plugin_table_v1>()`.
    pub struct_size: u32,
    /// Name.
    pub name: *const c_char,
    /// Version.
    pub version: *const c_char,
    /// One line.
    pub summary: *const c_char,
    /// `KIND_*`.
    pub kind: u32,
    /// Priority.
    pub priority: i32,
    /// Parameters.
    pub params: *const hicache_param_spec,
    /// How many.
    pub n_params: u32,
    /// Zero.
    pub reserved: u32,
    /// Probe.
    pub probe: Option<unsafe extern "C" fn(*const hicache_config, *mut hicache_probe) -> i32>,
    /// Open.
    pub open: Option<
        unsafe extern "C" fn(*const hicache_config, *mut *mut c_void, *mut hicache_error) -> i32,
    >,
    /// Close.
    pub close: Option<unsafe extern "C" fn(*mut c_void)>,
    /// Info.
    pub info:
        Option<unsafe extern "C" fn(*mut c_void, *mut hicache_info, *mut hicache_error) -> i32>,
    /// Register memory.
    pub register_memory: Option<
        unsafe extern "C" fn(
            *mut c_void,
            u64,
            *mut c_void,
            u64,
            u32,
            u32,
            *mut hicache_error,
        ) -> i32,
    >,
    /// Deregister memory.
    pub deregister_memory:
        Option<unsafe extern "C" fn(*mut c_void, u64, *mut hicache_error) -> i32>,
    /// Submit a batch.
    pub submit: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *const hicache_batch,
            hicache_complete_fn,
            *mut c_void,
            *mut hicache_error,
        ) -> i32,
    >,
    /// Capacity figures.
    pub usage:
        Option<unsafe extern "C" fn(*mut c_void, *mut hicache_usage, *mut hicache_error) -> i32>,
    /// List (read only when `struct_size` covers it).
    pub list: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *const c_char,
            *const c_char,
            u32,
            hicache_page_fn,
            *mut c_void,
            *mut hicache_error,
        ) -> i32,
    >,
}

/// The size of a version-1 table without the fields added later (`list`): the least a
/// plugin's `struct_size` may be.
pub const TABLE_V1_BASE_SIZE: usize = std::mem::offset_of!(hicache_plugin_table_v1, list);

/// `hicache_listed`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hicache_listed {
    /// Key bytes.
    pub key: *const c_char,
    /// Their length.
    pub key_len: u32,
    /// Zero.
    pub reserved: u32,
    /// Bytes.
    pub size: u64,
    /// Nanoseconds since the Unix epoch, or `NO_TIME`.
    pub modified_ns: i64,
}

/// `HICACHE_NO_TIME`.
pub const NO_TIME: i64 = i64::MIN;
/// `HICACHE_CURSOR_MAX`.
pub const CURSOR_MAX: usize = 4096;

/// `hicache_page_fn`.
pub type hicache_page_fn = unsafe extern "C" fn(
    sink: *mut c_void,
    objects: *const hicache_listed,
    n_objects: u32,
    next: *const c_char,
);

/// The entry symbol's type.
pub type hicache_plugin_entry = unsafe extern "C" fn() -> *const hicache_plugin_table_v1;

impl hicache_error {
    /// An empty buffer.
    pub fn empty() -> Self {
        hicache_error {
            message: [0; TEXT_LEN],
        }
    }
}

impl hicache_probe {
    /// Empty buffers.
    pub fn empty() -> Self {
        hicache_probe {
            detail: [0; TEXT_LEN],
            hint: [0; TEXT_LEN],
        }
    }
}

impl hicache_info {
    /// Empty.
    pub fn empty() -> Self {
        hicache_info {
            capability: hicache_capability::default(),
            location: [0; TEXT_LEN],
        }
    }
}

/// The text of a host-lent buffer: up to the first NUL, or all of it when the plugin wrote
/// no NUL (never past the buffer), lossy UTF-8.
pub fn text(buf: &[c_char; TEXT_LEN]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Writes `s` into a lent buffer, cut to fit, always NUL-terminated.
pub fn write_text(buf: &mut [c_char; TEXT_LEN], s: &str) {
    let mut n = s.len().min(TEXT_LEN - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    for (dst, &b) in buf.iter_mut().zip(&s.as_bytes()[..n]) {
        *dst = b as c_char;
    }
    buf[n] = 0;
}
