/* An emulated AMD HIP runtime (libamdhip64): the host-memory calls with their real names,
 * signatures, flags and codes (hip_runtime_api.h of 5.2.3; hipExtHostAlloc, hipGetProcAddress and
 * host-located pools as in ROCm 6.x), pinning real pages, with its own counters (emu_hip_stats). */
#define EMU_NAME "hip"
#include "emul_core.c"

typedef int hipError_t;
enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorHostMemoryAlreadyRegistered = 712,
    hipErrorHostMemoryNotRegistered = 713,
};
#define hipHostMallocPortable 0x1u
#define hipHostMallocMapped 0x2u
#define hipHostMallocWriteCombined 0x4u
#define hipHostMallocNumaUser 0x20000000u
#define hipHostMallocCoherent 0x40000000u
#define hipHostMallocNonCoherent 0x80000000u
#define MALLOC_FLAGS (hipHostMallocPortable | hipHostMallocMapped | hipHostMallocWriteCombined | \
                      hipHostMallocNumaUser | hipHostMallocCoherent | hipHostMallocNonCoherent)
#define hipHostRegisterIoMemory 0x4u
/* hipHostRegisterPortable | Mapped | IoMemory | hipExtHostRegisterCoarseGrained */
#define REGISTER_FLAGS 0xfu

static hipError_t fail(hipError_t e) { count_failed(); return e; }

/* The runtime refuses Coherent together with NonCoherent (ihipHostMalloc's check). */
hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags) {
    if (!ptr) return fail(hipErrorInvalidValue);
    if ((flags & ~MALLOC_FLAGS) || (flags & hipHostMallocCoherent && flags & hipHostMallocNonCoherent)) {
        *ptr = NULL;
        return fail(hipErrorInvalidValue);
    }
    if (size == 0) { *ptr = NULL; return hipSuccess; }
    if (emu_pin_alloc(size, ptr) != 0) return fail(hipErrorOutOfMemory);
    return hipSuccess;
}
hipError_t hipHostAlloc(void **ptr, size_t size, unsigned int flags) { return hipHostMalloc(ptr, size, flags); }
hipError_t hipExtHostAlloc(void **ptr, size_t size, unsigned int flags) { return hipHostMalloc(ptr, size, flags); }
hipError_t hipMallocHost(void **ptr, size_t size) { return hipHostMalloc(ptr, size, 0); }
hipError_t hipMemAllocHost(void **ptr, size_t size) { return hipHostMalloc(ptr, size, 0); }

