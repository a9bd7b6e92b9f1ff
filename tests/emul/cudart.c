/* An emulated CUDA runtime: the real names, signatures and error codes of libcudart's host-memory
 * calls, pinning real pages, with its own counters (emu_cuda_stats). */
#define EMU_NAME "cuda"
#include "emul_core.c"

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
};

static cudaError_t fail(cudaError_t e) { count_failed(); return e; }

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
    if (!ptr || flags > 7) return fail(cudaErrorInvalidValue);
    if (size == 0) { *ptr = NULL; return cudaSuccess; }
    if (emu_pin_alloc(size, ptr) != 0) return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    if (emu_pin_free(ptr) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

#define cudaHostRegisterIoMemory 0x04u
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    if (!ptr || size == 0 || flags > 15) return fail(cudaErrorInvalidValue);
    int r = flags & cudaHostRegisterIoMemory ? emu_register_io(ptr, size) : emu_register(ptr, size, 0);
    if (r == 1) return fail(cudaErrorHostMemoryAlreadyRegistered);
    if (r != 0) return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr) {
    if (!ptr) return fail(cudaErrorInvalidValue);
    if (emu_unregister_any(ptr) != 0) return fail(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

/* What PyTorch's is_pinned() asks, in effect: does the runtime know this host pointer? */
cudaError_t cudaHostGetFlags(unsigned int *flags, void *ptr) {
    if (!flags || !ptr || !table_contains((uintptr_t)ptr)) return cudaErrorInvalidValue;
    *flags = 0;
    return cudaSuccess;
}

/* Stream-ordered pools, as the driver's (cudaMemPoolProps has CUmemPoolProps' layout). */
typedef void *cudaMemPool_t;
typedef void *cudaStream_t;
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const void *props) {
    if (!pool || !props) return fail(cudaErrorInvalidValue);
    int type = *(const int *)props, loc = *(const int *)((const char *)props + 8);
    if (type != 1 || loc < 1 || loc > 4) return fail(cudaErrorInvalidValue);
    uint64_t h;
    if (pool_create(loc != 1, &h) != 0) return fail(cudaErrorMemoryAllocation);
    *pool = (cudaMemPool_t)(uintptr_t)h;
    return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
    if (pool_trim((uint64_t)(uintptr_t)pool, 0, 1) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
    if (pool_trim((uint64_t)(uintptr_t)pool, keep, 0) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, int attr, void *value) {
    if (!value || pool_attr((uint64_t)(uintptr_t)pool, attr, value) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream) {
    (void)stream;
    if (!ptr) return fail(cudaErrorInvalidValue);
    int r = pool_alloc((uint64_t)(uintptr_t)pool, size, ptr);
    if (r == 1) return fail(cudaErrorInvalidValue);
    if (r != 0) return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream) {
    return cudaMallocFromPoolAsync(ptr, size, pool, stream);
}
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
    (void)stream;
    if (pool_free((uintptr_t)ptr) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream) { return cudaFreeAsync(ptr, stream); }
cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t *pool, const int *location, int type) {
    uint64_t h;
    if (!pool || pool_of_location(location, type, 0, &h) != 0) return fail(cudaErrorInvalidValue);
    *pool = (cudaMemPool_t)(uintptr_t)h;
    return cudaSuccess;
}
cudaError_t cudaMemGetMemPool(cudaMemPool_t *pool, const int *location, int type) {
    uint64_t h;
    if (!pool || pool_of_location(location, type, 1, &h) != 0) return fail(cudaErrorInvalidValue);
    *pool = (cudaMemPool_t)(uintptr_t)h;
    return cudaSuccess;
}
cudaError_t cudaMemSetMemPool(const int *location, int type, cudaMemPool_t pool) {
    if (set_pool_of_location(location, type, (uint64_t)(uintptr_t)pool) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* Devices and device memory (emul_core: EMU_INTEGRATED, EMU_DEVICES). */
#define cudaDevAttrIntegrated 18
#define cudaMemAttachGlobal 0x01u
#define cudaMemAttachHost 0x02u
cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return cudaErrorInvalidValue;
    *count = emu_device_count();
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
    if (!device) return cudaErrorInvalidValue;
    *device = emu_current_device();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return emu_set_device(device) ? cudaErrorInvalidValue : cudaSuccess; }
/* Only cudaDevAttrIntegrated is known here; any other attribute is an invalid value. */
cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device) {
    if (!value || attr != cudaDevAttrIntegrated || device < 0 || device >= emu_device_count()) return cudaErrorInvalidValue;
    *value = emu_integrated(device);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **ptr, size_t size) {
    if (!ptr) return fail(cudaErrorInvalidValue);
    if (size == 0) { *ptr = NULL; return cudaSuccess; }
    if (emu_device_alloc(size, ptr) != 0) return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}
cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags) {
    if (!ptr || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)) return fail(cudaErrorInvalidValue);
    if (emu_device_alloc(size, ptr) != 0) return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}
cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    if (emu_device_free(ptr) != 0) return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
void emu_cuda_device_stats(struct emu_device_stats *out) { emu_read_device_stats(out); }

void emu_cuda_stats(struct emu_stats *out) { emu_read_stats(out); }
