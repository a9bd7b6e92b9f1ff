/* The virtual-memory APIs' physical allocations, through one route, for the integration tests:
 *
 *   vmm ROUTE FAMILY OP...
 *   ROUTE   export (the exported names), dlsym (dlopen + dlsym(handle, name)), gpa
 *           (cuGetProcAddress_v2, the driver only), gpa_ptsz (the same with
 *           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: the _ptsz functions), ptsz (the
 *           exported _ptsz names)
 *   FAMILY  cuda (cuMemCreate ..., cuMemPoolCreate ...), acl (aclrtMallocPhysical ...) or
 *           cudart (the runtime's pools: cudaMemPoolCreate ...)
 *   OP      create:SIZE:WHERE (WHERE host, numa, numa_current, device; a handle slot h0, h1, ...)
 *           reserve:SIZE (an address slot v0, v1, ...)   map:V:H:SIZE   unmap:V:SIZE
 *           release:H   retain:V (a new handle slot)   touch:V:SIZE (writes the mapped pages)
 *           create_raw:SIZE:TYPE:LOC (a raw allocation type and location number)
 *           pool_create:WHERE (a pool slot p0, p1, ...)   pool_alloc:P:SIZE (an allocation slot
 *           a0, a1, ...)   pool_free:A   pool_trim:P:KEEP   pool_destroy:P   pool_reserved:P
 *           pool_default:WHERE, pool_current:WHERE (CUDA 13's per-location pools: a pool slot)
 *           pool_set:WHERE:P (makes pool P the location's current pool)
 *           host_alloc:SIZE (cuMemHostAlloc, an allocation slot)   host_register:A (registers
 *           that block again: cuMemHostRegister_v2)   host_free:A
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
int cuMemHostAlloc(void **, size_t, unsigned);
int cuMemHostRegister_v2(void *, size_t, unsigned);
int cuMemFreeHost(void *);
int cuMemPoolCreate(void **, const void *);
int cuMemGetDefaultMemPool(void **, const int *, int);
int cuMemGetMemPool(void **, const int *, int);
int cuMemSetMemPool(const int *, int, void *);
int cudaMemGetDefaultMemPool(void **, const int *, int);
int cudaMemGetMemPool(void **, const int *, int);
int cudaMemSetMemPool(const int *, int, void *);
int cuMemPoolDestroy(void *);
int cuMemPoolTrimTo(void *, size_t);
int cuMemPoolGetAttribute(void *, int, void *);
int cuMemAllocFromPoolAsync(u64 *, size_t, void *, void *);
int cuMemAllocFromPoolAsync_ptsz(u64 *, size_t, void *, void *);
int cuMemFreeAsync(u64, void *);
int cuMemFreeAsync_ptsz(u64, void *);
int cudaMemPoolCreate(void **, const void *);
int cudaMemPoolDestroy(void *);
int cudaMemPoolTrimTo(void *, size_t);
int cudaMemPoolGetAttribute(void *, int, void *);
int cudaMallocFromPoolAsync(void **, size_t, void *, void *);
int cudaMallocFromPoolAsync_ptsz(void **, size_t, void *, void *);
int cudaFreeAsync(void *, void *);
int cudaFreeAsync_ptsz(void *, void *);
void emu_cuda_stats(struct emu_stats *);
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
static int (*p_create)(void **, const void *) = cuMemPoolCreate;
static int (*p_destroy)(void *) = cuMemPoolDestroy;
static int (*p_trim)(void *, size_t) = cuMemPoolTrimTo;
static int (*p_attr)(void *, int, void *) = cuMemPoolGetAttribute;
static int (*p_alloc)(u64 *, size_t, void *, void *) = cuMemAllocFromPoolAsync;
static int (*p_free)(u64, void *) = cuMemFreeAsync;
static int (*r_create)(void **, const void *) = cudaMemPoolCreate;
static int (*r_destroy)(void *) = cudaMemPoolDestroy;
static int (*r_trim)(void *, size_t) = cudaMemPoolTrimTo;
static int (*r_attr)(void *, int, void *) = cudaMemPoolGetAttribute;
static int (*r_alloc)(void **, size_t, void *, void *) = cudaMallocFromPoolAsync;
static int (*r_free)(void *, void *) = cudaFreeAsync;
static int (*p_default)(void **, const int *, int) = cuMemGetDefaultMemPool;
static int (*p_current)(void **, const int *, int) = cuMemGetMemPool;
static int (*r_default)(void **, const int *, int) = cudaMemGetDefaultMemPool;
static int (*r_current)(void **, const int *, int) = cudaMemGetMemPool;

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
static u64 gpa_flags;
static void *gpa_sym(gpa2_t gpa, const char *name) {
    void *f = NULL;
    int st = -1;
    if (gpa(name, &f, 12090, gpa_flags, &st) != 0 || !f) { fprintf(stderr, "cuGetProcAddress %s: status %d\n", name, st); exit(3); }
    return f;
}

/* CUDA 13 names: asked for at version 13000. */
static void *gpa_sym13(gpa2_t gpa, const char *name) {
    void *f = NULL;
    int st = -1;
    if (gpa(name, &f, 13000, gpa_flags, &st) != 0 || !f) { fprintf(stderr, "cuGetProcAddress %s: status %d\n", name, st); exit(3); }
    return f;
}

