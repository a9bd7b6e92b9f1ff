/* An emulated CUDA driver (libcuda.so.1): the host-memory calls with their real names, ABIs and
 * CUresult codes, and cuGetProcAddress(_v2) with the real version rules and symbolStatus values.
 * Pins real pages; its own counters via emu_driver_stats. */
#define EMU_NAME "driver"
#include "emul_core.c"
#include <string.h>

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
};
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 };

static CUresult fail(CUresult e) { count_failed(); return e; }

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 12090; return CUDA_SUCCESS; }

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    if (!pp || size == 0 || flags > 7) return fail(CUDA_ERROR_INVALID_VALUE);
    if (emu_pin_alloc(size, pp) != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    return CUDA_SUCCESS;
}
CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }
/* The CUDA 3.1 ABI: a 32-bit size. */
CUresult cuMemAllocHost(void **pp, unsigned int size) { return cuMemHostAlloc(pp, size, 0); }
CUresult cuMemFreeHost(void *p) {
    if (!p || emu_pin_free(p) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04u
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    if (!p || size == 0 || flags > 15) return fail(CUDA_ERROR_INVALID_VALUE);
    int r = flags & CU_MEMHOSTREGISTER_IOMEMORY ? emu_register_io(p, size) : emu_register(p, size, 0);
    if (r == 1) return fail(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    if (r != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    return CUDA_SUCCESS;
}
CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) { return cuMemHostRegister_v2(p, size, flags); }
CUresult cuMemHostUnregister(void *p) {
    if (!p) return fail(CUDA_ERROR_INVALID_VALUE);
    if (emu_unregister_any(p) != 0) return fail(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

/* The virtual-memory management API (CUDA 10.2): CUmemAllocationProp is 32 bytes, `type` at 0
 * (CU_MEM_ALLOCATION_TYPE_PINNED = 1), `location {int type; int id}` at 8 (device 1, host 2,
 * host NUMA 3, host NUMA current 4); only host locations are host memory. */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long CUdeviceptr;
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop, unsigned long long flags) {
    if (!handle || !prop || size == 0 || flags != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    int type = *(const int *)prop, loc = *(const int *)((const char *)prop + 8);
    if (type != 1 || loc < 1 || loc > 4) return fail(CUDA_ERROR_INVALID_VALUE);
    if (phys_create(size, loc != 1, (uint64_t *)handle) != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (phys_release(handle) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    (void)alignment; (void)addr; (void)flags;
    void *p = ptr && size ? vm_reserve(size) : NULL;
    if (!p) return fail(CUDA_ERROR_INVALID_VALUE);
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    if (!ptr || munmap((void *)(uintptr_t)ptr, size) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) {
    if (flags != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    int r = phys_map((uintptr_t)ptr, size, offset, handle);
    if (r == 1) return fail(CUDA_ERROR_INVALID_VALUE);
    if (r != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    return CUDA_SUCCESS;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (!size || phys_unmap((uintptr_t)ptr, size) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    if (!handle || phys_retain((uintptr_t)addr, (uint64_t *)handle) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}

/* Stream-ordered pools: CUmemPoolProps is 88 bytes, `allocType` at 0 (PINNED = 1), `location`
 * {int type; int id} at 8, `maxSize` at 24. The _ptsz variants are what cuGetProcAddress returns
 * with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2) and what per-thread-stream builds call. */
typedef void *CUmemoryPool;
typedef void *CUstream;
CUresult cuMemPoolCreate(CUmemoryPool *pool, const void *props) {
    if (!pool || !props) return fail(CUDA_ERROR_INVALID_VALUE);
    int type = *(const int *)props, loc = *(const int *)((const char *)props + 8);
    if (type != 1 || loc < 1 || loc > 4) return fail(CUDA_ERROR_INVALID_VALUE);
    uint64_t h;
    if (pool_create(loc != 1, &h) != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    *pool = (CUmemoryPool)(uintptr_t)h;
    return CUDA_SUCCESS;
}
CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    if (pool_trim((uint64_t)(uintptr_t)pool, 0, 1) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    if (pool_trim((uint64_t)(uintptr_t)pool, keep, 0) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (!value || pool_attr((uint64_t)(uintptr_t)pool, attr, value) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream) {
    (void)stream;
    void *p;
    if (!dptr) return fail(CUDA_ERROR_INVALID_VALUE);
    int r = pool_alloc((uint64_t)(uintptr_t)pool, size, &p);
    if (r == 1) return fail(CUDA_ERROR_INVALID_VALUE);
    if (r != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream) {
    return cuMemAllocFromPoolAsync(dptr, size, pool, stream);
}
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    (void)stream;
    if (pool_free((uintptr_t)dptr) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) { return cuMemFreeAsync(dptr, stream); }
/* CUDA 13: CUmemLocation is {int type; int id}; the type is CUmemAllocationType (PINNED = 1). */
CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, const int *location, int type) {
    uint64_t h;
    if (!pool || pool_of_location(location, type, 0, &h) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    *pool = (CUmemoryPool)(uintptr_t)h;
    return CUDA_SUCCESS;
}
CUresult cuMemGetMemPool(CUmemoryPool *pool, const int *location, int type) {
    uint64_t h;
    if (!pool || pool_of_location(location, type, 1, &h) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    *pool = (CUmemoryPool)(uintptr_t)h;
    return CUDA_SUCCESS;
}
CUresult cuMemSetMemPool(const int *location, int type, CUmemoryPool pool) {
    if (set_pool_of_location(location, type, (uint64_t)(uintptr_t)pool) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}

/* Devices and device memory (emul_core: EMU_INTEGRATED, EMU_DEVICES). A CUdevice is its
 * ordinal, as NVIDIA's driver numbers them; the current context's device is the thread's
 * current device (cuCtxSetCurrent is not emulated: emu_set_device through cudaSetDevice's twin). */
typedef int CUdevice;
#define CU_DEVICE_ATTRIBUTE_INTEGRATED 18
#define CU_MEM_ATTACH_GLOBAL 0x1u
#define CU_MEM_ATTACH_HOST 0x2u
enum { CUDA_ERROR_INVALID_DEVICE = 101 };
CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = emu_device_count();
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= emu_device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev) {
    if (!pi || attrib != CU_DEVICE_ATTRIBUTE_INTEGRATED) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= emu_device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *pi = emu_integrated(dev);
    return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice *device) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = emu_current_device();
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    void *p;
    if (!dptr || bytesize == 0) return fail(CUDA_ERROR_INVALID_VALUE);
    if (emu_device_alloc(bytesize, &p) != 0) return fail(CUDA_ERROR_OUT_OF_MEMORY);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return fail(CUDA_ERROR_INVALID_VALUE);
    return cuMemAlloc_v2(dptr, bytesize);
}
CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (!dptr || emu_device_free((void *)(uintptr_t)dptr) != 0) return fail(CUDA_ERROR_INVALID_VALUE);
    return CUDA_SUCCESS;
}
void emu_driver_device_stats(struct emu_device_stats *out) { emu_read_device_stats(out); }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);

/* name, lowest version it exists in, the function, and the version from which `newer` replaces it. */
static const struct {
    const char *name;
    int since;
    void *fn;
    int newer_since;
    void *newer;
    void *ptsz; /* with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
} procs[] = {
    {"cuInit", 2000, (void *)cuInit, 0, 0},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, 0, 0},
    {"cuCtxSynchronize", 2000, (void *)cuCtxSynchronize, 0, 0},
    {"cuMemHostAlloc", 2020, (void *)cuMemHostAlloc, 0, 0},
    {"cuMemAllocHost", 2000, (void *)cuMemAllocHost, 3020, (void *)cuMemAllocHost_v2},
    {"cuMemFreeHost", 2000, (void *)cuMemFreeHost, 0, 0},
    {"cuMemHostRegister", 4000, (void *)cuMemHostRegister, 6050, (void *)cuMemHostRegister_v2},
    {"cuMemHostUnregister", 4000, (void *)cuMemHostUnregister, 0, 0},
    {"cuMemCreate", 10020, (void *)cuMemCreate, 0, 0},
    {"cuMemRelease", 10020, (void *)cuMemRelease, 0, 0},
    {"cuMemAddressReserve", 10020, (void *)cuMemAddressReserve, 0, 0},
    {"cuMemAddressFree", 10020, (void *)cuMemAddressFree, 0, 0},
    {"cuMemMap", 10020, (void *)cuMemMap, 0, 0},
    {"cuMemUnmap", 10020, (void *)cuMemUnmap, 0, 0},
    {"cuMemRetainAllocationHandle", 11000, (void *)cuMemRetainAllocationHandle, 0, 0},
    {"cuMemPoolCreate", 11020, (void *)cuMemPoolCreate, 0, 0},
    {"cuMemPoolDestroy", 11020, (void *)cuMemPoolDestroy, 0, 0},
    {"cuMemPoolTrimTo", 11020, (void *)cuMemPoolTrimTo, 0, 0},
    {"cuMemPoolGetAttribute", 11020, (void *)cuMemPoolGetAttribute, 0, 0},
    {"cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync, 0, 0, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, (void *)cuMemFreeAsync, 0, 0, (void *)cuMemFreeAsync_ptsz},
    {"cuMemGetDefaultMemPool", 13000, (void *)cuMemGetDefaultMemPool, 0, 0},
    {"cuMemGetMemPool", 13000, (void *)cuMemGetMemPool, 0, 0},
    {"cuMemSetMemPool", 13000, (void *)cuMemSetMemPool, 0, 0},
    {"cuDeviceGetCount", 2000, (void *)cuDeviceGetCount, 0, 0},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet, 0, 0},
    {"cuDeviceGetAttribute", 2000, (void *)cuDeviceGetAttribute, 0, 0},
    {"cuCtxGetDevice", 2000, (void *)cuCtxGetDevice, 0, 0},
    /* The 32-bit ABI below 3.2 is not emulated: those versions find the name missing. */
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2, 0, 0},
    {"cuMemFree", 3020, (void *)cuMemFree_v2, 0, 0},
    {"cuMemAllocManaged", 6000, (void *)cuMemAllocManaged, 0, 0},
    {"cuGetProcAddress", 11030, (void *)cuGetProcAddress, 12000, (void *)cuGetProcAddress_v2},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol)) continue;
        if (version < procs[i].since) {
            if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return CUDA_SUCCESS;
        }
        *pfn = (procs[i].newer && version >= procs[i].newer_since) ? procs[i].newer : procs[i].fn;
        if ((flags & 2) && procs[i].ptsz) *pfn = procs[i].ptsz;
        if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

void emu_driver_stats(struct emu_stats *out) { emu_read_stats(out); }
