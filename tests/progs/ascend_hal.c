/* Runs Ascend driver-layer calls given as arguments, through the route HAL_ROUTE names, and prints
 * what each returned (drvError_t), then the emulated driver's own counters and pinguard's live
 * bytes.
 *
 *   HAL_ROUTE=export (default): the library's exports, linked by name
 *   HAL_ROUTE=dlsym: dlsym(dlopen("libascend_hal.so"), name), as MemFabric and HCCL do
 *
 *   register:SIZE[:FLAG] (halHostRegister of fresh pages, device 0)  unregister:SLOT
 *   unregister_ex:SLOT:FLAG  create:SIZE:SIDE (halMemCreate; the slot holds the handle)
 *   reserve:SIZE (halMemAddressReserve)  map:VA_SLOT:HANDLE_SLOT  unmap:VA_SLOT
 *   release:HANDLE_SLOT
 */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct drv_mem_prop {
    uint32_t side, devid, module_id, pg_type, mem_type;
    uint64_t reserve;
};
typedef int (*register_fn)(void *, uint64_t, uint32_t, uint32_t, void **);
typedef int (*unregister_fn)(void *, uint32_t);
typedef int (*unregister_ex_fn)(void *, uint32_t, uint32_t);
typedef int (*create_fn)(void **, size_t, const struct drv_mem_prop *, uint64_t);
typedef int (*ptr_fn)(void *);
typedef int (*reserve_fn)(void **, size_t, size_t, void *, uint64_t);
typedef int (*map_fn)(void *, size_t, size_t, void *, uint64_t);

int halHostRegister(void *, uint64_t, uint32_t, uint32_t, void **);
int halHostUnregister(void *, uint32_t);
int halHostUnregisterEx(void *, uint32_t, uint32_t);
int halMemCreate(void **, size_t, const struct drv_mem_prop *, uint64_t);
int halMemRelease(void *);
int halMemAddressReserve(void **, size_t, size_t, void *, uint64_t);
int halMemMap(void *, size_t, size_t, void *, uint64_t);
int halMemUnmap(void *);
void emu_hal_stats(struct emu_stats *) __attribute__((weak));
int emu_hal_io_registrations(void) __attribute__((weak));

static const struct { const char *name; void *fn; } exports[] = {
    {"halHostRegister", (void *)halHostRegister}, {"halHostUnregister", (void *)halHostUnregister},
    {"halHostUnregisterEx", (void *)halHostUnregisterEx}, {"halMemCreate", (void *)halMemCreate},
    {"halMemRelease", (void *)halMemRelease}, {"halMemAddressReserve", (void *)halMemAddressReserve},
    {"halMemMap", (void *)halMemMap}, {"halMemUnmap", (void *)halMemUnmap},
};
static void *lib;
static const char *route = "export";

static void *fn(const char *name) {
    if (strcmp(route, "dlsym") == 0) return dlsym(lib, name);
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (strcmp(exports[i].name, name) == 0) return exports[i].fn;
    return NULL;
}

static void *slots[256];
static size_t slot_size[256];
static int nslots;
static int put(void *p, size_t size) { slots[nslots] = p; slot_size[nslots] = size; return nslots++; }

static int run_op(const char *op, long a, long b, int *slot) {
    if (strcmp(op, "register") == 0) {
        void *p = mmap(NULL, a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *dev = NULL;
        int rc = ((register_fn)fn("halHostRegister"))(p, a, (uint32_t)b, 0, &dev);
        if (rc == 0) *slot = put(p, a);
        return rc;
    }
    if (strcmp(op, "unregister") == 0) return ((unregister_fn)fn("halHostUnregister"))(slots[a], 0);
    if (strcmp(op, "unregister_ex") == 0) return ((unregister_ex_fn)fn("halHostUnregisterEx"))(slots[a], 0, (uint32_t)b);
    if (strcmp(op, "create") == 0) {
        struct drv_mem_prop prop = {(uint32_t)b, 0, 0, 0, 1, 0};
        void *h = NULL;
        int rc = ((create_fn)fn("halMemCreate"))(&h, a, &prop, 0);
        if (rc == 0) *slot = put(h, a);
        return rc;
    }
    if (strcmp(op, "reserve") == 0) {
        void *p = NULL;
        int rc = ((reserve_fn)fn("halMemAddressReserve"))(&p, a, 0, NULL, 0);
        if (rc == 0) *slot = put(p, a);
        return rc;
    }
    if (strcmp(op, "map") == 0) return ((map_fn)fn("halMemMap"))(slots[a], slot_size[b], 0, slots[b], 0);
    if (strcmp(op, "unmap") == 0) return ((ptr_fn)fn("halMemUnmap"))(slots[a]);
    if (strcmp(op, "release") == 0) return ((ptr_fn)fn("halMemRelease"))(slots[a]);
    return -100;
}

int main(int argc, char **argv) {
    if (getenv("HAL_ROUTE")) route = getenv("HAL_ROUTE");
    lib = dlopen("libascend_hal.so", RTLD_NOW);
    if (!lib) { fprintf(stderr, "ascend_hal: %s\n", dlerror()); return 2; }
    printf("route=%s\n", route);
    for (int i = 1; i < argc; i++) {
        char op[32] = {0};
        long a = 0, b = 0;
        if (sscanf(argv[i], "%31[a-z_]:%li:%li", op, &a, &b) < 1) return 2;
        int slot = -1;
        int rc = run_op(op, a, b, &slot);
        printf("%s rc=%d", argv[i], rc);
        if (slot >= 0) printf(" slot=%d", slot);
        printf("\n");
    }
    struct emu_stats s = {0};
    if (emu_hal_stats) emu_hal_stats(&s);
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {\"hal\":{\"outstanding_bytes\":%ld,\"outstanding_count\":%ld,\"alloc_calls\":%ld,"
           "\"release_calls\":%ld,\"failed_calls\":%ld,\"io_registrations\":%d},\"pinguard_live_bytes\":%ld}\n",
           (long)s.outstanding_bytes, (long)s.outstanding_count, (long)s.alloc_calls, (long)s.release_calls,
           (long)s.failed_calls, emu_hal_io_registrations ? emu_hal_io_registrations() : -1,
           live ? (long)live() : -1L);
    fflush(stdout);
    return 0;
}
