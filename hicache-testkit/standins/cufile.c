/*
 * A stand-in for NVIDIA's libcufile, for tests on machines without CUDA: it exports the
 * cuFile functions hicache calls, with cufile.h's types and return conventions, and does
 * the I/O with pread/pwrite on host memory. It proves that hicache's FFI layer (loading,
 * layouts, error mapping, handle and buffer bookkeeping) is right; it proves nothing about
 * GPU memory, DMA or NVIDIA's driver, which only a run on a CUDA machine shows.
 *
 * Faithful where hicache depends on it:
 * - every call but cuFileDriverOpen needs the driver open (CU_FILE_DRIVER_NOT_INITIALIZED);
 * - cuFileHandleRegister checks the descriptor's type (CU_FILE_INVALID_FILE_TYPE) and the fd
 *   (CU_FILE_INVALID_VALUE), and like cuFile 1.15.1 (measured on the H200) refuses a
 *   descriptor whose flags hold O_NONBLOCK or O_NOFOLLOW (CU_FILE_INVALID_FILE_OPEN_FLAG);
 * - a buffer registered twice is CU_FILE_MEMORY_ALREADY_REGISTERED, deregistering one that
 *   is not registered CU_FILE_MEMORY_NOT_REGISTERED;
 * - cuFileRead/cuFileWrite return the bytes moved, -1 with errno for an OS error, or a
 *   negative CUfileOpError;
 * - a batch context holds at most 128 requests (cufile.json's default io_batchsize; more is
 *   CU_FILE_INVALID_VALUE at set-up);
 * - the batch API takes at most the context's capacity, and hands each request's event
 *   back once, with its cookie, CUFILE_COMPLETE and the bytes moved, or CUFILE_FAILED and
 *   a negative errno or error; like cuFile 1.15.1 in compat mode, it ignores a request's
 *   devPtr_offset. Unlike the real library it runs requests when submitted.
 * hicache_cufile_stand_in_fail(call, code) makes the next calls of one function fail with
 * `code` (0 clears), to test the mapping of errors such as 5027 (the udev trap).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* cufile.json's default "io_batchsize": the most requests one batch context may hold. */
#define IO_BATCHSIZE 128

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct {
    int type;
    union { int fd; void *handle; } handle;
    const void *fs_ops;
} CUfileDescr_t;

enum {
    SUCCESS = 0,
    DRIVER_NOT_INITIALIZED = 5001,
    INVALID_FILE_TYPE = 5018,
    INVALID_FILE_OPEN_FLAG = 5019,
    INVALID_VALUE = 5022,
    MEMORY_ALREADY_REGISTERED = 5023,
    MEMORY_NOT_REGISTERED = 5024,
    HANDLE_NOT_REGISTERED = 5027,
};

#define MAX_BUFFERS 1024
#define MAX_CALLS 8

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int driver_opens;
static const void *buffers[MAX_BUFFERS];
static char failing_call[MAX_CALLS][32];
static int failing_code[MAX_CALLS];

typedef struct handle { int fd; } handle;

static CUfileError_t status(int err) {
    CUfileError_t s = {err, 0};
    return s;
}

/* The injected failure for `call`, or 0. */
static int injected(const char *call) {
    int code = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CALLS; i++) {
        if (failing_code[i] != 0 && strcmp(failing_call[i], call) == 0) {
            code = failing_code[i];
        }
    }
    pthread_mutex_unlock(&lock);
    return code;
}

static int driver_is_open(void) {
    pthread_mutex_lock(&lock);
    int open = driver_opens > 0;
    pthread_mutex_unlock(&lock);
    return open;
}

EXPORT void hicache_cufile_stand_in(void) {}

EXPORT void hicache_cufile_stand_in_fail(const char *call, int code) {
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int i = 0; i < MAX_CALLS && slot < 0; i++) {
        if (strcmp(failing_call[i], call) == 0) {
            slot = i; /* this call's slot */
        }
    }
    for (int i = 0; i < MAX_CALLS && slot < 0; i++) {
        if (failing_call[i][0] == 0) {
            slot = i; /* a free one */
        }
    }
    if (slot >= 0) {
        strncpy(failing_call[slot], call, sizeof failing_call[slot] - 1);
        failing_code[slot] = code;
    }
    pthread_mutex_unlock(&lock);
}

EXPORT CUfileError_t cuFileDriverOpen(void) {
    int code = injected("cuFileDriverOpen");
    if (code != 0) {
        return status(code);
    }
    pthread_mutex_lock(&lock);
    driver_opens++;
    pthread_mutex_unlock(&lock);
    return status(SUCCESS);
}

