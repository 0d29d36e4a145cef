/*
 * CFILE: a FILE plugin written in plain C against hicache_plugin.h, loaded by hicache at
 * run time. Each object is one file <storage dir>/cfile/<key>, written to a temporary file,
 * optionally flushed, and renamed over the name (atomic publish). Storage dirs are chosen
 * by an FNV-1a hash of the key. Batches complete before `submit` returns. `list` reads
 * every dir and sorts the names, and goes on after the last key it handed out.
 *
 * Build: cc -std=c11 -shared -fPIC -I../../include -o libcfile.so cfile.c -lpthread
 *
 * The HICACHE_BROKEN_* macros build deliberately broken variants, used by hicache's tests
 * to prove the host survives them; HICACHE_PLUGIN_NAME and HICACHE_PLUGIN_PRIORITY rename
 * it and change its priority; HICACHE_TABLE_BEFORE_LIST declares the table's size as a
 * plugin built before `list` was added to version 1 does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hicache_plugin.h"

#define MAX_DIRS 64
#define MAX_REGIONS 4096
#define MAX_SEGMENTS 64

typedef struct region {
    uint64_t id;
    char *addr;
    uint64_t len;
} region;

typedef struct cfile {
    int n_dirs;
    char *dirs[MAX_DIRS]; /* <storage dir>/cfile */
    int fsync_data;
    pthread_mutex_t lock;
    region regions[MAX_REGIONS];
    int n_regions;
    atomic_ulong temp;
} cfile;

static void set_text(char *buf, const char *fmt, const char *a, int err) {
    snprintf(buf, HICACHE_TEXT_LEN, fmt, a, strerror(err));
}

/* The parameter `fsync` (default true). */
static int want_fsync(const hicache_config *config) {
    for (uint32_t i = 0; i < config->n_params; i++) {
        if (strcmp(config->params[i].name, "fsync") == 0) {
            return strcmp(config->params[i].value, "true") == 0;
        }
    }
    return 1;
}

static int cfile_probe(const hicache_config *config, hicache_probe *out) {
    if (config->n_storage_dirs == 0) {
        snprintf(out->detail, HICACHE_TEXT_LEN, "no storage dir is configured");
        snprintf(out->hint, HICACHE_TEXT_LEN, "set storage_dir");
        return 1;
    }
    for (uint32_t i = 0; i < config->n_storage_dirs; i++) {
        const char *dir = config->storage_dirs[i];
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            set_text(out->detail, "cannot create %s: %s", dir, errno);
            snprintf(out->hint, HICACHE_TEXT_LEN, "point storage_dir at a writable directory");
            return 1;
        }
        if (access(dir, W_OK | X_OK) != 0) {
            set_text(out->detail, "cannot write %s: %s", dir, errno);
            snprintf(out->hint, HICACHE_TEXT_LEN, "point storage_dir at a writable directory");
            return 1;
        }
    }
    snprintf(out->detail, HICACHE_TEXT_LEN, "%u storage dir(s) writable", config->n_storage_dirs);
    return HICACHE_OK;
}

static void cfile_close(void *instance) {
    cfile *c = instance;
    for (int i = 0; i < c->n_dirs; i++) {
        free(c->dirs[i]);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static int cfile_open(const hicache_config *config, void **instance, hicache_error *err) {
    if (config->n_storage_dirs == 0 || config->n_storage_dirs > MAX_DIRS) {
        snprintf(err->message, HICACHE_TEXT_LEN, "between 1 and %d storage dirs are needed", MAX_DIRS);
        return HICACHE_ERR_INVALID;
    }
    cfile *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err->message, HICACHE_TEXT_LEN, "out of memory");
        return HICACHE_ERR_IO;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->fsync_data = want_fsync(config);
    for (uint32_t i = 0; i < config->n_storage_dirs; i++) {
        size_t n = strlen(config->storage_dirs[i]) + sizeof "/cfile";
        char *dir = malloc(n);
        if (dir == NULL) {
            cfile_close(c);
            snprintf(err->message, HICACHE_TEXT_LEN, "out of memory");
            return HICACHE_ERR_IO;
        }
        snprintf(dir, n, "%s/cfile", config->storage_dirs[i]);
        c->dirs[c->n_dirs++] = dir;
        if (mkdir(config->storage_dirs[i], 0755) != 0 && errno != EEXIST) {
            set_text(err->message, "mkdir %s: %s", config->storage_dirs[i], errno);
            cfile_close(c);
            return HICACHE_ERR_IO;
        }
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            set_text(err->message, "mkdir %s: %s", dir, errno);
            cfile_close(c);
            return HICACHE_ERR_IO;
        }
    }
#ifdef HICACHE_BROKEN_NULL_INSTANCE
    cfile_close(c);
    *instance = NULL;
#else
    *instance = c;
#endif
    return HICACHE_OK;
}

