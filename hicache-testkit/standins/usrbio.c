/*
 * A stand-in for 3FS's USRBIO client library (libhf3fs_api_shared.so), for tests on machines
 * without a 3FS cluster: it exports the functions hicache calls, with hf3fs_usrbio.h's struct
 * layouts and return conventions, and does the I/O with pread/pwrite inside this process.
 * It proves that hicache's FFI layer (loading, layouts, conventions, ring and iov
 * bookkeeping) is right; it proves nothing about 3FS itself, its FUSE process, RDMA or a
 * cluster, which only a run against a real mount shows.
 *
 * Faithful where hicache depends on it:
 * - a "mount" is a dir holding a file named `.hf3fs-stand-in-mount`: extract_mount_point
 *   answers the mount's length + 1 for a path under it and -1 elsewhere (and the needed
 *   length, larger than `size`, when the buffer is too small); hf3fs_is_hf3fs answers for an
 *   fd under a mount;
 * - hf3fs_reg_fd returns 0 on success and a *positive* errno on failure (EBADF for a bad fd,
 *   EINVAL for an fd number registered already: deregister a closed, reused number first);
 * - an I/O must lie inside its iov (prep_io: -EINVAL) and match its ring's direction
 *   (-EINVAL); a full ring is -EAGAIN; the fd must be registered (-EBADF);
 * - wait_for_ios may return fewer completions than are ready (at most half of `cqec`,
 *   rounded up), each once, with the bytes moved (short at the end of a file) or -errno.
 * - a mount has the virtual dir `3fs-virt/iovs` (the stand-in's mount must be made with it):
 *   iovcreate and iorcreate4 answer -ENOENT without it, as 3FS's do when they cannot publish
 *   their shared memory there;
 * - a wrapped iov (hf3fs_iovwrap) is memory the caller published as 3FS asks: a symlink
 *   `<mount>/3fs-virt/iovs/<id as 32 hex digits>` to a file under /dev/shm, which the FUSE
 *   process maps itself. The stand-in does the same: an I/O on a wrapped iov moves bytes
 *   through the stand-in's *own* MAP_SHARED mapping of the linked file, at the I/O's offset in
 *   the iov, never through the caller's pointer, so data reaches the caller's memory only if
 *   that memory really is the published file. A missing link fails the I/O with -ENOENT (the
 *   FUSE process does not know the iov). Where 3FS checks the link when it is made (a target
 *   outside /dev/shm, a file too small), the stand-in checks it in iovwrap (-EINVAL, -ENOENT).
 *   It keeps up to 64 mappings; when they are all taken, those whose links are gone (iovs
 *   their owners destroyed) are dropped first, and an I/O on a 65th iov whose link is alive
 *   fails with -ENOMEM.
 * hicache_usrbio_stand_in_fail(call, code) makes the next calls of one function fail with
 * `code` (an errno; 0 clears): prep_io and wait_for_ios return -code, reg_fd returns code,
 * iovcreate, iovwrap and iorcreate4 return -code, and "io" makes every I/O's result -code.
 * hicache_usrbio_stand_in_delay(micros) makes every I/O take at least that long (0 clears).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MARKER ".hf3fs-stand-in-mount"
#define MAX_FDS 4096
#define MAX_CALLS 8
#define MAX_VIEWS 64
#define SHM_PREFIX "/dev/shm/"

struct hf3fs_iov {
    uint8_t *base;
    void *iovh;
    char id[16];
    char mount_point[256];
    size_t size;
    size_t block_size;
    int numa;
};

struct hf3fs_ior {
    struct hf3fs_iov iov;
    void *iorh;
    char mount_point[256];
    bool for_read;
    int io_depth;
    int priority;
    int timeout;
    uint64_t flags;
};

struct hf3fs_cqe {
    int32_t index;
    int32_t reserved;
    int64_t result;
    const void *userdata;
};

/* One prepared I/O, then its completion. */
typedef struct {
    bool used, done;
    int fd;
    uint8_t *ptr;
    size_t len;
    off_t off;
    int64_t result;
    const void *userdata;
    /* On a wrapped iov: where the I/O lies in it, found through the FUSE side's own view. */
    bool wrapped;
    uint8_t id[16];
    char mount[256];
    size_t iov_off, iov_size;
} slot;

