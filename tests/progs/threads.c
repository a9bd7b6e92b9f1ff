/* Threads that come and go, hold memory at the same time and take turns: pinguard's per-thread
 * counters and striped live figures must add up, and its peaks must be exact.
 *   threads churn ROUNDS WIDTH   ROUNDS times WIDTH threads at once, each pinning three buffers,
 *                                releasing two and handing the third to main (released there),
 *                                and pinning once more from a thread-exit destructor
 *   threads turns PHASES         PHASES from: t threads taking turns (16..64 KiB one at a time),
 *                                p two holding at once (40 + 48 KiB), c 24 holding at once
 *                                (8 KiB each); prints the peak each phase must reach */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

/* Every allocation comes from here: one callsite at PINGUARD_DEPTH=1. */
__attribute__((noinline)) static void *pin(size_t size) {
    void *p = NULL;
    if (cudaHostAlloc(&p, size, 0) != 0) {
        fprintf(stderr, "cudaHostAlloc(%zu) failed\n", size);
        exit(3);
    }
    __asm__ volatile("" ::: "memory");
    return p;
}

static void unpin(void *p) {
    if (cudaFreeHost(p) != 0) exit(3);
}

static pthread_key_t key;
static void at_thread_exit(void *v) {
    (void)v;
    unpin(pin(512)); /* after pinguard's own destructor may have run */
}

static void **handed;
static void *churner(void *arg) {
    long i = (long)arg;
    pthread_setspecific(key, (void *)1);
    void *a = pin(4096), *b = pin(8192), *c = pin(1024);
    unpin(a);
    unpin(b);
    handed[i] = c;
    return NULL;
}

static pthread_barrier_t held;
static void *holder(void *arg) {
    void *p = pin((size_t)(long)arg);
    pthread_barrier_wait(&held); /* everyone holds */
    pthread_barrier_wait(&held); /* main has looked */
    unpin(p);
    return NULL;
}

static void *one_turn(void *arg) {
    unpin(pin((size_t)(long)arg));
    return NULL;
}

static void hold_at_once(int n, const size_t *sizes) {
    pthread_t t[64];
    pthread_barrier_init(&held, NULL, n + 1);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, holder, (void *)(long)sizes[i]);
    pthread_barrier_wait(&held);
    pthread_barrier_wait(&held);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&held);
}

int main(int argc, char **argv) {
    if (argc > 3 && !strcmp(argv[1], "churn")) {
        int rounds = atoi(argv[2]), width = atoi(argv[3]);
        pthread_key_create(&key, at_thread_exit);
        handed = calloc((size_t)rounds * width, sizeof *handed);
        pthread_t t[64];
        for (int r = 0; r < rounds; r++) {
            for (int i = 0; i < width; i++) pthread_create(&t[i], NULL, churner, (void *)(long)(r * width + i));
            for (int i = 0; i < width; i++) pthread_join(t[i], NULL);
        }
        for (long i = 0; i < (long)rounds * width; i++) unpin(handed[i]);
        printf("STATS {\"threads\":%d,\"allocs\":%d}\n", rounds * width, rounds * width * 4);
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "turns")) {
        const char *phases = argv[2];
        long turns = 0, pair = 0, crowd = 0;
        /* One at a time: 16, 32, 48, 64 KiB. */
        for (long k = 1; strchr(phases, 't') && k <= 4; k++) {
            pthread_t t;
            pthread_create(&t, NULL, one_turn, (void *)(k * 16384));
            pthread_join(t, NULL);
        }
        if (strchr(phases, 't')) turns = 4 * 16384;
        if (strchr(phases, 'p')) {
            size_t two[2] = {40960, 49152};
            hold_at_once(2, two);
            pair = 40960 + 49152;
        }
        if (strchr(phases, 'c')) {
            /* More threads than pinguard has stripes to give. */
            size_t many[24];
            for (int i = 0; i < 24; i++) many[i] = 8192;
            hold_at_once(24, many);
            crowd = 24 * 8192;
        }
        printf("STATS {\"turns\":%ld,\"pair\":%ld,\"crowd\":%ld}\n", turns, pair, crowd);
        return 0;
    }
    return 2;
}