static int cfile_info(void *instance, hicache_info *out, hicache_error *err) {
    (void)err;
    cfile *c = instance;
#ifdef HICACHE_BROKEN_ALIGN
    out->capability.io_alignment = 3;
#else
    out->capability.io_alignment = 1;
#endif
    out->capability.max_object_size = 0;
    out->capability.max_segments = MAX_SEGMENTS;
    out->capability.host_memory = 1;
    out->capability.atomic_publish = 1;
    out->capability.persistent = 1;
    snprintf(out->location, HICACHE_TEXT_LEN, "%s", c->dirs[0]);
    return HICACHE_OK;
}

static int cfile_register(void *instance, uint64_t id, void *addr, uint64_t len,
                          uint32_t mem_kind, uint32_t device, hicache_error *err) {
    (void)device;
    cfile *c = instance;
    if (mem_kind != HICACHE_MEM_HOST) {
        snprintf(err->message, HICACHE_TEXT_LEN, "CFILE moves host memory only");
        return HICACHE_ERR_UNSUPPORTED;
    }
    pthread_mutex_lock(&c->lock);
    if (c->n_regions == MAX_REGIONS) {
        pthread_mutex_unlock(&c->lock);
        snprintf(err->message, HICACHE_TEXT_LEN, "at most %d regions", MAX_REGIONS);
        return HICACHE_ERR_UNSUPPORTED;
    }
    c->regions[c->n_regions++] = (region){id, addr, len};
    pthread_mutex_unlock(&c->lock);
    return HICACHE_OK;
}

static int cfile_deregister(void *instance, uint64_t id, hicache_error *err) {
    cfile *c = instance;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->n_regions; i++) {
        if (c->regions[i].id == id) {
            c->regions[i] = c->regions[--c->n_regions];
            pthread_mutex_unlock(&c->lock);
            return HICACHE_OK;
        }
    }
    pthread_mutex_unlock(&c->lock);
    snprintf(err->message, HICACHE_TEXT_LEN, "region %llu is not registered", (unsigned long long)id);
    return HICACHE_ERR_INVALID;
}

