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
    int r = emu_register(ptr, (size_t)size);
    if (r == 1) return fail(ACL_ERROR_INVALID_PARAM);
    if (r != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    *devPtr = ptr;
    return ACL_SUCCESS;
}

aclError aclrtHostRegisterV2(void *ptr, uint64_t size, uint32_t flag) {
    if (!ptr || size == 0 || (flag & ~(ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED)))
        return fail(ACL_ERROR_INVALID_PARAM);
    int r = emu_register(ptr, (size_t)size);
    if (r == 1) return fail(ACL_ERROR_INVALID_PARAM);
    if (r != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION);
    return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void *ptr) {
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM);
    if (emu_unregister(ptr) != 0) return fail(ACL_ERROR_INVALID_PARAM);
    return ACL_SUCCESS;
}

void emu_acl_stats(struct emu_stats *out) { emu_read_stats(out); }
