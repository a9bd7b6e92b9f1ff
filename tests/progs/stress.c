/* THREADS threads each doing PAIRS allocate/release pairs of random sizes through the emulated
 * CUDA runtime (odd threads use ACL with a third argument "mixed"), under whatever budget pinguard has. Prints the runtimes'
 * own counters and how many calls were refused. */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int aclrtMallocHost(void **, size_t);
int aclrtFreeHost(void *);
void emu_cuda_stats(struct emu_stats *);
void emu_acl_stats(struct emu_stats *);

static int pairs, mixed;
static long refused[64], done[64], refused_bytes[64];

static void *worker(void *arg) {
    long id = (long)arg;
    unsigned seed = (unsigned)id * 7919u + 1;
    void *held[4] = {0};
    for (int i = 0; i < pairs; i++) {
        int k = rand_r(&seed) % 4;
        if (held[k]) {
            int rc = (mixed && (id & 1)) ? aclrtFreeHost(held[k]) : cudaFreeHost(held[k]);
            if (rc) { fprintf(stderr, "free failed %d\n", rc); exit(3); }
            held[k] = NULL;
        }
        size_t size = 4096 * (1 + rand_r(&seed) % 16);
        void *p = NULL;
        int rc = (mixed && (id & 1)) ? aclrtMallocHost(&p, size) : cudaHostAlloc(&p, size, 0);
        if (rc == 0) { held[k] = p; done[id]++; }
        else { refused[id]++; refused_bytes[id] += size; }
    }
    for (int k = 0; k < 4; k++)
        if (held[k]) ((mixed && (id & 1)) ? aclrtFreeHost(held[k]) : cudaFreeHost(held[k]));
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    pairs = argc > 2 ? atoi(argv[2]) : 10000;
    mixed = argc > 3 && argv[3][0] == 'm';
    pthread_t t[64];
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    long r = 0, d = 0, rb = 0;
    for (int i = 0; i < threads; i++) { r += refused[i]; d += done[i]; rb += refused_bytes[i]; }
    struct emu_stats c, a;
    emu_cuda_stats(&c);
    emu_acl_stats(&a);
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {\"refused\":%ld,\"refused_bytes\":%ld,\"succeeded\":%ld,"
           "\"cuda_max\":%ld,\"acl_max\":%ld,\"cuda_alloc\":%ld,\"acl_alloc\":%ld,"
           "\"cuda_release\":%ld,\"acl_release\":%ld,\"outstanding\":%ld,\"pinguard_live_bytes\":%ld}\n",
           r, rb, d, (long)c.max_outstanding_bytes, (long)a.max_outstanding_bytes, (long)c.alloc_calls,
           (long)a.alloc_calls, (long)c.release_calls, (long)a.release_calls,
           (long)(c.outstanding_bytes + a.outstanding_bytes), live ? (long)live() : -1L);
    return 0;
}
