/*
 * hicache plugin ABI, version 1: what a shared library exports to be loaded by hicache as
 * a storage plugin. Plain C11; no hicache code is linked into the plugin.
 *
 * A plugin exports one symbol, `hicache_plugin_v1`, returning a table (hicache_plugin_table_v1)
 * whose first two fields are HICACHE_PLUGIN_ABI_VERSION and sizeof(hicache_plugin_table_v1).
 * The host loads plugins only from its configured plugin dirs, with RTLD_NOW | RTLD_LOCAL,
 * and never unloads one.
 *
 * Ownership
 * - Strings and arrays in the table (name, version, summary, params) are owned by the
 *   plugin and must stay valid and unchanged for the life of the process. The host copies
 *   them when it loads the plugin.
 * - Everything the host passes in (configs, batches, keys, segments) is owned by the host
 *   and valid only during the call that receives it, except a submitted batch, which stays
 *   valid until the plugin has called its completion function.
 * - Everything the plugin passes back through a completion (results, their messages) is
 *   owned by the plugin and read by the host only during that completion call.
 * - Error and probe buffers (hicache_error, hicache_probe, hicache_info) belong to the
 *   host; the plugin writes NUL-terminated text into them and never more than their size.
 * - Registered memory: between register_memory and deregister_memory the plugin may read
 *   or write the memory of a region only for a batch that names it, between submit and the
 *   completion of that batch. The host keeps the memory alive and unshared meanwhile,
 *   even when the caller that asked for the batch gave up on it.
 *
 * Threads
 * - Every function may be called from any thread, and functions of one instance may run
 *   concurrently (several batches in flight at once). `close` is called once, when no
 *   batch of the instance is in flight, and never from inside a completion call.
 *
 * Completion
 * - `submit` returns HICACHE_OK when it accepted the batch: the plugin then calls `done`
 *   exactly once, from any thread, possibly before `submit` returns, with one result per
 *   item (in any order, each naming its item's index). Any other return refuses the whole
 *   batch: `done` is not called, and `err` says why.
 * - The host checks every completion: a wrong result count, an index outside the batch, a
 *   repeated index or an unknown status is reported to the caller as a plugin contract
 *   error for the affected items; it never reaches memory.
 *
 * Error text
 * - A function that fails writes its reason into the hicache_error buffer of that call; a
 *   failed item carries its message in its result. There is no "last error" accessor:
 *   a buffer per call cannot be overwritten by another thread.
 *
 * Failures
 * - A plugin must not let a C++ exception or a Rust panic escape a function of this ABI
 *   (hicache's Rust export macro catches panics and reports them as HICACHE_ERR_PANIC).
 *   A plugin that aborts takes the process with it: the host cannot catch that.
 */
#ifndef HICACHE_PLUGIN_H
#define HICACHE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HICACHE_PLUGIN_ABI_VERSION 1u
#define HICACHE_PLUGIN_ENTRY "hicache_plugin_v1"

/* Statuses: functions return them, results carry them. */
#define HICACHE_OK 0
/* Read only: no object under that key (not an error). */
#define HICACHE_MISS_NOT_FOUND 1
/* Read only: the object's length differs from the segments' total; value = its length. */
#define HICACHE_MISS_SIZE 2
/* An I/O or other failure; message says what. */
#define HICACHE_ERR_IO (-1)
/* The service or device is unavailable for now: trying again later may succeed. */
#define HICACHE_ERR_UNAVAILABLE (-2)
/* The item ran out of time; value = the limit in milliseconds. */
#define HICACHE_ERR_TIMEOUT (-3)
/* The plugin cannot do this (memory kind, operation, size); message says what. */
#define HICACHE_ERR_UNSUPPORTED (-4)
/* The request is invalid (bad key, bad segment, unknown region); message says what. */
#define HICACHE_ERR_INVALID (-5)
/* The plugin caught a panic or exception of its own. */
#define HICACHE_ERR_PANIC (-6)

/* Backend kinds. */
#define HICACHE_KIND_FILE 0u
#define HICACHE_KIND_OBJECT 1u

