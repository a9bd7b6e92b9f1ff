/* Runs HIP host-memory operations given as arguments, through the route HIP_ROUTE names, and
 * prints what each returned, then the emulated runtime's own counters (when it is the emulated
 * one) and pinguard's live bytes.
 *
 *   HIP_ROUTE=export (default): the library's exports, linked by name
 *   HIP_ROUTE=dlsym: dlsym(dlopen("libamdhip64.so.5"), name)
 *   HIP_ROUTE=proc: hipGetProcAddress(name, ...), as HIP 6.1+ programs do
 *
 *   malloc:SIZE[:FLAGS] (hipHostMalloc)  alloc:SIZE[:FLAGS] (hipHostAlloc)
 *   ext:SIZE[:FLAGS] (hipExtHostAlloc)  mallochost:SIZE (hipMallocHost)
 *   memallochost:SIZE (hipMemAllocHost)  register:SIZE[:FLAGS] (fresh pages)
 *   register_slot:SLOT[:FLAGS]  free:SLOT (hipHostFree)  freehost:SLOT (hipFreeHost)
 *   free_raw:0 (hipHostFree of a pointer never allocated)  unregister:SLOT
 *   pool:LOCATION_TYPE (hipMemPoolCreate, pinned)  pool_alloc:POOL_SLOT:SIZE
 *   free_async:SLOT  trim:POOL_SLOT:KEEP  destroy:POOL_SLOT  touch:SLOT (writes every byte)
 *   flags:SLOT (hipHostGetFlags: does the runtime know the pointer?)
 *   vmm_create:SIZE:LOCATION_TYPE (hipMemCreate, pinned; the slot holds the handle)
 *   vmm_create_old:SIZE:DEVICE_ID (the same with 5.2.3's hipMemAllocationProp, compressionType 1,
 *   at the device DEVICE_ID)
 *   vmm_reserve:SIZE (hipMemAddressReserve)  vmm_map:VA_SLOT:HANDLE_SLOT (hipMemMap, whole handle)
 *   vmm_unmap:VA_SLOT (hipMemUnmap)  vmm_release:HANDLE_SLOT (hipMemRelease)
 *   vmm_retain:VA_SLOT (hipMemRetainAllocationHandle; the slot holds the handle)
 *   hold:0 (prints "ready", then waits for the end of its input: the state file is read meanwhile)
 */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int (*alloc_fn)(void **, size_t, unsigned);
typedef int (*malloc_fn)(void **, size_t);
typedef int (*ptr_fn)(void *);
typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*getflags_fn)(unsigned *, void *);
typedef int (*pool_create_fn)(void **, const void *);
typedef int (*pool_fn)(void *);
typedef int (*trim_fn)(void *, size_t);
typedef int (*pool_alloc_fn)(void **, size_t, void *, void *);
typedef int (*free_async_fn)(void *, void *);
typedef int (*proc_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*vmm_create_fn)(void **, size_t, const void *, unsigned long long);
typedef int (*vmm_reserve_fn)(void **, size_t, size_t, void *, unsigned long long);
typedef int (*vmm_map_fn)(void *, size_t, size_t, void *, unsigned long long);
typedef int (*vmm_unmap_fn)(void *, size_t);
typedef int (*vmm_retain_fn)(void **, void *);

/* The exports the program links against (weak: 5.2.3 has neither hipExtHostAlloc nor
 * hipGetProcAddress, and the real library has no emu_hip_stats). */
#define WEAK __attribute__((weak))
int hipHostMalloc(void **, size_t, unsigned) WEAK;
int hipHostAlloc(void **, size_t, unsigned) WEAK;
int hipExtHostAlloc(void **, size_t, unsigned) WEAK;
int hipMallocHost(void **, size_t) WEAK;
int hipMemAllocHost(void **, size_t) WEAK;
int hipHostFree(void *) WEAK;
int hipFreeHost(void *) WEAK;
int hipHostRegister(void *, size_t, unsigned) WEAK;
int hipHostUnregister(void *) WEAK;
int hipHostGetFlags(unsigned *, void *) WEAK;
int hipMemPoolCreate(void **, const void *) WEAK;
int hipMemPoolDestroy(void *) WEAK;
int hipMemPoolTrimTo(void *, size_t) WEAK;
int hipMallocFromPoolAsync(void **, size_t, void *, void *) WEAK;
int hipFreeAsync(void *, void *) WEAK;
int hipGetProcAddress(const char *, void **, int, uint64_t, int *) WEAK;
int hipMemCreate(void **, size_t, const void *, unsigned long long) WEAK;
int hipMemRelease(void *) WEAK;
int hipMemAddressReserve(void **, size_t, size_t, void *, unsigned long long) WEAK;
int hipMemMap(void *, size_t, size_t, void *, unsigned long long) WEAK;
int hipMemUnmap(void *, size_t) WEAK;
int hipMemRetainAllocationHandle(void **, void *) WEAK;
void emu_hip_stats(struct emu_stats *) WEAK;
static const struct { const char *name; void *fn; } exports[] = {
    {"hipHostMalloc", (void *)hipHostMalloc}, {"hipHostAlloc", (void *)hipHostAlloc},
    {"hipExtHostAlloc", (void *)hipExtHostAlloc}, {"hipMallocHost", (void *)hipMallocHost},
    {"hipMemAllocHost", (void *)hipMemAllocHost}, {"hipHostFree", (void *)hipHostFree},
    {"hipFreeHost", (void *)hipFreeHost}, {"hipHostRegister", (void *)hipHostRegister},
    {"hipHostUnregister", (void *)hipHostUnregister}, {"hipHostGetFlags", (void *)hipHostGetFlags},
    {"hipMemPoolCreate", (void *)hipMemPoolCreate}, {"hipMemPoolDestroy", (void *)hipMemPoolDestroy},
    {"hipMemPoolTrimTo", (void *)hipMemPoolTrimTo}, {"hipMallocFromPoolAsync", (void *)hipMallocFromPoolAsync},
    {"hipFreeAsync", (void *)hipFreeAsync}, {"hipMemCreate", (void *)hipMemCreate},
    {"hipMemRelease", (void *)hipMemRelease}, {"hipMemAddressReserve", (void *)hipMemAddressReserve},
    {"hipMemMap", (void *)hipMemMap}, {"hipMemUnmap", (void *)hipMemUnmap},
    {"hipMemRetainAllocationHandle", (void *)hipMemRetainAllocationHandle},
};