/* The FUSE side's mapping of one published iov. */
typedef struct {
    bool used;
    uint8_t id[16];
    dev_t dev;
    ino_t ino;
    uint8_t *map;
    size_t size;
    char link[PATH_MAX]; /* `<mount>/3fs-virt/iovs/<id>`: gone once the iov is destroyed */
} view;

typedef struct {
    int entries;
    slot *slots;
    pthread_mutex_t lock;
} ring;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool registered[MAX_FDS];
static struct { char call[32]; int code; } failing[MAX_CALLS];
static view views[MAX_VIEWS];
static long delay_micros;

EXPORT void hicache_usrbio_stand_in(void) {}

EXPORT void hicache_usrbio_stand_in_fail(const char *call, int code) {
    pthread_mutex_lock(&lock);
    int free_at = -1;
    for (int i = 0; i < MAX_CALLS; i++) {
        if (strcmp(failing[i].call, call) == 0) {
            failing[i].code = code;
            pthread_mutex_unlock(&lock);
            return;
        }
        if (failing[i].call[0] == 0 && free_at < 0) {
            free_at = i;
        }
    }
    if (free_at >= 0 && code != 0) {
        snprintf(failing[free_at].call, sizeof failing[free_at].call, "%s", call);
        failing[free_at].code = code;
    }
    pthread_mutex_unlock(&lock);
}

EXPORT void hicache_usrbio_stand_in_delay(long micros) {
    pthread_mutex_lock(&lock);
    delay_micros = micros > 0 ? micros : 0;
    pthread_mutex_unlock(&lock);
}

static int injected(const char *call) {
    pthread_mutex_lock(&lock);
    int code = 0;
    for (int i = 0; i < MAX_CALLS; i++) {
        if (strcmp(failing[i].call, call) == 0) {
            code = failing[i].code;
        }
    }
    pthread_mutex_unlock(&lock);
    return code;
}

/* The mount `path` lies under (the nearest ancestor holding the marker), into `out`; its
 * length, or -1. */
static int mount_of(const char *path, char *out, size_t size) {
    char dir[PATH_MAX];
    if (realpath(path, dir) == NULL) {
        /* A file not created yet: look from its dir. */
        char copy[PATH_MAX];
        snprintf(copy, sizeof copy, "%s", path);
        char *slash = strrchr(copy, '/');
        if (slash == NULL) {
            return -1;
        }
        *slash = 0;
        if (realpath(copy[0] ? copy : "/", dir) == NULL) {
            return -1;
        }
    }
    for (;;) {
        char marker[PATH_MAX + sizeof MARKER + 1];
        snprintf(marker, sizeof marker, "%s/%s", strcmp(dir, "/") ? dir : "", MARKER);
        struct stat st;
        if (stat(marker, &st) == 0) {
            int n = (int)strlen(dir);
            if (out != NULL && (size_t)n < size) {
                memcpy(out, dir, (size_t)n + 1);
            }
            return n;
        }
        char *slash = strrchr(dir, '/');
        if (slash == NULL || slash == dir) {
            if (strcmp(dir, "/") == 0) {
                return -1;
            }
            strcpy(dir, "/");
            continue;
        }
        *slash = 0;
    }
}

EXPORT int hf3fs_extract_mount_point(char *out, int size, const char *path) {
    if (path == NULL || size < 0) {
        return -1;
    }
    char found[PATH_MAX];
    int n = mount_of(path, found, sizeof found);
    if (n < 0) {
        return -1;
    }
    if (out != NULL && n + 1 <= size) {
        memcpy(out, found, (size_t)n + 1);
    }
    return n + 1;
}

EXPORT bool hf3fs_is_hf3fs(int fd) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) {
        return false;
    }
    path[n] = 0;
    return mount_of(path, NULL, 0) >= 0;
}

static int on_mount(const char *mount) {
    char found[PATH_MAX];
    int n = mount_of(mount, found, sizeof found);
    return n >= 0 && strcmp(found, mount) == 0;
}

/* Whether the mount has the virtual dir shared memory is published in. */
static bool has_virt_dir(const char *mount) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/3fs-virt/iovs", mount);
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The path of iov `id`'s link under `mount`. */
static void link_of(const char *mount, const uint8_t id[16], char *link, size_t cap) {
    int at = snprintf(link, cap, "%s/3fs-virt/iovs/", mount);
    for (int i = 0; i < 16 && at > 0 && (size_t)at + 2 < cap; i++) {
        at += snprintf(link + at, cap - (size_t)at, "%02x", id[i]);
    }
}