/* Parameter types (values always arrive as text, already checked against the type). */
#define HICACHE_PARAM_BOOL 1u  /* "true" or "false" */
#define HICACHE_PARAM_UINT 2u  /* decimal, fits int64_t */
#define HICACHE_PARAM_FLOAT 3u /* decimal */
#define HICACHE_PARAM_STR 4u

/* Memory kinds. */
#define HICACHE_MEM_HOST 0u
#define HICACHE_MEM_DEVICE 1u

/* Batch operations. */
#define HICACHE_OP_WRITE 1u
#define HICACHE_OP_READ 2u
#define HICACHE_OP_EXISTS 3u
#define HICACHE_OP_REMOVE 4u

/* A usage figure that is not known. */
#define HICACHE_UNKNOWN UINT64_MAX

#define HICACHE_TEXT_LEN 512

/* One parameter the plugin accepts. */
typedef struct hicache_param_spec {
    const char *name;          /* as written in config files */
    uint32_t type;             /* HICACHE_PARAM_* */
    uint32_t secret;           /* nonzero: a credential, never shown or logged */
    const char *doc;           /* one line */
    const char *default_value; /* as the config reference shows it; may be NULL */
} hicache_param_spec;

/* One parameter's value. */
typedef struct hicache_param_value {
    const char *name;
    const char *value;
} hicache_param_value;

/* What probe and open get: the storage dirs (FILE plugins) and the set parameters. */
typedef struct hicache_config {
    const char *const *storage_dirs; /* in routing order */
    uint32_t n_storage_dirs;
    uint32_t use_direct_io; /* nonzero: bypass the page cache where possible */
    const hicache_param_value *params;
    uint32_t n_params;
    uint32_t reserved;
} hicache_config;

/* Text the plugin writes for the host: NUL-terminated, at most HICACHE_TEXT_LEN bytes. */
typedef struct hicache_error {
    char message[HICACHE_TEXT_LEN];
} hicache_error;

/* A probe's finding: detail when usable, reason (and hint) when not. */
typedef struct hicache_probe {
    char detail[HICACHE_TEXT_LEN];
    char hint[HICACHE_TEXT_LEN];
} hicache_probe;

/* What an instance can do. */
typedef struct hicache_capability {
    uint64_t io_alignment;    /* bytes; 1 when anything goes; a power of two */
    uint64_t max_object_size; /* 0: unbounded */
    uint32_t max_segments;    /* at least 1 */
    uint8_t direct_io;
    uint8_t gpu_direct;
    uint8_t host_memory;
    uint8_t device_memory;
    uint8_t atomic_publish;
    uint8_t persistent;
    uint8_t reserved[6];
} hicache_capability;

/* An instance's identity. */
typedef struct hicache_info {
    hicache_capability capability;
    char location[HICACHE_TEXT_LEN]; /* where it stores data, for people */
} hicache_info;

/* Capacity figures; HICACHE_UNKNOWN where not known. */
typedef struct hicache_usage {
    uint64_t total_bytes;
    uint64_t used_bytes;
    uint64_t available_bytes;
} hicache_usage;

/* A range of registered memory. `addr` = the region's address + `offset`. */
typedef struct hicache_segment {
    void *addr;
    uint64_t len;
    uint64_t region; /* the id the host registered the region under */
    uint64_t offset;
} hicache_segment;

/* One object of a batch. The key is `key_len` bytes of UTF-8 (at most 255, NAME_MAX),
 * NUL-terminated after them; it is a safe file name: no '/', '\\' or control characters
 * and no leading '.' (so never "." or ".."). A file plugin must not lengthen it to make
 * other names (temp files, sidecars): that can pass NAME_MAX. Writes gather the segments
 * in order; reads scatter into them; exists and remove items have none. */
typedef struct hicache_item {
    const char *key;
    uint32_t key_len;
    uint32_t n_segments;
    const hicache_segment *segments;
} hicache_item;

typedef struct hicache_batch {
    uint32_t op; /* HICACHE_OP_* */
    uint32_t n_items;
    const hicache_item *items;
} hicache_batch;

/* The result of one item.
 * write, remove: HICACHE_OK or an error.
 * read: HICACHE_OK (read in full), HICACHE_MISS_NOT_FOUND, HICACHE_MISS_SIZE, or an error.
 * exists: HICACHE_OK with value 1 (exists) or 0, or an error.
 * message: NULL, or text about an error, read by the host during the completion call. */
