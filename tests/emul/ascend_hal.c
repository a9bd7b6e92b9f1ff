/* An emulated Ascend driver layer (libascend_hal.so, CANN): halHostRegister,
 * halHostUnregister(Ex) and the virtual-memory calls halMemCreate/Release/Map/Unmap, with the
 * names, signatures, map types and drvError_t codes of CANN's ascend_hal.h and
 * ascend_hal_define.h, pinning real pages (mlock), with its own counters (emu_hal_stats). A
 * registration of I/O memory (HOST_IO_MAP_DEV, a NIC's doorbells) or of device memory pins no host
 * RAM: the emulation keeps it in a list of its own, uncounted. */
#define EMU_NAME "hal"
#pragma GCC diagnostic ignored "-Wunused-function" /* emul_core.c's allocation helpers */
#include "emul_core.c"

typedef int drvError_t;
enum {
    DRV_ERROR_NONE = 0,
    DRV_ERROR_INVALID_VALUE = 3,
    DRV_ERROR_OUT_OF_MEMORY = 6,
    DRV_ERROR_PARA_ERROR = 8,
    DRV_ERROR_NOT_SUPPORT = 0xfffe,
};
enum drvRegisterTpye {
    HOST_MEM_MAP_DEV = 0,
    HOST_SVM_MAP_DEV,
    DEV_SVM_MAP_HOST,
    HOST_MEM_MAP_DEV_PCIE_TH,
    DEV_MEM_MAP_HOST,
    HOST_MEM_MAP_DMA,
    HOST_IO_MAP_DEV,
    HOST_REGISTER_MAX_TPYE
};
#define REG_TYPE(flag) ((flag) & 0xffffu)
enum drv_mem_side { MEM_HOST_SIDE = 0, MEM_DEV_SIDE, MEM_HOST_NUMA_SIDE, MEM_MAX_SIDE };
struct drv_mem_prop {
    uint32_t side;
    uint32_t devid;
    uint32_t module_id;
    uint32_t pg_type;
    uint32_t mem_type;
    uint64_t reserve;
};
typedef struct drv_mem_handle drv_mem_handle_t;

static drvError_t fail(drvError_t e) { count_failed(); return e; }

static int host_ram(uint32_t type) {
    return type == HOST_MEM_MAP_DEV || type == HOST_SVM_MAP_DEV || type == HOST_MEM_MAP_DEV_PCIE_TH ||
           type == HOST_MEM_MAP_DMA;
}

/* Registrations that pin nothing of the host's. */
struct unpinned { void *p; struct unpinned *next; };
static struct unpinned *unpinned;
static int io_registrations;

drvError_t halHostRegister(void *src_ptr, uint64_t size, uint32_t flag, uint32_t devid, void **dst_ptr) {
    (void)devid;
    uint32_t type = REG_TYPE(flag);
    if (!src_ptr || !dst_ptr || !size) return fail(DRV_ERROR_INVALID_VALUE);
    if (type >= HOST_REGISTER_MAX_TPYE) return fail(DRV_ERROR_NOT_SUPPORT);
    if (!host_ram(type)) {
        struct unpinned *u = malloc(sizeof *u);
        if (!u) return fail(DRV_ERROR_OUT_OF_MEMORY);
        pthread_mutex_lock(&table_lock);
        u->p = src_ptr; u->next = unpinned; unpinned = u;
        if (type == HOST_IO_MAP_DEV) io_registrations++;
        pthread_mutex_unlock(&table_lock);
        *dst_ptr = src_ptr;
        return DRV_ERROR_NONE;
    }
    int r = emu_register(src_ptr, size, 0);
    if (r == 1) return fail(DRV_ERROR_INVALID_VALUE);
    if (r != 0) return fail(DRV_ERROR_OUT_OF_MEMORY);
    *dst_ptr = src_ptr;
    return DRV_ERROR_NONE;
}

static int drop_unpinned(void *p) {
    int found = 0;
    pthread_mutex_lock(&table_lock);
    for (struct unpinned **pp = &unpinned; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            struct unpinned *u = *pp;
            *pp = u->next;
            free(u);
            found = 1;
            break;
        }
    pthread_mutex_unlock(&table_lock);
    return found;
}

drvError_t halHostUnregister(void *src_ptr, uint32_t devid) {
    (void)devid;
    if (!src_ptr) return fail(DRV_ERROR_PARA_ERROR);
    if (drop_unpinned(src_ptr)) return DRV_ERROR_NONE;
    if (emu_unregister(src_ptr) != 0) return fail(DRV_ERROR_INVALID_VALUE);
    return DRV_ERROR_NONE;
}

drvError_t halHostUnregisterEx(void *src_ptr, uint32_t devid, uint32_t flag) {
    if (REG_TYPE(flag) >= HOST_REGISTER_MAX_TPYE) return fail(DRV_ERROR_NOT_SUPPORT);
    return halHostUnregister(src_ptr, devid);
}

drvError_t halMemCreate(drv_mem_handle_t **handle, size_t size, const struct drv_mem_prop *prop, uint64_t flag) {
    (void)flag;
    if (!handle || !prop || !size || prop->side >= MEM_MAX_SIDE) return fail(DRV_ERROR_INVALID_VALUE);
    uint64_t h;
    if (phys_create(size, prop->side != MEM_DEV_SIDE, &h) != 0) return fail(DRV_ERROR_OUT_OF_MEMORY);
    *handle = (drv_mem_handle_t *)(uintptr_t)h;
    return DRV_ERROR_NONE;
}

drvError_t halMemRelease(drv_mem_handle_t *handle) {
    if (!handle || phys_release((uint64_t)(uintptr_t)handle) != 0) return fail(DRV_ERROR_INVALID_VALUE);
    return DRV_ERROR_NONE;
}

drvError_t halMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr, uint64_t flag) {
    (void)alignment; (void)addr; (void)flag;
    if (!ptr || !size) return fail(DRV_ERROR_INVALID_VALUE);
    *ptr = vm_reserve(size);
    return *ptr ? DRV_ERROR_NONE : fail(DRV_ERROR_OUT_OF_MEMORY);
}

drvError_t halMemMap(void *ptr, size_t size, size_t offset, drv_mem_handle_t *handle, uint64_t flag) {
    (void)flag;
    int r = phys_map((uintptr_t)ptr, size, offset, (uint64_t)(uintptr_t)handle);
    if (r == 1) return fail(DRV_ERROR_INVALID_VALUE);
    if (r != 0) return fail(DRV_ERROR_OUT_OF_MEMORY);
    return DRV_ERROR_NONE;
}

drvError_t halMemUnmap(void *ptr) {
    if (!ptr || phys_unmap((uintptr_t)ptr, 0) != 0) return fail(DRV_ERROR_INVALID_VALUE);
    return DRV_ERROR_NONE;
}

void emu_hal_stats(struct emu_stats *out) { emu_read_stats(out); }
int emu_hal_io_registrations(void) { return io_registrations; }
