/*
 * A stand-in for the CUDA runtime (libcudart), for tests on machines without a GPU: the
 * few functions hicache calls, with their C signatures and error codes, over host memory
 * (cudaMalloc is malloc, cudaMemcpy is memcpy). Paired with the cuFile stand-in it lets
 * "device" buffers go through the real FFI path; it proves nothing about GPUs.
 * hicache_cudart_stand_in_devices(n) sets how many devices it reports (0: the runtime's
 * cudaErrorNoDevice, as on a machine without a GPU).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    MEMORY_ALLOCATION = 2,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
};

static int devices = 1;

EXPORT void hicache_cudart_stand_in_devices(int n) { devices = n; }

EXPORT int cudaGetDeviceCount(int *count) {
    if (count == NULL) {
        return INVALID_VALUE;
    }
    *count = 0;
    if (devices == 0) {
        return NO_DEVICE;
    }
    *count = devices;
    return SUCCESS;
}

EXPORT int cudaSetDevice(int device) {
    return device >= 0 && device < devices ? SUCCESS : INVALID_DEVICE;
}

EXPORT int cudaMalloc(void **ptr, size_t len) {
    if (ptr == NULL) {
        return INVALID_VALUE;
    }
    if (devices == 0) {
        return NO_DEVICE;
    }
    *ptr = malloc(len ? len : 1);
    return *ptr == NULL ? MEMORY_ALLOCATION : SUCCESS;
}

EXPORT int cudaFree(void *ptr) {
    free(ptr);
    return SUCCESS;
}

EXPORT int cudaMemcpy(void *dst, const void *src, size_t len, int kind) {
    if ((dst == NULL || src == NULL) && len > 0) {
        return INVALID_VALUE;
    }
    if (kind < 0 || kind > 4) {
        return INVALID_VALUE;
    }
    memmove(dst, src, len);
    return SUCCESS;
}

EXPORT const char *cudaGetErrorName(int code) {
    switch (code) {
    case SUCCESS: return "cudaSuccess";
    case INVALID_VALUE: return "cudaErrorInvalidValue";
    case MEMORY_ALLOCATION: return "cudaErrorMemoryAllocation";
    case NO_DEVICE: return "cudaErrorNoDevice";
    case INVALID_DEVICE: return "cudaErrorInvalidDevice";
    default: return "cudaErrorUnknown";
    }
}