/* The published file of iov `id` under `mount`, resolved and checked as 3FS's FUSE process
 * does when the link is made: 0 with its path in `target`, or an errno. */
static int published(const char *mount, const uint8_t id[16], size_t size, char *target,
                     struct stat *st) {
    char link[PATH_MAX];
    link_of(mount, id, link, sizeof link);
    if (realpath(link, target) == NULL) {
        return ENOENT;
    }
    if (strncmp(target, SHM_PREFIX, strlen(SHM_PREFIX)) != 0) {
        return EINVAL;
    }
    if (stat(target, st) != 0) {
        return ENOENT;
    }
    if (!S_ISREG(st->st_mode) || (size_t)st->st_size < size) {
        return EINVAL;
    }
    return 0;
}

/* The FUSE side's own mapping of iov `id` (mapped on first use, remapped if the link now
 * names another file), or NULL with `*err` set. */
static uint8_t *fuse_view(const char *mount, const uint8_t id[16], size_t size, int *err) {
    char target[PATH_MAX];
    struct stat st;
    int bad = published(mount, id, size, target, &st);
    pthread_mutex_lock(&lock);
    int at = -1, free_at = -1;
    for (int i = 0; i < MAX_VIEWS; i++) {
        if (views[i].used && memcmp(views[i].id, id, 16) == 0) {
            at = i;
        } else if (!views[i].used && free_at < 0) {
            free_at = i;
        }
    }
    if (at >= 0 && (bad != 0 || views[at].dev != st.st_dev || views[at].ino != st.st_ino ||
                    views[at].size != size)) {
        /* The link went (the FUSE process drops the iov), or names another file now. */
        munmap(views[at].map, views[at].size);
        views[at].used = false;
        free_at = at;
        at = -1;
    }
    if (bad != 0) {
        pthread_mutex_unlock(&lock);
        *err = bad;
        return NULL;
    }
    if (at < 0 && free_at < 0) {
        /* The table is full: drop the mappings of iovs whose links went (destroyed by their
         * owners, whose I/O on them has ended), as the FUSE process drops them. */
        for (int i = 0; i < MAX_VIEWS; i++) {
            struct stat lst;
            if (views[i].used && lstat(views[i].link, &lst) != 0) {
                munmap(views[i].map, views[i].size);
                views[i].used = false;
                if (free_at < 0) {
                    free_at = i;
                }
            }
        }
    }
    if (at < 0) {
        int fd = free_at < 0 ? -1 : open(target, O_RDWR | O_CLOEXEC);
        void *map = fd < 0 ? MAP_FAILED
                           : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0) {
            close(fd);
        }
        if (map == MAP_FAILED) {
            pthread_mutex_unlock(&lock);
            *err = free_at < 0 ? ENOMEM : EIO;
            return NULL;
        }
        views[free_at] = (view){.used = true, .dev = st.st_dev, .ino = st.st_ino,
                                .map = map, .size = size};
        memcpy(views[free_at].id, id, 16);
        link_of(mount, id, views[free_at].link, sizeof views[free_at].link);
        at = free_at;
    }
    uint8_t *map = views[at].map;
    pthread_mutex_unlock(&lock);
    return map;
}

EXPORT int hf3fs_iovcreate(struct hf3fs_iov *iov, const char *mount, size_t size,
                           size_t block_size, int numa) {
    int code = injected("hf3fs_iovcreate");
    if (code != 0) {
        return -code;
    }
    if (iov == NULL || mount == NULL || size == 0) {
        return -EINVAL;
    }
    if (!on_mount(mount) || !has_virt_dir(mount)) {
        return -ENOENT;
    }
    void *base = NULL;
    if (posix_memalign(&base, 4096, size) != 0) {
        return -ENOMEM;
    }
    memset(base, 0, size);
    memset(iov, 0, sizeof *iov);
    iov->base = base;
    iov->iovh = base; /* marks an iov this library allocated */
    snprintf(iov->mount_point, sizeof iov->mount_point, "%s", mount);
    iov->size = size;
    iov->block_size = block_size;
    iov->numa = numa;
    return 0;
}