static void routes(const char *route) {
    if (!strcmp(route, "export")) return;
    if (!strcmp(route, "ptsz")) {
        p_alloc = cuMemAllocFromPoolAsync_ptsz; p_free = cuMemFreeAsync_ptsz;
        r_alloc = cudaMallocFromPoolAsync_ptsz; r_free = cudaFreeAsync_ptsz;
        return;
    }
    void *cu = must_open("libcuda.so.1"), *acl = must_open("libascendcl.so"), *rt = must_open("libcudart.so");
    if (!strcmp(route, "dlsym")) {
        c_create = must_sym(cu, "cuMemCreate"); c_release = must_sym(cu, "cuMemRelease");
        c_reserve = must_sym(cu, "cuMemAddressReserve"); c_map = must_sym(cu, "cuMemMap");
        c_unmap = must_sym(cu, "cuMemUnmap"); c_retain = must_sym(cu, "cuMemRetainAllocationHandle");
        a_create = must_sym(acl, "aclrtMallocPhysical"); a_release = must_sym(acl, "aclrtFreePhysical");
        a_reserve = must_sym(acl, "aclrtReserveMemAddress"); a_map = must_sym(acl, "aclrtMapMem");
        a_unmap = must_sym(acl, "aclrtUnmapMem"); a_retain = must_sym(acl, "aclrtMemRetainAllocationHandle");
        p_create = must_sym(cu, "cuMemPoolCreate"); p_destroy = must_sym(cu, "cuMemPoolDestroy");
        p_trim = must_sym(cu, "cuMemPoolTrimTo"); p_attr = must_sym(cu, "cuMemPoolGetAttribute");
        p_alloc = must_sym(cu, "cuMemAllocFromPoolAsync"); p_free = must_sym(cu, "cuMemFreeAsync");
        r_create = must_sym(rt, "cudaMemPoolCreate"); r_destroy = must_sym(rt, "cudaMemPoolDestroy");
        r_trim = must_sym(rt, "cudaMemPoolTrimTo"); r_attr = must_sym(rt, "cudaMemPoolGetAttribute");
        r_alloc = must_sym(rt, "cudaMallocFromPoolAsync"); r_free = must_sym(rt, "cudaFreeAsync");
        p_default = must_sym(cu, "cuMemGetDefaultMemPool"); p_current = must_sym(cu, "cuMemGetMemPool");
        r_default = must_sym(rt, "cudaMemGetDefaultMemPool"); r_current = must_sym(rt, "cudaMemGetMemPool");
    } else if (!strcmp(route, "gpa") || !strcmp(route, "gpa_ptsz")) {
        gpa_flags = !strcmp(route, "gpa_ptsz") ? 2 : 0;
        gpa2_t gpa = must_sym(cu, "cuGetProcAddress_v2");
        c_create = gpa_sym(gpa, "cuMemCreate"); c_release = gpa_sym(gpa, "cuMemRelease");
        c_reserve = gpa_sym(gpa, "cuMemAddressReserve"); c_map = gpa_sym(gpa, "cuMemMap");
        c_unmap = gpa_sym(gpa, "cuMemUnmap"); c_retain = gpa_sym(gpa, "cuMemRetainAllocationHandle");
        p_create = gpa_sym(gpa, "cuMemPoolCreate"); p_destroy = gpa_sym(gpa, "cuMemPoolDestroy");
        p_trim = gpa_sym(gpa, "cuMemPoolTrimTo"); p_attr = gpa_sym(gpa, "cuMemPoolGetAttribute");
        p_alloc = gpa_sym(gpa, "cuMemAllocFromPoolAsync"); p_free = gpa_sym(gpa, "cuMemFreeAsync");
        p_default = gpa_sym13(gpa, "cuMemGetDefaultMemPool"); p_current = gpa_sym13(gpa, "cuMemGetMemPool");
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
static void *poolv[64];
static int npools;
static u64 allocs[1024];
static size_t alloc_size[1024];
static int nallocs;

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
    int acl = !strcmp(argv[2], "acl"), rt = !strcmp(argv[2], "cudart");
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
        } else if (!strcmp(op, "pool_create")) {
            unsigned char props[88];
            memset(props, 0, sizeof props);
            int type = 1, loc = where(0, a);
            memcpy(props, &type, 4);
            memcpy(props + 8, &loc, 4);
            void *p = NULL;
            rc = rt ? r_create(&p, props) : p_create(&p, props);
            if (!rc) poolv[npools++] = p;
        } else if (!strcmp(op, "pool_default") || !strcmp(op, "pool_current")) {
            int loc[2] = {where(0, a), 0};
            void *p = NULL;
            if (!strcmp(op, "pool_default")) rc = rt ? r_default(&p, loc, 1) : p_default(&p, loc, 1);
            else rc = rt ? r_current(&p, loc, 1) : p_current(&p, loc, 1);
            if (!rc) poolv[npools++] = p;
        } else if (!strcmp(op, "pool_set")) {
            int loc[2] = {where(0, a), 0};
            void *p = poolv[slot(b, 'p', npools)];
            rc = rt ? cudaMemSetMemPool(loc, 1, p) : cuMemSetMemPool(loc, 1, p);
        } else if (!strcmp(op, "pool_alloc")) {
            void *p = poolv[slot(a, 'p', npools)];
            size_t size = strtoul(b, NULL, 0);
            u64 d = 0;
            if (rt) { void *q = NULL; rc = r_alloc(&q, size, p, NULL); d = (u64)(uintptr_t)q; }
            else rc = p_alloc(&d, size, p, NULL);
            if (!rc) { memset((void *)(uintptr_t)d, 5, size); allocs[nallocs++] = d; }
        } else if (!strcmp(op, "pool_free")) {
            u64 d = allocs[slot(a, 'a', nallocs)];
            rc = rt ? r_free((void *)(uintptr_t)d, NULL) : p_free(d, NULL);
        } else if (!strcmp(op, "pool_trim")) {
            void *p = poolv[slot(a, 'p', npools)];
            rc = rt ? r_trim(p, strtoul(b, NULL, 0)) : p_trim(p, strtoul(b, NULL, 0));
        } else if (!strcmp(op, "pool_destroy")) {
            void *p = poolv[slot(a, 'p', npools)];
            rc = rt ? r_destroy(p) : p_destroy(p);
        } else if (!strcmp(op, "host_alloc")) {
            void *p = NULL;
            size_t size = strtoul(a, NULL, 0);
            rc = cuMemHostAlloc(&p, size, 0);
            if (!rc) { alloc_size[nallocs] = size; allocs[nallocs++] = (u64)(uintptr_t)p; }
        } else if (!strcmp(op, "host_register")) {
            int i = slot(a, 'a', nallocs);
            rc = cuMemHostRegister_v2((void *)(uintptr_t)allocs[i], alloc_size[i], 0);
        } else if (!strcmp(op, "host_free")) {
            rc = cuMemFreeHost((void *)(uintptr_t)allocs[slot(a, 'a', nallocs)]);
        } else if (!strcmp(op, "pool_reserved")) {
            void *p = poolv[slot(a, 'p', npools)];
            u64 v = 0;
            rc = rt ? r_attr(p, 5, &v) : p_attr(p, 5, &v);
            printf("reserved=%llu ", v);
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
    print_stats("cudart", emu_cuda_stats);
    printf(",");
    print_stats("acl", emu_acl_stats);
    printf(",\"pinguard_live_bytes\":%ld}\n", live ? (long)live() : -1L);
    fflush(stdout);
    return 0;
}