static void *lib;
static proc_fn get_proc;
static const char *route = "export";

/* The function `name` through the chosen route; NULL when the route does not have it. */
static void *fn(const char *name) {
    if (strcmp(route, "dlsym") == 0) return dlsym(lib, name);
    if (strcmp(route, "proc") == 0) {
        void *p = NULL;
        int status = -1;
        if (!get_proc || get_proc(name, &p, 603, 0, &status) != 0) return NULL;
        return p;
    }
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (strcmp(exports[i].name, name) == 0) return exports[i].fn;
    return NULL;
}

static void *slots[256];
static size_t slot_size[256];
static int nslots;
static int put(void *p, size_t size) { slots[nslots] = p; slot_size[nslots] = size; return nslots++; }

static void print_stats(void) {
    void (*stats)(struct emu_stats *) = emu_hip_stats;
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    struct emu_stats s = {0};
    if (stats) stats(&s);
    printf("STATS {\"hip\":{\"emulated\":%d,\"outstanding_bytes\":%ld,\"outstanding_count\":%ld,\"alloc_calls\":%ld,"
           "\"release_calls\":%ld,\"failed_calls\":%ld},\"pinguard_live_bytes\":%ld}\n",
           stats != NULL, (long)s.outstanding_bytes, (long)s.outstanding_count, (long)s.alloc_calls,
           (long)s.release_calls, (long)s.failed_calls, live ? (long)live() : -1L);
}

static int alloc_op(const char *name, size_t size, unsigned flags, int *slot) {
    void *p = NULL;
    alloc_fn f = (alloc_fn)fn(name);
    if (!f) return -100;
    int rc = f(&p, size, flags);
    if (rc == 0 && p) *slot = put(p, size);
    return rc;
}

static int malloc_op(const char *name, size_t size, int *slot) {
    void *p = NULL;
    malloc_fn f = (malloc_fn)fn(name);
    if (!f) return -100;
    int rc = f(&p, size);
    if (rc == 0 && p) *slot = put(p, size);
    return rc;
}

static int ptr_op(const char *name, void *p) {
    ptr_fn f = (ptr_fn)fn(name);
    return f ? f(p) : -100;
}

static int pool_op(const char *op, long a, long b, int *slot) {
    if (strcmp(op, "pool") == 0) {
        int props[24] = {1, 0, (int)a, 0}; /* pinned, no handle types, {location type, id 0} */
        void *pool = NULL;
        pool_create_fn f = (pool_create_fn)fn("hipMemPoolCreate");
        int rc = f ? f(&pool, props) : -100;
        if (rc == 0) *slot = put(pool, 0);
        return rc;
    }
    if (strcmp(op, "pool_alloc") == 0) {
        void *p = NULL;
        pool_alloc_fn f = (pool_alloc_fn)fn("hipMallocFromPoolAsync");
        int rc = f ? f(&p, (size_t)b, slots[a], NULL) : -100;
        if (rc == 0) *slot = put(p, (size_t)b);
        return rc;
    }
    if (strcmp(op, "free_async") == 0) {
        free_async_fn f = (free_async_fn)fn("hipFreeAsync");
        return f ? f(slots[a], NULL) : -100;
    }
    if (strcmp(op, "trim") == 0) {
        trim_fn f = (trim_fn)fn("hipMemPoolTrimTo");
        return f ? f(slots[a], (size_t)b) : -100;
    }
    pool_fn f = (pool_fn)fn("hipMemPoolDestroy");
    return f ? f(slots[a]) : -100;
}

/* The virtual-memory calls: ROCm 6+'s hipMemAllocationProp (32 bytes; `type` at 0, `location
 * {type, id}` at 8), a handle or a reserved range per slot. */