EXPORT int hf3fs_iovwrap(struct hf3fs_iov *iov, void *base, const uint8_t id[16],
                         const char *mount, size_t size, size_t block_size, int numa) {
    int code = injected("hf3fs_iovwrap");
    if (code != 0) {
        return -code;
    }
    if (iov == NULL || base == NULL || id == NULL || mount == NULL || size == 0 ||
        strlen(mount) >= sizeof iov->mount_point) {
        return -EINVAL;
    }
    if (!on_mount(mount)) {
        return -ENOENT;
    }
    char target[PATH_MAX];
    struct stat st;
    int bad = published(mount, id, size, target, &st);
    if (bad != 0) {
        return -bad;
    }
    memset(iov, 0, sizeof *iov);
    iov->base = base;
    iov->iovh = NULL; /* wrapped: never freed here */
    memcpy(iov->id, id, 16);
    snprintf(iov->mount_point, sizeof iov->mount_point, "%s", mount);
    iov->size = size;
    iov->block_size = block_size;
    iov->numa = numa;
    return 0;
}

EXPORT void hf3fs_iovunlink(struct hf3fs_iov *iov) { (void)iov; }

EXPORT void hf3fs_iovdestroy(struct hf3fs_iov *iov) {
    if (iov != NULL && iov->iovh != NULL) {
        free(iov->iovh);
    }
    if (iov != NULL) {
        iov->base = NULL;
        iov->iovh = NULL;
    }
}

EXPORT size_t hf3fs_ior_size(int entries) {
    return entries > 0 ? sizeof(ring) + (size_t)entries * sizeof(slot) : 0;
}

EXPORT int hf3fs_iorcreate4(struct hf3fs_ior *ior, const char *mount, int entries, bool for_read,
                            int io_depth, int timeout, int numa, uint64_t flags) {
    int code = injected("hf3fs_iorcreate4");
    if (code != 0) {
        return -code;
    }
    if (ior == NULL || mount == NULL || entries <= 0) {
        return -EINVAL;
    }
    if (!on_mount(mount) || !has_virt_dir(mount)) {
        return -ENOENT;
    }
    ring *r = calloc(1, sizeof *r);
    if (r == NULL || (r->slots = calloc((size_t)entries, sizeof *r->slots)) == NULL) {
        free(r);
        return -ENOMEM;
    }
    r->entries = entries;
    pthread_mutex_init(&r->lock, NULL);
    memset(ior, 0, sizeof *ior);
    ior->iorh = r;
    snprintf(ior->mount_point, sizeof ior->mount_point, "%s", mount);
    ior->for_read = for_read;
    ior->io_depth = io_depth;
    ior->timeout = timeout;
    ior->flags = flags;
    (void)numa;
    return 0;
}

EXPORT void hf3fs_iordestroy(struct hf3fs_ior *ior) {
    if (ior == NULL || ior->iorh == NULL) {
        return;
    }
    ring *r = ior->iorh;
    pthread_mutex_destroy(&r->lock);
    free(r->slots);
    free(r);
    ior->iorh = NULL;
}

EXPORT int hf3fs_reg_fd(int fd, uint64_t flags) {
    (void)flags;
    int code = injected("hf3fs_reg_fd");
    if (code != 0) {
        return code;
    }
    if (fd < 0 || fd >= MAX_FDS || fcntl(fd, F_GETFD) < 0) {
        return EBADF;
    }
    pthread_mutex_lock(&lock);
    bool twice = registered[fd];
    registered[fd] = true;
    pthread_mutex_unlock(&lock);
    return twice ? EINVAL : 0;
}

EXPORT void hf3fs_dereg_fd(int fd) {
    if (fd >= 0 && fd < MAX_FDS) {
        pthread_mutex_lock(&lock);
        registered[fd] = false;
        pthread_mutex_unlock(&lock);
    }
}

EXPORT int hf3fs_io_entries(const struct hf3fs_ior *ior) {
    return ior != NULL && ior->iorh != NULL ? ((ring *)ior->iorh)->entries : 0;
}