/* Whether every segment lies inside a region registered with this instance. */
static int segments_registered(cfile *c, const hicache_item *item) {
    int ok = 1;
    pthread_mutex_lock(&c->lock);
    for (uint32_t s = 0; s < item->n_segments && ok; s++) {
        const hicache_segment *seg = &item->segments[s];
        ok = 0;
        for (int r = 0; r < c->n_regions; r++) {
            const region *reg = &c->regions[r];
            if (reg->id == seg->region && seg->offset <= reg->len &&
                seg->len <= reg->len - seg->offset &&
                (char *)seg->addr == reg->addr + seg->offset) {
                ok = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
    return ok;
}

static uint64_t fnv1a(const char *s, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    }
    return h;
}

static const char *dir_of(cfile *c, const hicache_item *item) {
    return c->dirs[fnv1a(item->key, item->key_len) % (uint64_t)c->n_dirs];
}

/* Moves every byte of the segments with preadv/pwritev, continuing after short transfers.
 * Returns the bytes moved, or -1 with errno set. */
static long long move_all(int fd, const hicache_item *item, int writing) {
    struct iovec iov[MAX_SEGMENTS];
    uint32_t n = item->n_segments;
    for (uint32_t s = 0; s < n; s++) {
        iov[s].iov_base = item->segments[s].addr;
        iov[s].iov_len = item->segments[s].len;
    }
    long long done = 0;
    uint32_t first = 0;
    while (first < n) {
        ssize_t got = writing ? pwritev(fd, iov + first, (int)(n - first), done)
                              : preadv(fd, iov + first, (int)(n - first), done);
        if (got < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (got == 0) {
            break; /* end of file on a read */
        }
        done += got;
        while (first < n && (size_t)got >= iov[first].iov_len) {
            got -= (ssize_t)iov[first].iov_len;
            first++;
        }
        if (first < n) {
            iov[first].iov_base = (char *)iov[first].iov_base + got;
            iov[first].iov_len -= (size_t)got;
        }
    }
    return done;
}

static uint64_t total_len(const hicache_item *item) {
    uint64_t total = 0;
    for (uint32_t s = 0; s < item->n_segments; s++) {
        total += item->segments[s].len;
    }
    return total;
}

static void fail(hicache_result *r, char *msg, const char *what, const char *path, int err) {
    char where[HICACHE_TEXT_LEN];
    snprintf(where, sizeof where, "%s %s", what, path);
    set_text(msg, "%s: %s", where, err);
    r->status = HICACHE_ERR_IO;
    r->message = msg;
}

static void do_write(cfile *c, const hicache_item *item, hicache_result *r, char *msg) {
    char temp[PATH_MAX], path[PATH_MAX];
    const char *dir = dir_of(c, item);
    snprintf(temp, sizeof temp, "%s/.tmp-%d-%lu", dir, (int)getpid(),
             atomic_fetch_add(&c->temp, 1));
    snprintf(path, sizeof path, "%s/%s", dir, item->key);
    int fd = open(temp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        fail(r, msg, "create", temp, errno);
        return;
    }
    long long moved = move_all(fd, item, 1);
    if (moved < 0 || (uint64_t)moved != total_len(item)) {
        fail(r, msg, "write", temp, moved < 0 ? errno : EIO);
    } else if (c->fsync_data && fdatasync(fd) != 0) {
        fail(r, msg, "fdatasync", temp, errno);
    } else if (rename(temp, path) != 0) {
        fail(r, msg, "rename", path, errno);
    } else {
        r->status = HICACHE_OK;
    }
    close(fd);
    if (r->status != HICACHE_OK) {
        unlink(temp);
    }
}

static void do_read(cfile *c, const hicache_item *item, hicache_result *r, char *msg) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir_of(c, item), item->key);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) {
            r->status = HICACHE_MISS_NOT_FOUND;
        } else {
            fail(r, msg, "open", path, errno);
        }
        return;
    }
    struct stat st;
    uint64_t want = total_len(item);
    if (fstat(fd, &st) != 0) {
        fail(r, msg, "fstat", path, errno);
    } else if ((uint64_t)st.st_size != want) {
        r->status = HICACHE_MISS_SIZE;
        r->value = (uint64_t)st.st_size;
    } else {
        long long moved = move_all(fd, item, 0);
        if (moved < 0) {
            fail(r, msg, "read", path, errno);
        } else if ((uint64_t)moved != want) {
            r->status = HICACHE_MISS_SIZE; /* replaced by a shorter object meanwhile */
            r->value = (uint64_t)moved;
        } else {
            r->status = HICACHE_OK;
        }
    }
    close(fd);
}

static void do_exists(cfile *c, const hicache_item *item, hicache_result *r, char *msg) {
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir_of(c, item), item->key);
    if (lstat(path, &st) == 0) {
        r->status = HICACHE_OK;
        r->value = S_ISREG(st.st_mode) ? 1 : 0;
    } else if (errno == ENOENT) {
        r->status = HICACHE_OK;
        r->value = 0;
    } else {
        fail(r, msg, "stat", path, errno);
    }
}

static void do_remove(cfile *c, const hicache_item *item, hicache_result *r, char *msg) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir_of(c, item), item->key);
    if (unlink(path) == 0 || errno == ENOENT) {
        r->status = HICACHE_OK;
    } else {
        fail(r, msg, "unlink", path, errno);
    }
}