static int vmm_op(const char *op, long a, long b, int *slot) {
    void *p = NULL;
    if (strcmp(op, "vmm_create") == 0) {
        int prop[8] = {1, 0, (int)b, 0};
        vmm_create_fn f = (vmm_create_fn)fn("hipMemCreate");
        int rc = f ? f(&p, (size_t)a, prop, 0) : -100;
        if (rc == 0) *slot = put(p, (size_t)a);
        return rc;
    }
    if (strcmp(op, "vmm_create_old") == 0) {
        /* Bytes 0 and 8 read as 1 and DEVICE_ID: ROCm 6+'s `type` and `location.type`. */
        int prop[8] = {1, 1, (int)b, 0, 1};
        vmm_create_fn f = (vmm_create_fn)fn("hipMemCreate");
        int rc = f ? f(&p, (size_t)a, prop, 0) : -100;
        if (rc == 0) *slot = put(p, (size_t)a);
        return rc;
    }
    if (strcmp(op, "vmm_reserve") == 0) {
        vmm_reserve_fn f = (vmm_reserve_fn)fn("hipMemAddressReserve");
        int rc = f ? f(&p, (size_t)a, 0, NULL, 0) : -100;
        if (rc == 0) *slot = put(p, (size_t)a);
        return rc;
    }
    if (strcmp(op, "vmm_map") == 0) {
        vmm_map_fn f = (vmm_map_fn)fn("hipMemMap");
        return f ? f(slots[a], slot_size[b], 0, slots[b], 0) : -100;
    }
    if (strcmp(op, "vmm_retain") == 0) {
        vmm_retain_fn f = (vmm_retain_fn)fn("hipMemRetainAllocationHandle");
        int rc = f ? f(&p, slots[a]) : -100;
        if (rc == 0) *slot = put(p, slot_size[a]);
        return rc;
    }
    if (strcmp(op, "vmm_unmap") == 0) {
        vmm_unmap_fn f = (vmm_unmap_fn)fn("hipMemUnmap");
        return f ? f(slots[a], slot_size[a]) : -100;
    }
    return ptr_op("hipMemRelease", slots[a]);
}

static int run_op(const char *op, long a, long b, int *slot) {
    if (strncmp(op, "vmm_", 4) == 0) return vmm_op(op, a, b, slot);
    if (strcmp(op, "hold") == 0) {
        printf("ready\n");
        fflush(stdout);
        while (getchar() != EOF) {}
        return 0;
    }
    if (strcmp(op, "malloc") == 0) return alloc_op("hipHostMalloc", a, b, slot);
    if (strcmp(op, "alloc") == 0) return alloc_op("hipHostAlloc", a, b, slot);
    if (strcmp(op, "ext") == 0) return alloc_op("hipExtHostAlloc", a, b, slot);
    if (strcmp(op, "mallochost") == 0) return malloc_op("hipMallocHost", a, slot);
    if (strcmp(op, "memallochost") == 0) return malloc_op("hipMemAllocHost", a, slot);
    if (strcmp(op, "free") == 0) return ptr_op("hipHostFree", slots[a]);
    if (strcmp(op, "freehost") == 0) return ptr_op("hipFreeHost", slots[a]);
    if (strcmp(op, "free_raw") == 0) return ptr_op("hipHostFree", (void *)0x7000dead000);
    if (strcmp(op, "unregister") == 0) return ptr_op("hipHostUnregister", slots[a]);
    if (strcmp(op, "register") == 0 || strcmp(op, "register_slot") == 0) {
        void *p = op[8] ? slots[a] : mmap(NULL, a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        size_t size = op[8] ? slot_size[a] : (size_t)a;
        register_fn f = (register_fn)fn("hipHostRegister");
        if (!f) return -100;
        int rc = f(p, size, b);
        if (rc == 0) *slot = put(p, size);
        return rc;
    }
    if (strcmp(op, "touch") == 0) {
        memset(slots[a], 0x5a, slot_size[a]);
        return 0;
    }
    if (strcmp(op, "flags") == 0) {
        unsigned flags;
        getflags_fn f = (getflags_fn)fn("hipHostGetFlags");
        return f ? f(&flags, slots[a]) : -100;
    }
    return pool_op(op, a, b, slot);
}

int main(int argc, char **argv) {
    if (getenv("HIP_ROUTE")) route = getenv("HIP_ROUTE");
    lib = dlopen("libamdhip64.so.5", RTLD_NOW);
    if (!lib) { fprintf(stderr, "hip: %s\n", dlerror()); return 2; }
    get_proc = hipGetProcAddress;
    printf("route=%s hipGetProcAddress=%d\n", route, get_proc != NULL);
    for (int i = 1; i < argc; i++) {
        char op[32] = {0};
        long a = 0, b = 0;
        if (sscanf(argv[i], "%31[a-z_]:%li:%li", op, &a, &b) < 1) return 2;
        int slot = -1;
        int rc = run_op(op, a, b, &slot);
        printf("%s rc=%d", argv[i], rc);
        if (slot >= 0) printf(" slot=%d addr=%p", slot, slots[slot]);
        printf("\n");
    }
    print_stats();
    fflush(stdout);
    return 0;
}