EXPORT CUfileError_t cuFileDriverClose(void) {
    pthread_mutex_lock(&lock);
    int was_open = driver_opens > 0;
    if (was_open) {
        driver_opens--;
    }
    pthread_mutex_unlock(&lock);
    return status(was_open ? SUCCESS : DRIVER_NOT_INITIALIZED);
}

EXPORT CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *descr) {
    int code = injected("cuFileHandleRegister");
    if (code != 0) {
        return status(code);
    }
    if (!driver_is_open()) {
        return status(DRIVER_NOT_INITIALIZED);
    }
    if (fh == NULL || descr == NULL) {
        return status(INVALID_VALUE);
    }
    if (descr->type != 1) {
        return status(INVALID_FILE_TYPE);
    }
    int flags = fcntl(descr->handle.fd, F_GETFL);
    if (flags < 0) {
        return status(INVALID_VALUE);
    }
    if (flags & (O_NONBLOCK | O_NOFOLLOW)) {
        return status(INVALID_FILE_OPEN_FLAG);
    }
    handle *h = malloc(sizeof *h);
    if (h == NULL) {
        return status(INVALID_VALUE);
    }
    h->fd = descr->handle.fd;
    *fh = h;
    return status(SUCCESS);
}

EXPORT void cuFileHandleDeregister(void *fh) { free(fh); }

EXPORT CUfileError_t cuFileBufRegister(const void *base, size_t len, int flags) {
    (void)flags;
    int code = injected("cuFileBufRegister");
    if (code != 0) {
        return status(code);
    }
    if (!driver_is_open()) {
        return status(DRIVER_NOT_INITIALIZED);
    }
    if (base == NULL || len == 0) {
        return status(INVALID_VALUE);
    }
    int result = INVALID_VALUE; /* no free slot */
    pthread_mutex_lock(&lock);
    int free_slot = -1;
    for (int i = 0; i < MAX_BUFFERS; i++) {
        if (buffers[i] == base) {
            free_slot = -2;
            result = MEMORY_ALREADY_REGISTERED;
            break;
        }
        if (buffers[i] == NULL && free_slot == -1) {
            free_slot = i;
        }
    }
    if (free_slot >= 0) {
        buffers[free_slot] = base;
        result = SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status(result);
}

EXPORT CUfileError_t cuFileBufDeregister(const void *base) {
    int result = MEMORY_NOT_REGISTERED;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_BUFFERS; i++) {
        if (base != NULL && buffers[i] == base) {
            buffers[i] = NULL;
            result = SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return status(result);
}

/* Moves `size` bytes, continuing after short transfers; the bytes moved, or -1. */
static ssize_t move(int fd, char *buf, size_t size, off_t offset, int writing) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = writing ? pwrite(fd, buf + done, size - done, offset + (off_t)done)
                            : pread(fd, buf + done, size - done, offset + (off_t)done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return -1;
        }
        if (n == 0) {
            break;
        }
        done += (size_t)n;
    }
    return (ssize_t)done;
}

static ssize_t transfer(const char *call, void *fh, char *base, size_t size, off_t file_offset,
                        off_t buf_offset, int writing) {
    int code = injected(call);
    if (code != 0) {
        return -(ssize_t)code;
    }
    if (!driver_is_open()) {
        return -DRIVER_NOT_INITIALIZED;
    }
    if (fh == NULL) {
        return -HANDLE_NOT_REGISTERED;
    }
    if (base == NULL || file_offset < 0 || buf_offset < 0) {
        return -INVALID_VALUE;
    }
    return move(((handle *)fh)->fd, base + buf_offset, size, file_offset, writing);
}

EXPORT ssize_t cuFileRead(void *fh, void *base, size_t size, off_t file_offset,
                          off_t buf_offset) {
    return transfer("cuFileRead", fh, base, size, file_offset, buf_offset, 0);
}

EXPORT ssize_t cuFileWrite(void *fh, const void *base, size_t size, off_t file_offset,
                           off_t buf_offset) {
    return transfer("cuFileWrite", fh, (char *)base, size, file_offset, buf_offset, 1);
}

/* The batch API. Requests run when submitted (the real library runs them
 * asynchronously); their events wait in the context until cuFileBatchIOGetStatus reaps
 * them, at most *nr at a time, each once. */
