/* The virtual-memory APIs' physical allocations, through one route, for the integration tests:
 *
 *   vmm ROUTE FAMILY OP...
 *   ROUTE   export (the exported names), dlsym (dlopen + dlsym(handle, name)), gpa
 *           (cuGetProcAddress_v2, CUDA only)
 *   FAMILY  cuda (cuMemCreate ...) or acl (aclrtMallocPhysical ...)
 *   OP      create:SIZE:WHERE (WHERE host, numa, numa_current, device; a handle slot h0, h1, ...)
 *           reserve:SIZE (an address slot v0, v1, ...)   map:V:H:SIZE   unmap:V:SIZE
 *           release:H   retain:V (a new handle slot)   touch:V:SIZE (writes the mapped pages)
 *           create_raw:SIZE:TYPE:LOC (a raw allocation type and location number)
 *
 * Prints "OP rc=N" per operation, then STATS with the emulated driver's and ACL's own counters and
 * pinguard's live bytes. */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long u64;
int cuMemCreate(u64 *, size_t, const void *, u64);
int cuMemRelease(u64);
int cuMemAddressReserve(u64 *, size_t, size_t, u64, u64);
int cuMemMap(u64, size_t, size_t, u64, u64);
int cuMemUnmap(u64, size_t);
int cuMemRetainAllocationHandle(u64 *, void *);
int aclrtMallocPhysical(void **, size_t, const void *, u64);
int aclrtFreePhysical(void *);
int aclrtReserveMemAddress(void **, size_t, size_t, void *, u64);
int aclrtMapMem(void *, size_t, size_t, void *, u64);
int aclrtUnmapMem(void *);
int aclrtMemRetainAllocationHandle(void *, void **);
void emu_driver_stats(struct emu_stats *);
void emu_acl_stats(struct emu_stats *);

static int (*c_create)(u64 *, size_t, const void *, u64) = cuMemCreate;
static int (*c_release)(u64) = cuMemRelease;
static int (*c_reserve)(u64 *, size_t, size_t, u64, u64) = cuMemAddressReserve;
static int (*c_map)(u64, size_t, size_t, u64, u64) = cuMemMap;
static int (*c_unmap)(u64, size_t) = cuMemUnmap;
static int (*c_retain)(u64 *, void *) = cuMemRetainAllocationHandle;
static int (*a_create)(void **, size_t, const void *, u64) = aclrtMallocPhysical;
static int (*a_release)(void *) = aclrtFreePhysical;
static int (*a_reserve)(void **, size_t, size_t, void *, u64) = aclrtReserveMemAddress;
static int (*a_map)(void *, size_t, size_t, void *, u64) = aclrtMapMem;
static int (*a_unmap)(void *) = aclrtUnmapMem;
static int (*a_retain)(void *, void **) = aclrtMemRetainAllocationHandle;

static void *must_open(const char *name) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", name, dlerror()); exit(3); }
    return h;
}

static void *must_sym(void *h, const char *name) {
    void *f = dlsym(h, name);
    if (!f) { fprintf(stderr, "dlsym %s: %s\n", name, dlerror()); exit(3); }
    return f;
}

typedef int (*gpa2_t)(const char *, void **, int, u64, int *);
static void *gpa_sym(gpa2_t gpa, const char *name) {
    void *f = NULL;
    int st = -1;
    if (gpa(name, &f, 12090, 0, &st) != 0 || !f) { fprintf(stderr, "cuGetProcAddress %s: status %d\n", name, st); exit(3); }
    return f;
}

static void routes(const char *route) {
    if (!strcmp(route, "export")) return;
    void *cu = must_open("libcuda.so.1"), *acl = must_open("libascendcl.so");
    if (!strcmp(route, "dlsym")) {
        c_create = must_sym(cu, "cuMemCreate"); c_release = must_sym(cu, "cuMemRelease");
        c_reserve = must_sym(cu, "cuMemAddressReserve"); c_map = must_sym(cu, "cuMemMap");
        c_unmap = must_sym(cu, "cuMemUnmap"); c_retain = must_sym(cu, "cuMemRetainAllocationHandle");
        a_create = must_sym(acl, "aclrtMallocPhysical"); a_release = must_sym(acl, "aclrtFreePhysical");
        a_reserve = must_sym(acl, "aclrtReserveMemAddress"); a_map = must_sym(acl, "aclrtMapMem");
        a_unmap = must_sym(acl, "aclrtUnmapMem"); a_retain = must_sym(acl, "aclrtMemRetainAllocationHandle");
    } else if (!strcmp(route, "gpa")) {
        gpa2_t gpa = must_sym(cu, "cuGetProcAddress_v2");
        c_create = gpa_sym(gpa, "cuMemCreate"); c_release = gpa_sym(gpa, "cuMemRelease");
        c_reserve = gpa_sym(gpa, "cuMemAddressReserve"); c_map = gpa_sym(gpa, "cuMemMap");
        c_unmap = gpa_sym(gpa, "cuMemUnmap"); c_retain = gpa_sym(gpa, "cuMemRetainAllocationHandle");
    } else {
        fprintf(stderr, "vmm: unknown route %s\n", route);
        exit(2);
    }
}

