/* The bundled example workload: what an inference service does with pinned memory, through the
 * emulated CUDA and Ascend runtimes and real mlock. Run it under pinguard (scripts/demo.sh). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaMallocHost(void **, size_t);
int cudaFreeHost(void *);
int aclrtMallocHost(void **, size_t);
int aclrtHostRegisterV2(void *, uint64_t, uint32_t);

#define KiB 1024UL
#define MiB (1024 * KiB)

/* Weights staged in pinned memory and never given back: the "leak" a report should point at. */
__attribute__((noinline)) static void load_model_weights(void) {
    volatile int shards = 2; /* volatile: one call site, not an unrolled pair */
    for (int i = 0; i < shards; i++) {
        void *p;
        int rc = cudaHostAlloc(&p, 1 * MiB, 0);
        printf("load_model_weights: cudaHostAlloc(1 MiB) = %d\n", rc);
    }
}

/* A per-batch allocate/free loop, as a DataLoader with pin_memory does. */
__attribute__((noinline)) static void pin_batches(int n) {
    for (int i = 0; i < n; i++) {
        void *p;
        if (cudaMallocHost(&p, 256 * KiB) == 0) {
            memset(p, i, 256 * KiB);
            cudaFreeHost(p);
        }
    }
    printf("pin_batches: %d batches of 256 KiB pinned and released\n", n);
}

__attribute__((noinline)) static void npu_staging(void) {
    void *p;
    printf("npu_staging: aclrtMallocHost(512 KiB) = %d\n", aclrtMallocHost(&p, 512 * KiB));
    void *buf = mmap(NULL, 256 * KiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("npu_staging: aclrtHostRegisterV2(256 KiB) = %d\n", aclrtHostRegisterV2(buf, 256 * KiB, 0x10000000));
}

__attribute__((noinline)) static void lock_key_material(void) {
    void *p = mmap(NULL, 64 * KiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("lock_key_material: mlock(64 KiB) = %d\n", mlock(p, 64 * KiB));
}

/* Asks for more than the budget leaves: refused under `error`, pageable under `downgrade`. */
__attribute__((noinline)) static void grow_kv_cache(void) {
    void *p;
    int rc = cudaHostAlloc(&p, 4 * MiB, 0);
    printf("grow_kv_cache: cudaHostAlloc(4 MiB) = %d%s\n", rc, rc == 2 ? " (cudaErrorMemoryAllocation)" : "");
}

int main(void) {
    load_model_weights();
    pin_batches(100);
    npu_staging();
    lock_key_material();
    grow_kv_cache();
    return 0;
}
