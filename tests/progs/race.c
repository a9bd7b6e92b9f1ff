/* THREADS threads each doing OPS random operations over every family at once: the CUDA runtime,
 * the CUDA driver (through cuGetProcAddress), Ascend ACL, and mlock/munlock on private pages,
 * each thread holding up to four allocations. The emulated runtimes and this program's own mlock
 * calls feed one combined counter (emu_combined_add), whose maximum must stay within the budget.
 *   race THREADS OPS [SEED]      prints a STATS line; exits 3 if a release fails */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int aclrtMallocHost(void **, size_t);
int aclrtFreeHost(void *);
void emu_cuda_stats(struct emu_stats *);
void emu_acl_stats(struct emu_stats *);

static int64_t combined, combined_max;
void emu_combined_add(int64_t bytes) {
    int64_t now = __atomic_add_fetch(&combined, bytes, __ATOMIC_SEQ_CST);
    int64_t max = __atomic_load_n(&combined_max, __ATOMIC_SEQ_CST);
    while (now > max && !__atomic_compare_exchange_n(&combined_max, &max, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

static int (*drv_alloc)(void **, size_t, unsigned);
static int (*drv_free)(void *);
static int ops;
enum { CUDA, DRIVER, ACL, MLOCK, KINDS };
#define SLOTS 4
#define SLOT_PAGES 16

struct tally {
    long ok[KINDS], refused[KINDS], released[KINDS];
    long refused_bytes;
} tallies[64];

static void *worker(void *arg) {
    long id = (long)arg;
    struct tally *t = &tallies[id];
    unsigned seed = (unsigned)id * 2654435761u + (unsigned)ops;
    char *arena = mmap(NULL, SLOTS * SLOT_PAGES * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct { int kind; void *p; size_t size; } held[SLOTS] = {{0}};
    for (int k = 0; k < SLOTS; k++) held[k].kind = -1;
    for (int i = 0; i < ops; i++) {
        int k = rand_r(&seed) % SLOTS;
        if (held[k].kind >= 0) {
            int rc = 0;
            switch (held[k].kind) {
            case CUDA: rc = cudaFreeHost(held[k].p); break;
            case DRIVER: rc = drv_free(held[k].p); break;
            case ACL: rc = aclrtFreeHost(held[k].p); break;
            case MLOCK:
                emu_combined_add(-(int64_t)held[k].size);
                rc = munlock(held[k].p, held[k].size);
                break;
            }
            if (rc) { fprintf(stderr, "release kind %d failed: %d\n", held[k].kind, rc); exit(3); }
            t->released[held[k].kind]++;
            held[k].kind = -1;
        }
        int kind = rand_r(&seed) % KINDS;
        size_t size = 4096 * (1 + rand_r(&seed) % SLOT_PAGES);
        void *p = NULL;
        int rc;
        switch (kind) {
        case CUDA: rc = cudaHostAlloc(&p, size, 0); break;
        case DRIVER: rc = drv_alloc(&p, size, 0); break;
        case ACL: rc = aclrtMallocHost(&p, size); break;
        default:
            p = arena + k * SLOT_PAGES * 4096;
            /* The program cannot count its own locks before pinguard decides on them, so it counts
             * them only while it knows they are held (after mlock, until munlock): this part of
             * the combined figure may under-state, never over-state. The runtimes count
             * conservatively, and pinguard's mlock accounting is checked against VmLck elsewhere. */
            rc = mlock(p, size);
            if (rc == 0) emu_combined_add((int64_t)size);
        }
        if (rc == 0) {
            held[k].kind = kind; held[k].p = p; held[k].size = size;
            t->ok[kind]++;
        } else {
            t->refused[kind]++;
            t->refused_bytes += size;
        }
    }
    for (int k = 0; k < SLOTS; k++) {
        if (held[k].kind < 0) continue;
        switch (held[k].kind) {
        case CUDA: cudaFreeHost(held[k].p); break;
        case DRIVER: drv_free(held[k].p); break;
        case ACL: aclrtFreeHost(held[k].p); break;
        case MLOCK: emu_combined_add(-(int64_t)held[k].size); munlock(held[k].p, held[k].size); break;
        }
        t->released[held[k].kind]++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 16;
    ops = argc > 2 ? atoi(argv[2]) : 10000;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(h, "cuGetProcAddress_v2");
    int st;
    gpa("cuMemHostAlloc", (void **)&drv_alloc, 12090, 0, &st);
    gpa("cuMemFreeHost", (void **)&drv_free, 12090, 0, &st);
    pthread_t th[64];
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    long ok[KINDS] = {0}, refused[KINDS] = {0}, released[KINDS] = {0}, refused_bytes = 0;
    for (int i = 0; i < threads; i++) {
        refused_bytes += tallies[i].refused_bytes;
        for (int k = 0; k < KINDS; k++) {
            ok[k] += tallies[i].ok[k]; refused[k] += tallies[i].refused[k]; released[k] += tallies[i].released[k];
        }
    }
    /* Every reservation was given back: the whole budget is available again. */
    long budget = getenv("PINGUARD_BUDGET") ? atol(getenv("PINGUARD_BUDGET")) : 0;
    int probe = -1, probe_failures = 0;
    /* Retried: with EMU_FAIL_RATE the runtime itself may refuse a few times. */
    for (int tries = 0; budget > 0 && tries < 20 && probe != 0; tries++) {
        void *p;
        probe = cudaHostAlloc(&p, (size_t)budget, 0);
        if (probe == 0) cudaFreeHost(p);
        else probe_failures++;
    }
    struct emu_stats c, d, a;
    emu_cuda_stats(&c);
    emu_acl_stats(&a);
    ((void (*)(struct emu_stats *))dlsym(h, "emu_driver_stats"))(&d);
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {\"combined_max\":%ld,\"combined\":%ld,\"probe\":%d,\"probe_failures\":%d,\"refused_bytes\":%ld,"
           "\"ok\":[%ld,%ld,%ld,%ld],\"refused\":[%ld,%ld,%ld,%ld],\"released\":[%ld,%ld,%ld,%ld],"
           "\"runtime_alloc\":[%ld,%ld,%ld],\"runtime_release\":[%ld,%ld,%ld],\"runtime_failed\":[%ld,%ld,%ld],"
           "\"injected\":[%ld,%ld,%ld],\"pinguard_live_bytes\":%ld}\n",
           (long)combined_max, (long)combined, probe, probe_failures, refused_bytes,
           ok[0], ok[1], ok[2], ok[3], refused[0], refused[1], refused[2], refused[3],
           released[0], released[1], released[2], released[3],
           (long)c.alloc_calls, (long)d.alloc_calls, (long)a.alloc_calls,
           (long)c.release_calls, (long)d.release_calls, (long)a.release_calls,
           (long)c.failed_calls, (long)d.failed_calls, (long)a.failed_calls,
           (long)c.injected_failures, (long)d.injected_failures, (long)a.injected_failures,
           live ? (long)live() : -1L);
    return 0;
}
