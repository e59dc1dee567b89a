/* A fake CUDA driver for tests without a GPU: the 24 entry points cubepool loads from
 * libcuda.so.1, with the C signatures of cuda.h (CUDA 12), served by host memory.
 * Device pointers are host addresses (so tests can read the bytes); virtual memory is
 * mmap(PROT_NONE) ranges with runs made readable and writable by cuMemMap. It checks
 * what the real driver checks that a wrong struct layout would break (allocation
 * properties, access descriptors, map sizes) and fails like the driver: out of memory
 * past FAKE_CUDA_CAPACITY bytes (default 1 GiB), CUDA_ERROR_INVALID_VALUE otherwise.
 * Built by tests/python/test_cuda_fake.py with `cc -shared -fPIC`. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_DEVICE = 101, NOT_FOUND = 500 };
#define GRANULE (2u << 20)
#define MAX_HANDLES 4096

static size_t used = 0;
static int contexts = 0;
static struct { size_t size; int live; int mapped; CUdeviceptr at; } handles[MAX_HANDLES];

static size_t capacity(void) {
    const char *text = getenv("FAKE_CUDA_CAPACITY");
    return text ? (size_t)strtoull(text, NULL, 10) : ((size_t)1 << 30);
}

static int good_location(const CUmemLocation *l) { return l->type == 1 && l->id == 0; }
static int good_prop(const CUmemAllocationProp *p) {
    return p && p->type == 1 && p->requestedHandleTypes == 0 && good_location(&p->location)
        && p->win32HandleMetaData == NULL;
}

CUresult cuInit(unsigned int flags) { return flags == 0 ? OK : INVALID_VALUE; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return OK; }
CUresult cuDeviceGet(int *device, int ordinal) {
    if (ordinal != 0) return INVALID_DEVICE;
    *device = 0;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int device) {
    if (device != 0) return INVALID_DEVICE;
    contexts++;
    *ctx = (void *)&contexts;
    return OK;
}
static void *current = NULL;
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return OK; }
CUresult cuCtxSynchronize(void) { return current ? OK : INVALID_VALUE; }
CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return OK;
    default: *name = "CUDA_ERROR_UNKNOWN"; return OK;
    }
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    if (!current || size == 0) return INVALID_VALUE;
    if (used + size > capacity()) return OUT_OF_MEMORY;
    void *q = NULL;
    /* 256-aligned bytes after a 256-byte header that holds the size. */
    if (posix_memalign(&q, 256, size + 256) != 0) return OUT_OF_MEMORY;
    *(size_t *)q = size;
    used += size;
    *ptr = (CUdeviceptr)((char *)q + 256);
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    if (!ptr) return INVALID_VALUE;
    char *q = (char *)ptr - 256;
    used -= *(size_t *)q;
    free(q);
    return OK;
}
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    *total = capacity();
    *free_bytes = capacity() - used;
    return OK;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    if (!good_prop(prop) || option != 0) return INVALID_VALUE;
    *g = GRANULE;
    return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    if (size == 0 || size % GRANULE || addr || flags || (align & (align - 1))) return INVALID_VALUE;
    size_t extra = align > 4096 ? align : 0;
    void *p = mmap(NULL, size + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return OUT_OF_MEMORY;
    uintptr_t start = (uintptr_t)p;
    uintptr_t aligned = extra ? (start + align - 1) & ~(uintptr_t)(align - 1) : start;
    if (aligned > start) munmap(p, aligned - start);
    if (extra && start + size + extra > aligned + size) munmap((void *)(aligned + size), start + size + extra - aligned - size);
    *ptr = aligned;
    return OK;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    return munmap((void *)ptr, size) == 0 ? OK : INVALID_VALUE;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    if (!good_prop(prop) || flags || size == 0 || size % GRANULE) return INVALID_VALUE;
    if (used + size > capacity()) return OUT_OF_MEMORY;
    for (int i = 1; i < MAX_HANDLES; i++) {
        if (!handles[i].live) {
            handles[i].live = 1;
            handles[i].mapped = 0;
            handles[i].size = size;
            used += size;
            *handle = (CUmemGenericAllocationHandle)i;
            return OK;
        }
    }
    return OUT_OF_MEMORY;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    if (h == 0 || h >= MAX_HANDLES || !handles[h].live || handles[h].mapped) return INVALID_VALUE;
    handles[h].live = 0;
    used -= handles[h].size;
    return OK;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    if (h == 0 || h >= MAX_HANDLES || !handles[h].live || handles[h].mapped) return INVALID_VALUE;
    if (offset || flags || size != handles[h].size || ptr % GRANULE) return INVALID_VALUE;
    handles[h].mapped = 1;
    handles[h].at = ptr;
    /* Mapped but not yet accessible, as on a GPU until cuMemSetAccess. */
    return OK;
}
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (count != 1 || !good_location(&desc->location) || desc->flags != 3 || size % GRANULE) return INVALID_VALUE;
    return mprotect((void *)ptr, size, PROT_READ | PROT_WRITE) == 0 ? OK : INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (size % GRANULE || ptr % GRANULE) return INVALID_VALUE;
    /* cuMemUnmap takes whole mappings only. */
    int found = 0;
    for (int i = 1; i < MAX_HANDLES; i++) {
        if (handles[i].live && handles[i].mapped && handles[i].at == ptr) {
            if (handles[i].size != size) return INVALID_VALUE;
            handles[i].mapped = 0;
            found = 1;
            break;
        }
    }
    if (!found) return INVALID_VALUE;
    madvise((void *)ptr, size, MADV_DONTNEED);
    return mprotect((void *)ptr, size, PROT_NONE) == 0 ? OK : INVALID_VALUE;
}

/* Events: each record takes the next ticket; the fake device has finished the work
 * before ticket `finished` (fake_cuda_finish() runs it all; synchronizing on an event
 * runs it up to that event). A query before then is CUDA_ERROR_NOT_READY. */
static unsigned long long tickets = 0, finished = 0;
static int events = 0;
CUresult cuEventCreate(void **event, unsigned int flags) {
    if (flags != 2) return INVALID_VALUE;
    unsigned long long *ticket = malloc(sizeof *ticket);
    if (!ticket) return OUT_OF_MEMORY;
    *ticket = 0;
    events++;
    *event = ticket;
    return OK;
}
CUresult cuEventDestroy_v2(void *event) { free(event); events--; return OK; }
CUresult cuEventRecord(void *event, void *stream) {
    (void)stream;
    if (!event) return INVALID_VALUE;
    *(unsigned long long *)event = ++tickets;
    return OK;
}
CUresult cuEventQuery(void *event) {
    if (!event) return INVALID_VALUE;
    return *(unsigned long long *)event <= finished ? OK : 600 /* CUDA_ERROR_NOT_READY */;
}
CUresult cuEventSynchronize(void *event) {
    if (!event) return INVALID_VALUE;
    unsigned long long ticket = *(unsigned long long *)event;
    if (ticket > finished) finished = ticket;
    return OK;
}

/* For tests: the device finishes all work queued so far. */
void fake_cuda_finish(void) { finished = tickets; }

/* For tests: the bytes the fake device holds now (buffers and mapped runs). */
size_t fake_cuda_used(void) { return used; }