typedef struct hicache_result {
    uint32_t index;
    int32_t status;
    uint64_t value;
    const char *message;
} hicache_result;

typedef void (*hicache_complete_fn)(void *token, const hicache_result *results,
                                    uint32_t n_results);

/* A modification time that is not known. */
#define HICACHE_NO_TIME INT64_MIN
/* The longest cursor a page may hand back, in bytes, without its NUL. */
#define HICACHE_CURSOR_MAX 4096u

/* One listed object. The key is `key_len` bytes (no NUL needed) and follows the rules of
 * hicache_item's keys. */
typedef struct hicache_listed {
    const char *key;
    uint32_t key_len;
    uint32_t reserved;
    uint64_t size;
    int64_t modified_ns; /* since the Unix epoch; HICACHE_NO_TIME when not known */
} hicache_listed;

/* Takes one page of a listing: the host copies the objects and the cursor during the call.
 * next: where the following page starts (NUL-terminated, at most HICACHE_CURSOR_MAX bytes,
 * text the host hands back unchanged), or NULL on the last page. */
typedef void (*hicache_page_fn)(void *sink, const hicache_listed *objects, uint32_t n_objects,
                                const char *next);

typedef struct hicache_plugin_table_v1 {
    uint32_t abi_version; /* HICACHE_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* sizeof(hicache_plugin_table_v1) */
    const char *name;     /* letters, digits, '_' and '-'; unique in the process */
    const char *version;
    const char *summary;  /* one line for `hicache plugins` */
    uint32_t kind;        /* HICACHE_KIND_* */
    int32_t priority;     /* third parties: below 100 unless the user should prefer them */
    const hicache_param_spec *params;
    uint32_t n_params;
    uint32_t reserved;

    /* Proves the plugin can work with this config here; no instance is needed. Returns
     * HICACHE_OK (usable; out->detail says what was checked) or anything else (unusable;
     * out->detail says why, out->hint what to do). */
    int32_t (*probe)(const hicache_config *config, hicache_probe *out);
    /* Creates an instance. */
    int32_t (*open)(const hicache_config *config, void **instance, hicache_error *err);
    /* Ends an instance: no batch is in flight. */
    void (*close)(void *instance);
    int32_t (*info)(void *instance, hicache_info *out, hicache_error *err);
    /* Makes `len` bytes at `addr` (of `mem_kind`, on CUDA device `device`) usable under
     * `region`; refuse a kind the capability does not accept. */
    int32_t (*register_memory)(void *instance, uint64_t region, void *addr, uint64_t len,
                               uint32_t mem_kind, uint32_t device, hicache_error *err);
    int32_t (*deregister_memory)(void *instance, uint64_t region, hicache_error *err);
    int32_t (*submit)(void *instance, const hicache_batch *batch, hicache_complete_fn done,
                      void *token, hicache_error *err);
    int32_t (*usage)(void *instance, hicache_usage *out, hicache_error *err);

    /* Added in version 1 after `usage`: the host reads it only when struct_size covers it,
     * so a table built before it loads with listing unsupported. NULL: the plugin cannot
     * list (the host reports that as unsupported).
     *
     * Lists complete objects (never temporary ones) whose keys start with `prefix`
     * (never NULL; "" for all), continuing after `cursor` (NULL: from the start;
     * otherwise a `next` this plugin handed back, or text it must refuse). On HICACHE_OK the plugin has called `page` exactly once, before
     * returning, with at most `limit` objects (limit >= 1); across the pages of one
     * listing, every object that exists throughout it appears exactly once. A cursor the
     * plugin cannot read is HICACHE_ERR_INVALID. The call may block. */
    int32_t (*list)(void *instance, const char *prefix, const char *cursor, uint32_t limit,
                    hicache_page_fn page, void *sink, hicache_error *err);
} hicache_plugin_table_v1;

/* Exported whatever the plugin's default symbol visibility (-fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define HICACHE_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define HICACHE_PLUGIN_EXPORT
#endif

/* The entry symbol every plugin exports. NULL means the plugin cannot initialise. */
HICACHE_PLUGIN_EXPORT const hicache_plugin_table_v1 *hicache_plugin_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* HICACHE_PLUGIN_H */