static int cfile_submit(void *instance, const hicache_batch *batch, hicache_complete_fn done,
                        void *token, hicache_error *err) {
    cfile *c = instance;
    uint32_t n = batch->n_items;
    /* One extra slot so the broken variants can claim more results than items. */
    hicache_result *results = calloc((size_t)n + 1, sizeof *results);
    char(*messages)[HICACHE_TEXT_LEN] = calloc((size_t)n + 1, HICACHE_TEXT_LEN);
    if (results == NULL || messages == NULL) {
        free(results);
        free(messages);
        snprintf(err->message, HICACHE_TEXT_LEN, "out of memory");
        return HICACHE_ERR_IO;
    }
    for (uint32_t i = 0; i < n; i++) {
        const hicache_item *item = &batch->items[i];
        hicache_result *r = &results[i];
        r->index = i;
        if (item->n_segments > MAX_SEGMENTS || !segments_registered(c, item)) {
            snprintf(messages[i], HICACHE_TEXT_LEN, "a segment is not inside a registered region");
            r->status = HICACHE_ERR_INVALID;
            r->message = messages[i];
            continue;
        }
        switch (batch->op) {
        case HICACHE_OP_WRITE: do_write(c, item, r, messages[i]); break;
        case HICACHE_OP_READ: do_read(c, item, r, messages[i]); break;
        case HICACHE_OP_EXISTS: do_exists(c, item, r, messages[i]); break;
        case HICACHE_OP_REMOVE: do_remove(c, item, r, messages[i]); break;
        default:
            free(results);
            free(messages);
            snprintf(err->message, HICACHE_TEXT_LEN, "unknown operation %u", batch->op);
            return HICACHE_ERR_INVALID;
        }
#ifdef HICACHE_BROKEN_STATUS
        r->status = 42;
#endif
    }
    uint32_t n_results = n;
#ifdef HICACHE_BROKEN_COUNT
    n_results = n + 1;
#endif
#ifdef HICACHE_BROKEN_INDEX
    if (n > 0) {
        results[0].index = n + 7;
    }
#endif
#ifdef HICACHE_BROKEN_DUP
    for (uint32_t i = 0; i < n; i++) {
        results[i].index = 0;
    }
#endif
#ifdef HICACHE_BROKEN_NULL_RESULTS
    done(token, NULL, n_results);
#else
    done(token, results, n_results);
#endif
#ifdef HICACHE_BROKEN_TWICE
    done(token, results, n_results);
#endif
    free(results);
    free(messages);
    return HICACHE_OK;
}

static int cfile_usage(void *instance, hicache_usage *out, hicache_error *err) {
    cfile *c = instance;
    struct statvfs vfs;
    if (statvfs(c->dirs[0], &vfs) != 0) {
        set_text(err->message, "statvfs %s: %s", c->dirs[0], errno);
        return HICACHE_ERR_IO;
    }
    out->total_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
    out->available_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    out->used_bytes = HICACHE_UNKNOWN;
    return HICACHE_OK;
}

/* One object found by a listing. */
typedef struct found {
    char *key;
    uint64_t size;
    int64_t modified_ns;
} found;

static int by_key(const void *a, const void *b) {
    return strcmp(((const found *)a)->key, ((const found *)b)->key);
}

/* Whether a file name can be an object key: temporary files start with '.'. */
static int is_key(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 220 || name[0] == '.') {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\\') {
            return 0;
        }
    }
    return 1;
}

static void free_found(found *all, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(all[i].key);
    }
    free(all);
}

/* Every dir is read whole and sorted; the cursor is the last key handed out, so a page
 * goes on after it whatever was written or removed meanwhile. */
static int cfile_list(void *instance, const char *prefix, const char *cursor, uint32_t limit,
                      hicache_page_fn page, void *sink, hicache_error *err) {
    cfile *c = instance;
    found *all = NULL;
    size_t n = 0, cap = 0;
    size_t prefix_len = strlen(prefix);
    for (int d = 0; d < c->n_dirs; d++) {
        DIR *dir = opendir(c->dirs[d]);
        if (dir == NULL) {
            set_text(err->message, "opendir %s: %s", c->dirs[d], errno);
            free_found(all, n);
            return HICACHE_ERR_IO;
        }
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            struct stat st;
            if (!is_key(e->d_name) || strncmp(e->d_name, prefix, prefix_len) != 0 ||
                (cursor != NULL && strcmp(e->d_name, cursor) <= 0) ||
                fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(st.st_mode)) {
                continue;
            }
            if (n == cap) {
                size_t grown = cap ? cap * 2 : 64;
                found *more = realloc(all, grown * sizeof *all);
                if (more == NULL) {
                    closedir(dir);
                    free_found(all, n);
                    snprintf(err->message, HICACHE_TEXT_LEN, "out of memory");
                    return HICACHE_ERR_IO;
                }
                all = more;
                cap = grown;
            }
            all[n].key = strdup(e->d_name);
            if (all[n].key == NULL) {
                closedir(dir);
                free_found(all, n);
                snprintf(err->message, HICACHE_TEXT_LEN, "out of memory");
                return HICACHE_ERR_IO;
            }
            all[n].size = (uint64_t)st.st_size;
            all[n].modified_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
            n++;
        }
        closedir(dir);
    }
    if (n > 0) {
        qsort(all, n, sizeof *all, by_key);
    }
    size_t shown = n < limit ? n : limit;
