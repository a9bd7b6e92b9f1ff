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

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    if (!ptr || size == 0 || flags > 15) return fail(cudaErrorInvalidValue);
    int r = emu_register(ptr, size, 0);
    if (r == 1) return fail(cudaErrorHostMemoryAlreadyRegistered);
    if (r != 0) return fail(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr) {
    if (!ptr) return fail(cudaErrorInvalidValue);
    if (emu_unregister(ptr) != 0) return fail(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

/* What PyTorch's is_pinned() asks, in effect: does the runtime know this host pointer? */
cudaError_t cudaHostGetFlags(unsigned int *flags, void *ptr) {
    if (!flags || !ptr || !table_contains((uintptr_t)ptr)) return cudaErrorInvalidValue;
    *flags = 0;
    return cudaSuccess;
}

void emu_cuda_stats(struct emu_stats *out) { emu_read_stats(out); }