hipError_t hipHostFree(void *ptr) {
    if (!ptr) return hipSuccess;
    if (emu_pin_free(ptr) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
hipError_t hipFreeHost(void *ptr) { return hipHostFree(ptr); }

hipError_t hipHostRegister(void *ptr, size_t size, unsigned int flags) {
    if (!ptr || size == 0 || (flags & ~REGISTER_FLAGS)) return fail(hipErrorInvalidValue);
    int r = flags & hipHostRegisterIoMemory ? emu_register_io(ptr, size) : emu_register(ptr, size, 0);
    if (r == 1) return fail(hipErrorHostMemoryAlreadyRegistered);
    if (r != 0) return fail(hipErrorOutOfMemory);
    return hipSuccess;
}
hipError_t hipHostUnregister(void *ptr) {
    if (!ptr) return fail(hipErrorInvalidValue);
    if (emu_unregister_any(ptr) != 0) return fail(hipErrorHostMemoryNotRegistered);
    return hipSuccess;
}
hipError_t hipHostGetFlags(unsigned int *flags, void *ptr) {
    if (!flags || !ptr || !table_contains((uintptr_t)ptr)) return hipErrorInvalidValue;
    *flags = 0;
    return hipSuccess;
}

/* Stream-ordered pools: hipMemPoolProps is {allocType, handleTypes, {location type, id}, ...}, as
 * CUmemPoolProps; hipMemAllocationTypePinned 1, location types Device 1, Host 2, HostNuma 3,
 * HostNumaCurrent 4 (6.x; 5.2.3 knows only Device). */
typedef void *hipMemPool_t;
typedef void *hipStream_t;
hipError_t hipMemPoolCreate(hipMemPool_t *pool, const void *props) {
    if (!pool || !props) return fail(hipErrorInvalidValue);
    int type = *(const int *)props, loc = *(const int *)((const char *)props + 8);
    if (type != 1 || loc < 1 || loc > 4) return fail(hipErrorInvalidValue);
    uint64_t h;
    if (pool_create(loc != 1, &h) != 0) return fail(hipErrorOutOfMemory);
    *pool = (hipMemPool_t)(uintptr_t)h;
    return hipSuccess;
}
hipError_t hipMemPoolDestroy(hipMemPool_t pool) {
    if (pool_trim((uint64_t)(uintptr_t)pool, 0, 1) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
hipError_t hipMemPoolTrimTo(hipMemPool_t pool, size_t keep) {
    if (pool_trim((uint64_t)(uintptr_t)pool, keep, 0) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
/* hipMemPoolAttrReservedMemCurrent 5, hipMemPoolAttrUsedMemCurrent 7: CUDA's values. */
hipError_t hipMemPoolGetAttribute(hipMemPool_t pool, int attr, void *value) {
    if (!value || pool_attr((uint64_t)(uintptr_t)pool, attr, value) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream) {
    (void)stream;
    if (!ptr) return fail(hipErrorInvalidValue);
    int r = pool_alloc((uint64_t)(uintptr_t)pool, size, ptr);
    if (r == 1) return fail(hipErrorInvalidValue);
    if (r != 0) return fail(hipErrorOutOfMemory);
    return hipSuccess;
}
hipError_t hipFreeAsync(void *ptr, hipStream_t stream) {
    (void)stream;
    if (pool_free((uintptr_t)ptr) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}

/* The virtual-memory API with ROCm 7's host locations: hipMemAllocationProp is laid out as
 * CUmemAllocationProp since 6.x (`type` at 0, hipMemAllocationTypePinned 1; `location {int type;
 * int id}` at 8: Device 1, Host 2, HostNuma 3, HostNumaCurrent 4). Host-located memory is real
 * (emul_core's phys_*), counted as pinned; a device-located one is a handle only. */
typedef void *hipMemGenericAllocationHandle_t;

/* HIP_VERSION's encoding (major * 10000000 + minor * 100000 + patch): 7.0.0 unless
 * EMU_HIP_VERSION says otherwise. Below 6, hipMemAllocationProp has 5.2.3's layout:
 * {unsigned char compressionType; hipMemLocation location (at 4); int requestedHandleType (12);
 * int type (16); unsigned short usage; void *win32HandleMetaData}, device locations only. */
static int version(void) { return getenv("EMU_HIP_VERSION") ? atoi(getenv("EMU_HIP_VERSION")) : 70000000; }
hipError_t hipRuntimeGetVersion(int *runtimeVersion) {
    if (!runtimeVersion) return fail(hipErrorInvalidValue);
    *runtimeVersion = version();
    return hipSuccess;
}

hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const void *prop, unsigned long long flags) {
    if (!handle || !prop || size == 0 || flags != 0) return fail(hipErrorInvalidValue);
    int old = version() < 60000000;
    int type = *(const int *)((const char *)prop + (old ? 16 : 0)), loc = *(const int *)((const char *)prop + (old ? 4 : 8));
    if (old && loc != 1) return fail(hipErrorInvalidValue);
    if (type != 1 || loc < 1 || loc > 4) return fail(hipErrorInvalidValue);
    uint64_t h;
    if (phys_create(size, loc != 1, &h) != 0) return fail(hipErrorOutOfMemory);
    *handle = (hipMemGenericAllocationHandle_t)(uintptr_t)h;
    return hipSuccess;
}
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
    if (phys_release((uint64_t)(uintptr_t)handle) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr, unsigned long long flags) {
    (void)alignment; (void)addr; (void)flags;
    void *p = ptr && size ? vm_reserve(size) : NULL;
    if (!p) return fail(hipErrorInvalidValue);
    *ptr = p;
    return hipSuccess;
}
hipError_t hipMemAddressFree(void *ptr, size_t size) {
    if (!ptr || munmap(ptr, size) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle, unsigned long long flags) {
    if (flags != 0) return fail(hipErrorInvalidValue);
    int r = phys_map((uintptr_t)ptr, size, offset, (uint64_t)(uintptr_t)handle);
    if (r == 1) return fail(hipErrorInvalidValue);
    if (r != 0) return fail(hipErrorOutOfMemory);
    return hipSuccess;
}
hipError_t hipMemUnmap(void *ptr, size_t size) {
    if (!size || phys_unmap((uintptr_t)ptr, size) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
hipError_t hipMemRetainAllocationHandle(hipMemGenericAllocationHandle_t *handle, void *addr) {
    uint64_t h;
    if (!handle || phys_retain((uintptr_t)addr, &h) != 0) return fail(hipErrorInvalidValue);
    *handle = (hipMemGenericAllocationHandle_t)(uintptr_t)h;
    return hipSuccess;
}

/* Devices and device memory (emul_core: EMU_INTEGRATED, EMU_DEVICES): an APU says it is
 * integrated (hipDeviceAttributeIntegrated, the 17th of hipDeviceAttribute_t). */
#define hipDeviceAttributeIntegrated 16
#define hipMemAttachGlobal 0x01u
#define hipMemAttachHost 0x02u
enum { hipErrorInvalidDevice = 101 };
hipError_t hipGetDeviceCount(int *count) {
    if (!count) return hipErrorInvalidValue;
    *count = emu_device_count();
    return hipSuccess;
}
hipError_t hipGetDevice(int *device) {
    if (!device) return hipErrorInvalidValue;
    *device = emu_current_device();
    return hipSuccess;
}
hipError_t hipSetDevice(int device) { return emu_set_device(device) ? hipErrorInvalidDevice : hipSuccess; }
hipError_t hipDeviceGetAttribute(int *pi, int attr, int device) {
    if (!pi || attr != hipDeviceAttributeIntegrated) return hipErrorInvalidValue;
    if (device < 0 || device >= emu_device_count()) return hipErrorInvalidDevice;
    *pi = emu_integrated(device);
    return hipSuccess;
}
hipError_t hipMalloc(void **ptr, size_t size) {
    if (!ptr) return fail(hipErrorInvalidValue);
    if (size == 0) { *ptr = NULL; return hipSuccess; }
    if (emu_device_alloc(size, ptr) != 0) return fail(hipErrorOutOfMemory);
    return hipSuccess;
}
hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags) {
    if (!ptr || size == 0 || (flags != hipMemAttachGlobal && flags != hipMemAttachHost)) return fail(hipErrorInvalidValue);
    if (emu_device_alloc(size, ptr) != 0) return fail(hipErrorOutOfMemory);
    return hipSuccess;
}
hipError_t hipFree(void *ptr) {
    if (!ptr) return hipSuccess;
    if (emu_device_free(ptr) != 0) return fail(hipErrorInvalidValue);
    return hipSuccess;
}
void emu_hip_device_stats(struct emu_device_stats *out) { emu_read_device_stats(out); }

/* hipGetProcAddress (6.1+): the library's own function for a name, or hipErrorInvalidValue with
 * HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (1). A table, not dlsym: the route is tested on its own. */
hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags, int *symbolStatus) {
    static const struct { const char *name; void *fn; } procs[] = {
        {"hipHostMalloc", (void *)hipHostMalloc}, {"hipHostAlloc", (void *)hipHostAlloc},
        {"hipExtHostAlloc", (void *)hipExtHostAlloc}, {"hipMallocHost", (void *)hipMallocHost},
        {"hipMemAllocHost", (void *)hipMemAllocHost}, {"hipHostFree", (void *)hipHostFree},
        {"hipFreeHost", (void *)hipFreeHost}, {"hipHostRegister", (void *)hipHostRegister},
        {"hipHostUnregister", (void *)hipHostUnregister}, {"hipHostGetFlags", (void *)hipHostGetFlags},
        {"hipMemPoolCreate", (void *)hipMemPoolCreate}, {"hipMemPoolDestroy", (void *)hipMemPoolDestroy},
        {"hipMemPoolTrimTo", (void *)hipMemPoolTrimTo}, {"hipMallocFromPoolAsync", (void *)hipMallocFromPoolAsync},
        {"hipFreeAsync", (void *)hipFreeAsync}, {"hipGetProcAddress", (void *)hipGetProcAddress},
        {"hipMemCreate", (void *)hipMemCreate}, {"hipMemRelease", (void *)hipMemRelease},
        {"hipMemAddressReserve", (void *)hipMemAddressReserve}, {"hipMemAddressFree", (void *)hipMemAddressFree},
        {"hipMemMap", (void *)hipMemMap}, {"hipMemUnmap", (void *)hipMemUnmap},
        {"hipRuntimeGetVersion", (void *)hipRuntimeGetVersion},
        {"hipMemRetainAllocationHandle", (void *)hipMemRetainAllocationHandle},
        {"hipMalloc", (void *)hipMalloc}, {"hipMallocManaged", (void *)hipMallocManaged},
        {"hipFree", (void *)hipFree},
    };
    (void)hipVersion; (void)flags;
    if (!symbol || !*symbol || !pfn) return fail(hipErrorInvalidValue);
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (strcmp(procs[i].name, symbol) == 0) {
            *pfn = procs[i].fn;
            if (symbolStatus) *symbolStatus = 0;
            return hipSuccess;
        }
    *pfn = NULL;
    if (symbolStatus) *symbolStatus = 1;
    return fail(hipErrorInvalidValue);
}

void emu_hip_stats(struct emu_stats *out) { emu_read_stats(out); }