#ifdef HICACHE_BROKEN_LIST_OVER
    shown = n; /* ignores the limit */
#endif
    hicache_listed *out = calloc(shown ? shown : 1, sizeof *out);
    if (out == NULL) {
        free_found(all, n);
        snprintf(err->message, HICACHE_TEXT_LEN, "out of memory");
        return HICACHE_ERR_IO;
    }
    for (size_t i = 0; i < shown; i++) {
        out[i].key = all[i].key;
        out[i].key_len = (uint32_t)strlen(all[i].key);
        out[i].size = all[i].size;
        out[i].modified_ns = all[i].modified_ns;
    }
#ifdef HICACHE_BROKEN_LIST_KEY
    if (shown > 0) {
        out[0].key = "../escape";
        out[0].key_len = 9;
    }
#endif
    const char *next = shown < n ? all[shown - 1].key : NULL;
#ifdef HICACHE_BROKEN_LIST_SILENT
    (void)page, (void)sink, (void)next; /* returns OK without handing the page over */
#else
    page(sink, out, (uint32_t)shown, next);
#endif
#ifdef HICACHE_BROKEN_LIST_TWICE
    page(sink, out, (uint32_t)shown, next);
#endif
    free(out);
    free_found(all, n);
    return HICACHE_OK;
}

static const hicache_param_spec PARAMS[] = {
    {"fsync", HICACHE_PARAM_BOOL, 0, "flush each object to stable storage before publishing it",
     "true"},
};

static const hicache_plugin_table_v1 TABLE = {
#ifdef HICACHE_BROKEN_ABI
    .abi_version = 99,
#else
    .abi_version = HICACHE_PLUGIN_ABI_VERSION,
#endif
#ifdef HICACHE_BROKEN_SIZE
    .struct_size = 16,
#elif defined(HICACHE_TABLE_BEFORE_LIST)
    /* As a plugin built before `list` was added declares it. */
    .struct_size = offsetof(hicache_plugin_table_v1, list),
#else
    .struct_size = sizeof(hicache_plugin_table_v1),
#endif
#ifdef HICACHE_BROKEN_NULL_NAME
    .name = NULL,
#elif defined(HICACHE_PLUGIN_NAME)
    .name = HICACHE_PLUGIN_NAME,
#else
    .name = "CFILE",
#endif
    .version = "1.0.0",
    .summary = "one file per object under cfile/ (C example)",
    .kind = HICACHE_KIND_FILE,
#ifdef HICACHE_PLUGIN_PRIORITY
    .priority = HICACHE_PLUGIN_PRIORITY,
#else
    .priority = 5,
#endif
    .params = PARAMS,
    .n_params = sizeof PARAMS / sizeof PARAMS[0],
    .probe = cfile_probe,
    .open = cfile_open,
    .close = cfile_close,
    .info = cfile_info,
    .register_memory = cfile_register,
    .deregister_memory = cfile_deregister,
#ifdef HICACHE_BROKEN_NULL_SUBMIT
    .submit = NULL,
#else
    .submit = cfile_submit,
#endif
    .usage = cfile_usage,
#ifdef HICACHE_BROKEN_NO_LIST
    .list = NULL,
#else
    .list = cfile_list,
#endif
};

#ifdef HICACHE_BROKEN_NO_ENTRY
const hicache_plugin_table_v1 *hicache_plugin_v0(void) { return &TABLE; }
#else
const hicache_plugin_table_v1 *hicache_plugin_v1(void) {
#ifdef HICACHE_BROKEN_NULL_SUBMIT
    (void)cfile_submit;
#endif
#ifdef HICACHE_BROKEN_NO_LIST
    (void)cfile_list;
#endif
#ifdef HICACHE_BROKEN_INIT
    (void)TABLE;
    return NULL;
#else
    return &TABLE;
#endif
}
#endif
