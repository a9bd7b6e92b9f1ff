/* Runs RDMA memory registrations given as arguments, through the route IBV_ROUTE names, and prints
 * what each returned (rc 0 and the handle's slot, or rc -1 and errno; an int call's own answer),
 * then the emulated library's own counters and pinguard's live bytes.
 *
 *   IBV_ROUTE=export (default): the library's exports, linked by name (ibv_reg_mr@IBVERBS_1.1)
 *   IBV_ROUTE=dlsym: dlsym(dlopen("libibverbs.so.1"), name)
 *   IBV_ROUTE=dlvsym: dlvsym(handle, name, version), each name at its newest version, as NCCL
 *   IBV_ROUTE=dlvsym10: the same, ibv_reg_mr and ibv_dereg_mr at IBVERBS_1.0
 *
 *   reg:SIZE[:ACCESS] (ibv_reg_mr on fresh pages; ACCESS default IBV_ACCESS_LOCAL_WRITE)
 *   iova:SIZE[:ACCESS] (ibv_reg_mr_iova)  iova2:SIZE[:ACCESS] (ibv_reg_mr_iova2)
 *   dmabuf:SIZE (ibv_reg_dmabuf_mr of a memfd)  rereg:SLOT:SIZE (ibv_rereg_mr to fresh pages)
 *   dereg:SLOT (ibv_dereg_mr)  touch:SLOT (writes every byte of the registered range)
 */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct ibv_pd;
struct ibv_mr {
    void *context;
    struct ibv_pd *pd;
    void *addr;
    size_t length;
    uint32_t handle, lkey, rkey;
};
typedef struct ibv_mr *(*reg_fn)(struct ibv_pd *, void *, size_t, int);
typedef struct ibv_mr *(*iova_fn)(struct ibv_pd *, void *, size_t, uint64_t, int);
typedef struct ibv_mr *(*iova2_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
typedef struct ibv_mr *(*dmabuf_fn)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
typedef int (*rereg_fn)(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
typedef int (*dereg_fn)(struct ibv_mr *);

struct ibv_pd *ibv_alloc_pd(void *);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *, size_t, int);
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *, void *, size_t, uint64_t, int);
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
int ibv_rereg_mr(struct ibv_mr *, int, struct ibv_pd *, void *, size_t, int);
int ibv_dereg_mr(struct ibv_mr *);
void emu_ibverbs_stats(struct emu_stats *) __attribute__((weak));
int emu_ibverbs_compat_calls(void) __attribute__((weak));

static const struct { const char *name, *version; void *fn; } exports[] = {
    {"ibv_reg_mr", "IBVERBS_1.1", (void *)ibv_reg_mr},
    {"ibv_reg_mr_iova", "IBVERBS_1.7", (void *)ibv_reg_mr_iova},
    {"ibv_reg_mr_iova2", "IBVERBS_1.8", (void *)ibv_reg_mr_iova2},
    {"ibv_reg_dmabuf_mr", "IBVERBS_1.12", (void *)ibv_reg_dmabuf_mr},
    {"ibv_rereg_mr", "IBVERBS_1.1", (void *)ibv_rereg_mr},
    {"ibv_dereg_mr", "IBVERBS_1.1", (void *)ibv_dereg_mr},
};

static void *lib;
static const char *route = "export";

static void *fn(const char *name) {
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++) {
        if (strcmp(exports[i].name, name) != 0) continue;
        if (strcmp(route, "dlsym") == 0) return dlsym(lib, name);
        if (strcmp(route, "dlvsym") == 0) return dlvsym(lib, name, exports[i].version);
        if (strcmp(route, "dlvsym10") == 0) {
            int old = strcmp(name, "ibv_reg_mr") == 0 || strcmp(name, "ibv_dereg_mr") == 0;
            return dlvsym(lib, name, old ? "IBVERBS_1.0" : exports[i].version);
        }
        return exports[i].fn;
    }
    return NULL;
}

static struct ibv_mr *slots[256];
static int nslots;

static void *pages(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* 0 and the slot, or -1 (errno as the call left it). */
static int handle_rc(struct ibv_mr *mr, int *slot) {
    if (!mr) return -1;
    slots[nslots] = mr;
    *slot = nslots++;
    return 0;
}

static int run_op(struct ibv_pd *pd, const char *op, long a, long b, int has_b, int *slot) {
    int access = has_b ? (int)b : 1;
    if (strcmp(op, "reg") == 0) return handle_rc(((reg_fn)fn("ibv_reg_mr"))(pd, pages(a), a, access), slot);
    if (strcmp(op, "iova") == 0) {
        void *p = pages(a);
        return handle_rc(((iova_fn)fn("ibv_reg_mr_iova"))(pd, p, a, (uintptr_t)p, access), slot);
    }
    if (strcmp(op, "iova2") == 0) {
        void *p = pages(a);
        return handle_rc(((iova2_fn)fn("ibv_reg_mr_iova2"))(pd, p, a, (uintptr_t)p, (unsigned)access), slot);
    }
    if (strcmp(op, "dmabuf") == 0) {
        int fd = memfd_create("dmabuf", MFD_CLOEXEC);
        return handle_rc(((dmabuf_fn)fn("ibv_reg_dmabuf_mr"))(pd, 0, a, 0, fd, 1), slot);
    }
    if (strcmp(op, "rereg") == 0) return ((rereg_fn)fn("ibv_rereg_mr"))(slots[a], 1, NULL, pages(b), b, 0);
    if (strcmp(op, "dereg") == 0) return ((dereg_fn)fn("ibv_dereg_mr"))(slots[a]);
    if (strcmp(op, "touch") == 0) {
        memset(slots[a]->addr, 0x5a, slots[a]->length);
        return 0;
    }
    return -100;
}

int main(int argc, char **argv) {
    if (getenv("IBV_ROUTE")) route = getenv("IBV_ROUTE");
    lib = dlopen("libibverbs.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "ibverbs: %s\n", dlerror()); return 2; }
    struct ibv_pd *pd = ibv_alloc_pd(NULL);
    printf("route=%s\n", route);
    for (int i = 1; i < argc; i++) {
        char op[32] = {0};
        long a = 0, b = 0;
        int n = sscanf(argv[i], "%31[a-z0-9_]:%li:%li", op, &a, &b);
        if (n < 1) return 2;
        int slot = -1;
        errno = 0;
        int rc = run_op(pd, op, a, b, n == 3, &slot);
        int err = errno;
        printf("%s rc=%d errno=%d", argv[i], rc, rc == 0 ? 0 : err);
        if (slot >= 0) printf(" slot=%d", slot);
        printf("\n");
    }
    struct emu_stats s = {0};
    if (emu_ibverbs_stats) emu_ibverbs_stats(&s);
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {\"ibverbs\":{\"outstanding_bytes\":%ld,\"outstanding_count\":%ld,\"alloc_calls\":%ld,"
           "\"release_calls\":%ld,\"failed_calls\":%ld,\"compat_calls\":%d},\"pinguard_live_bytes\":%ld}\n",
           (long)s.outstanding_bytes, (long)s.outstanding_count, (long)s.alloc_calls, (long)s.release_calls,
           (long)s.failed_calls, emu_ibverbs_compat_calls ? emu_ibverbs_compat_calls() : -1,
           live ? (long)live() : -1L);
    fflush(stdout);
    return 0;
}
