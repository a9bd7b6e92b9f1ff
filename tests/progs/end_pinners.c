/* Four threads pin and free through the emulated CUDA runtime until the process is killed: the
 * test kills it with SIGKILL at a random moment and compares what pinguard left with the
 * runtime's own count (EMU_STATS_FILE).
 *   end_pinners SEED   prints "pinning" once every thread has pinned, then never returns.
 * Each thread keeps its first allocation for good and churns 16 slots (a free where a slot is
 * full, an allocation where it is empty), in sizes from 1 byte to 96 KiB: at any moment some
 * memory is held and each thread may be inside one call. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

#define THREADS 4
#define SLOTS 16
/* The test bounds the calls in flight by THREADS times the largest of these. */
static const size_t sizes[] = {1, 4096, 5000, 8192, 12288, 65536, 98304, 777};

static pthread_barrier_t started;

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The function the test expects in the callsites of a killed process: not inlined, so that it
 * has a frame and a line of its own. */
__attribute__((noinline)) static void pin_loop(uint64_t seed) {
    void *kept = NULL;
    if (cudaHostAlloc(&kept, sizes[seed % 8], 0) != 0) exit(3);
    pthread_barrier_wait(&started);
    void *slot[SLOTS] = {0};
    for (;;) {
        uint64_t r = next(&seed);
        void **p = &slot[r % SLOTS];
        if (*p) {
            if (cudaFreeHost(*p) != 0) exit(3);
            *p = NULL;
        } else if (cudaHostAlloc(p, sizes[(r >> 8) % 8], 0) != 0) {
            exit(3);
        }
        __asm__ volatile("" ::: "memory");
    }
}

static void *thread_main(void *arg) {
    pin_loop((uint64_t)(uintptr_t)arg);
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    pthread_barrier_init(&started, NULL, THREADS + 1);
    for (int i = 0; i < THREADS; i++) {
        pthread_t t;
        uint64_t s = seed * 4 + (uint64_t)i + 1;
        if (pthread_create(&t, NULL, thread_main, (void *)(uintptr_t)(s * 0x9e3779b97f4a7c15ull | 1)) != 0) return 3;
    }
    pthread_barrier_wait(&started);
    printf("pinning\n");
    fflush(stdout);
    for (;;) pause();
}
