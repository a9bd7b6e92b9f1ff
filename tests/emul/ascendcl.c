/* An emulated Ascend ACL runtime: libascendcl's host-memory calls with their real names,
 * signatures and codes, pinning real pages, with its own counters (emu_acl_stats). */
#define EMU_NAME "acl"
#include "emul_core.c"

typedef int aclError;
enum {
    ACL_SUCCESS = 0,
    ACL_ERROR_INVALID_PARAM = 100000,
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
};
#define ACL_HOST_REG_MAPPED 0x2u
#define ACL_HOST_REG_PINNED 0x10000000u

static aclError fail(aclError e) { count_failed(); return e; }

aclError aclrtMallocHost(void **hostPtr, size_t size) {
    if (!hostPtr || size == 0) return fail(ACL_ERROR_INVALID_PARAM);
    if (emu_pin_alloc(size, hostPtr) != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    return ACL_SUCCESS;
}

/* cfg (aclrtMallocConfig *) carries attributes the emulation ignores. */
aclError aclrtMallocHostWithCfg(void **ptr, uint64_t size, void *cfg) {
    (void)cfg;
    return aclrtMallocHost(ptr, (size_t)size);
}

aclError aclrtFreeHost(void *hostPtr) {
    if (!hostPtr) return fail(ACL_ERROR_INVALID_PARAM);
    if (emu_pin_free(hostPtr) != 0) return fail(ACL_ERROR_INVALID_PARAM);
    return ACL_SUCCESS;
}

/* type is aclrtHostRegisterType (ACL_HOST_REGISTER_MAPPED = 0): the device address comes back. */
aclError aclrtHostRegister(void *ptr, uint64_t size, int type, void **devPtr) {
    if (!ptr || size == 0 || !devPtr || type != 0) return fail(ACL_ERROR_INVALID_PARAM);
    int r = emu_register(ptr, (size_t)size, 1);
    if (r == 1) return fail(ACL_ERROR_INVALID_PARAM);
    if (r != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    *devPtr = ptr;
    return ACL_SUCCESS;
}

aclError aclrtHostRegisterV2(void *ptr, uint64_t size, uint32_t flag) {
    if (!ptr || size == 0 || (flag & ~(ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED)))
        return fail(ACL_ERROR_INVALID_PARAM);
    int r = emu_register(ptr, (size_t)size, 1);
    if (r == 1) return fail(ACL_ERROR_INVALID_PARAM);
    if (r != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void *ptr) {
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM);
    if (emu_unregister(ptr) != 0) return fail(ACL_ERROR_INVALID_PARAM);
    return ACL_SUCCESS;
}

/* Virtual-memory management: aclrtPhysicalMemProp is 32 bytes, `handleType` at 0,
 * `allocationType` at 4 (ACL_MEM_ALLOCATION_TYPE_PINNED = 0), `memAttr` at 8, `location` at 12 as
 * {uint32 id; uint32 type} (id first), so the type at 16: host 0, device 1, host NUMA 4. Host or
 * device comes from the location's type alone. aclrtDrvMemHandle is an opaque pointer. */
typedef void *aclrtDrvMemHandle;
aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const void *prop, uint64_t flags) {
    if (!handle || !prop || size == 0 || flags != 0) return fail(ACL_ERROR_INVALID_PARAM);
    uint32_t type = *(const uint32_t *)((const char *)prop + 4), loc = *(const uint32_t *)((const char *)prop + 16);
    if (type != 0 || (loc != 0 && loc != 1 && loc != 4)) return fail(ACL_ERROR_INVALID_PARAM);
    uint64_t h;
    if (phys_create(size, loc != 1, &h) != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    *handle = (aclrtDrvMemHandle)(uintptr_t)h;
    return ACL_SUCCESS;
}
aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
    if (phys_release((uint64_t)(uintptr_t)handle) != 0) return fail(ACL_ERROR_INVALID_PARAM);
    return ACL_SUCCESS;
}
aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags) {
    (void)alignment; (void)expectPtr; (void)flags;
    void *p = virPtr && size ? vm_reserve(size) : NULL;
    if (!p) return fail(ACL_ERROR_INVALID_PARAM);
    *virPtr = p;
    return ACL_SUCCESS;
}
aclError aclrtReleaseMemAddress(void *virPtr) {
    (void)virPtr; /* the emulation leaves the reservation: tests reserve a few pages */
    return ACL_SUCCESS;
}
aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags) {
    if (flags != 0) return fail(ACL_ERROR_INVALID_PARAM);
    int r = phys_map((uintptr_t)virPtr, size, offset, (uint64_t)(uintptr_t)handle);
    if (r == 1) return fail(ACL_ERROR_INVALID_PARAM);
    if (r != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    return ACL_SUCCESS;
}
aclError aclrtUnmapMem(void *virPtr) {
    if (phys_unmap((uintptr_t)virPtr, 0) != 0) return fail(ACL_ERROR_INVALID_PARAM);
    return ACL_SUCCESS;
}
aclError aclrtMemRetainAllocationHandle(void *virPtr, aclrtDrvMemHandle *handle) {
    uint64_t h;
    if (!handle || phys_retain((uintptr_t)virPtr, &h) != 0) return fail(ACL_ERROR_INVALID_PARAM);
    *handle = (aclrtDrvMemHandle)(uintptr_t)h;
    return ACL_SUCCESS;
}

void emu_acl_stats(struct emu_stats *out) { emu_read_stats(out); }