static u64 handles[256];
static size_t handle_size[256];
static int nhandles;
static char *vas[256];
static int nvas;

static int slot(const char *s, char kind, int n) {
    int i = (s[0] == kind) ? atoi(s + 1) : -1;
    if (i < 0 || i >= n) { fprintf(stderr, "vmm: no slot %s\n", s); exit(2); }
    return i;
}

/* A property block: CUDA's (type at 0, location {type, id} at 8) or ACL's (allocation type at
 * 4, location {id, type} at 12). */
static void prop_for(int acl, int type, int loc, unsigned char *prop) {
    memset(prop, 0, 32);
    if (acl) {
        memcpy(prop + 4, &type, 4);
        memcpy(prop + 16, &loc, 4);
        int id = 0;
        memcpy(prop + 12, &id, 4);
    } else {
        memcpy(prop, &type, 4);
        memcpy(prop + 8, &loc, 4);
    }
}

static int where(int acl, const char *w) {
    if (!strcmp(w, "host")) return acl ? 0 : 2;
    if (!strcmp(w, "numa")) return acl ? 4 : 3;
    if (!strcmp(w, "numa_current")) return acl ? 4 : 4;
    if (!strcmp(w, "device")) return 1;
    fprintf(stderr, "vmm: unknown location %s\n", w);
    exit(2);
}

static void print_stats(const char *name, void (*fn)(struct emu_stats *)) {
    struct emu_stats s;
    fn(&s);
    printf("\"%s\":{\"outstanding_bytes\":%ld,\"max_outstanding_bytes\":%ld,\"outstanding_count\":%ld,"
           "\"alloc_calls\":%ld,\"release_calls\":%ld,\"failed_calls\":%ld}",
           name, (long)s.outstanding_bytes, (long)s.max_outstanding_bytes, (long)s.outstanding_count,
           (long)s.alloc_calls, (long)s.release_calls, (long)s.failed_calls);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: vmm ROUTE FAMILY OP...\n"); return 2; }
    routes(argv[1]);
    int acl = !strcmp(argv[2], "acl");
    for (int i = 3; i < argc; i++) {
        char op[32] = {0}, a[64] = {0}, b[64] = {0}, c[64] = {0};
        sscanf(argv[i], "%31[^:]:%63[^:]:%63[^:]:%63s", op, a, b, c);
        int rc = 0;
        if (!strcmp(op, "create") || !strcmp(op, "create_raw")) {
            unsigned char prop[32];
            size_t size = strtoul(a, NULL, 0);
            if (!strcmp(op, "create")) prop_for(acl, acl ? 0 : 1, where(acl, b), prop);
            else prop_for(acl, atoi(b), atoi(c), prop);
            u64 h = 0;
            if (acl) { void *p = NULL; rc = a_create(&p, size, prop, 0); h = (u64)(uintptr_t)p; }
            else rc = c_create(&h, size, prop, 0);
            if (!rc) { handle_size[nhandles] = size; handles[nhandles++] = h; }
        } else if (!strcmp(op, "reserve")) {
            size_t size = strtoul(a, NULL, 0);
            if (acl) { void *p = NULL; rc = a_reserve(&p, size, 0, NULL, 0); vas[nvas] = p; }
            else { u64 p = 0; rc = c_reserve(&p, size, 0, 0, 0); vas[nvas] = (char *)(uintptr_t)p; }
            if (!rc) nvas++;
        } else if (!strcmp(op, "map")) {
            char *va = vas[slot(a, 'v', nvas)];
            int h = slot(b, 'h', nhandles);
            size_t size = strtoul(c, NULL, 0);
            if (!size) size = handle_size[h];
            rc = acl ? a_map(va, size, 0, (void *)(uintptr_t)handles[h], 0) : c_map((u64)(uintptr_t)va, size, 0, handles[h], 0);
        } else if (!strcmp(op, "unmap")) {
            char *va = vas[slot(a, 'v', nvas)];
            rc = acl ? a_unmap(va) : c_unmap((u64)(uintptr_t)va, strtoul(b, NULL, 0));
        } else if (!strcmp(op, "release")) {
            u64 h = handles[slot(a, 'h', nhandles)];
            rc = acl ? a_release((void *)(uintptr_t)h) : c_release(h);
        } else if (!strcmp(op, "retain")) {
            char *va = vas[slot(a, 'v', nvas)];
            u64 h = 0;
            if (acl) { void *p = NULL; rc = a_retain(va, &p); h = (u64)(uintptr_t)p; }
            else rc = c_retain(&h, va);
            if (!rc) { handle_size[nhandles] = 0; handles[nhandles++] = h; }
        } else if (!strcmp(op, "touch")) {
            char *va = vas[slot(a, 'v', nvas)];
            memset(va, 7, strtoul(b, NULL, 0));
        } else {
            fprintf(stderr, "vmm: unknown op %s\n", op);
            return 2;
        }
        printf("%s rc=%d\n", argv[i], rc);
    }
    u64 (*live)(void) = (u64 (*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {");
    print_stats("driver", emu_driver_stats);
    printf(",");
    print_stats("acl", emu_acl_stats);
    printf(",\"pinguard_live_bytes\":%ld}\n", live ? (long)live() : -1L);
    fflush(stdout);
    return 0;
}