EXPORT int hf3fs_prep_io(const struct hf3fs_ior *ior, const struct hf3fs_iov *iov, bool read,
                         void *ptr, int fd, size_t off, uint64_t len, const void *userdata) {
    int code = injected("hf3fs_prep_io");
    if (code != 0) {
        return -code;
    }
    if (ior == NULL || ior->iorh == NULL || iov == NULL || iov->base == NULL) {
        return -EINVAL;
    }
    if (read != ior->for_read) {
        return -EINVAL;
    }
    uint8_t *p = ptr;
    if (p < iov->base || len > iov->size || p > iov->base + (iov->size - len)) {
        return -EINVAL;
    }
    pthread_mutex_lock(&lock);
    bool known = fd >= 0 && fd < MAX_FDS && registered[fd];
    pthread_mutex_unlock(&lock);
    if (!known) {
        return -EBADF;
    }
    ring *r = ior->iorh;
    pthread_mutex_lock(&r->lock);
    int at = -1;
    for (int i = 0; i < r->entries; i++) {
        if (!r->slots[i].used) {
            at = i;
            break;
        }
    }
    if (at < 0) {
        pthread_mutex_unlock(&r->lock);
        return -EAGAIN;
    }
    r->slots[at] = (slot){.used = true, .done = false, .fd = fd, .ptr = p, .len = len,
                          .off = (off_t)off, .result = 0, .userdata = userdata,
                          .wrapped = iov->iovh == NULL, .iov_off = (size_t)(p - iov->base),
                          .iov_size = iov->size};
    if (iov->iovh == NULL) {
        memcpy(r->slots[at].id, iov->id, 16);
        snprintf(r->slots[at].mount, sizeof r->slots[at].mount, "%s", iov->mount_point);
    }
    pthread_mutex_unlock(&r->lock);
    return at;
}

/* Runs every prepared I/O that has not run yet. */
EXPORT int hf3fs_submit_ios(const struct hf3fs_ior *ior) {
    int code = injected("hf3fs_submit_ios");
    if (code != 0) {
        return -code;
    }
    if (ior == NULL || ior->iorh == NULL) {
        return -EINVAL;
    }
    int failing_io = injected("io");
    pthread_mutex_lock(&lock);
    long micros = delay_micros;
    pthread_mutex_unlock(&lock);
    ring *r = ior->iorh;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->entries; i++) {
        slot *s = &r->slots[i];
        if (!s->used || s->done) {
            continue;
        }
        if (micros > 0) {
            struct timespec pause = {.tv_sec = micros / 1000000,
                                     .tv_nsec = (micros % 1000000) * 1000};
            nanosleep(&pause, NULL);
        }
        uint8_t *ptr = s->ptr;
        int unknown = 0;
        if (failing_io == 0 && s->wrapped) {
            uint8_t *map = fuse_view(s->mount, s->id, s->iov_size, &unknown);
            ptr = map == NULL ? NULL : map + s->iov_off;
        }
        if (failing_io != 0) {
            s->result = -failing_io;
        } else if (ptr == NULL) {
            s->result = -unknown;
        } else {
            size_t moved = 0;
            s->result = 0;
            while (moved < s->len) {
                ssize_t n = ior->for_read
                                ? pread(s->fd, ptr + moved, s->len - moved, s->off + (off_t)moved)
                                : pwrite(s->fd, ptr + moved, s->len - moved, s->off + (off_t)moved);
                if (n < 0 && errno == EINTR) {
                    continue;
                }
                if (n < 0) {
                    s->result = -errno;
                    break;
                }
                if (n == 0) {
                    break;
                }
                moved += (size_t)n;
            }
            if (s->result == 0) {
                s->result = (int64_t)moved;
            }
        }
        s->done = true;
    }
    pthread_mutex_unlock(&r->lock);
    return 0;
}

EXPORT int hf3fs_wait_for_ios(const struct hf3fs_ior *ior, struct hf3fs_cqe *cqes, int cqec,
                              int min_results, const void *abs_timeout) {
    (void)min_results;
    (void)abs_timeout;
    int code = injected("hf3fs_wait_for_ios");
    if (code != 0) {
        return -code;
    }
    if (ior == NULL || ior->iorh == NULL || cqes == NULL || cqec <= 0) {
        return -EINVAL;
    }
    ring *r = ior->iorh;
    int most = (cqec + 1) / 2;
    int n = 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->entries && n < most; i++) {
        slot *s = &r->slots[i];
        if (s->used && s->done) {
            cqes[n] = (struct hf3fs_cqe){.index = i, .reserved = 0, .result = s->result,
                                         .userdata = s->userdata};
            s->used = false;
            s->done = false;
            n++;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}