typedef struct {
    int mode;
    struct {
        void *base;
        off_t file_offset;
        off_t buf_offset;
        size_t size;
    } io;
    void *fh;
    int opcode;
    void *cookie;
} CUfileIOParams_t;

typedef struct {
    void *cookie;
    int status;
    size_t ret;
} CUfileIOEvents_t;

enum { STATUS_COMPLETE = 0x10, STATUS_FAILED = 0x40, STATUS_INVALID = 0x04 };

typedef struct batch {
    unsigned capacity;
    unsigned ready; /* events not yet reaped */
    CUfileIOEvents_t *events;
} batch;

EXPORT CUfileError_t cuFileBatchIOSetUp(void **id, unsigned nr) {
    int code = injected("cuFileBatchIOSetUp");
    if (code != 0) {
        return status(code);
    }
    if (!driver_is_open()) {
        return status(DRIVER_NOT_INITIALIZED);
    }
    if (id == NULL || nr == 0 || nr > IO_BATCHSIZE) {
        return status(INVALID_VALUE);
    }
    batch *b = calloc(1, sizeof *b);
    if (b == NULL || (b->events = calloc(nr, sizeof *b->events)) == NULL) {
        free(b);
        return status(INVALID_VALUE);
    }
    b->capacity = nr;
    *id = b;
    return status(SUCCESS);
}

EXPORT CUfileError_t cuFileBatchIOSubmit(void *id, unsigned nr, CUfileIOParams_t *params,
                                         unsigned flags) {
    (void)flags;
    int code = injected("cuFileBatchIOSubmit");
    if (code != 0) {
        return status(code);
    }
    batch *b = id;
    if (b == NULL || params == NULL || nr == 0 || b->ready + nr > b->capacity) {
        return status(INVALID_VALUE);
    }
    for (unsigned i = 0; i < nr; i++) {
        CUfileIOParams_t *p = &params[i];
        CUfileIOEvents_t *e = &b->events[b->ready++];
        e->cookie = p->cookie;
        if (p->mode != 1 || (p->opcode != 0 && p->opcode != 1)) {
            e->status = STATUS_INVALID;
            e->ret = (size_t)-(ssize_t)INVALID_VALUE;
            continue;
        }
        int writing = p->opcode == 1;
        /* devPtr_offset is ignored, as cuFile 1.15.1 in compat mode was seen to ignore it
         * in batch requests: a caller that relies on it reads and writes the wrong bytes
         * here too. */
        ssize_t n = transfer(writing ? "cuFileWrite" : "cuFileRead", p->fh, p->io.base,
                             p->io.size, p->io.file_offset, 0, writing);
        if (n == -1) {
            n = -(ssize_t)errno;
        }
        e->status = n < 0 ? STATUS_FAILED : STATUS_COMPLETE;
        e->ret = (size_t)n;
    }
    return status(SUCCESS);
}

EXPORT CUfileError_t cuFileBatchIOGetStatus(void *id, unsigned min_nr, unsigned *nr,
                                            CUfileIOEvents_t *events, struct timespec *timeout) {
    (void)timeout;
    int code = injected("cuFileBatchIOGetStatus");
    if (code != 0) {
        return status(code);
    }
    batch *b = id;
    if (b == NULL || nr == NULL || events == NULL || min_nr > *nr) {
        return status(INVALID_VALUE);
    }
    unsigned n = b->ready < *nr ? b->ready : *nr;
    memcpy(events, b->events, n * sizeof *events);
    memmove(b->events, b->events + n, (b->ready - n) * sizeof *events);
    b->ready -= n;
    *nr = n;
    return status(SUCCESS);
}

EXPORT void cuFileBatchIODestroy(void *id) {
    batch *b = id;
    if (b != NULL) {
        free(b->events);
        free(b);
    }
}

/* The layout this file declares, for the test that holds it against hicache's. */
EXPORT size_t hicache_cufile_stand_in_layout(int what) {
    switch (what) {
    case 0: return sizeof(CUfileDescr_t);
    case 1: return offsetof(CUfileDescr_t, handle);
    case 2: return offsetof(CUfileDescr_t, fs_ops);
    case 3: return sizeof(CUfileError_t);
    case 4: return sizeof(CUfileIOParams_t);
    case 5: return offsetof(CUfileIOParams_t, fh);
    case 6: return offsetof(CUfileIOParams_t, cookie);
    case 7: return sizeof(CUfileIOEvents_t);
    default: return offsetof(CUfileIOEvents_t, ret);
    }
}
