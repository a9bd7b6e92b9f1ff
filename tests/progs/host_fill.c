/* The host reserve's fill test: THREADS threads pin SIZE bytes at a time through the CUDA runtime
 * until one of their calls is refused (or MAX calls each), wait for each other, hold what they
 * pinned for HOLD_MS milliseconds (so that other processes of a group see it), then release it.
 *   host_fill THREADS SIZE MAX HOLD_MS [START_FILE]
 * With START_FILE, the threads start only once that file exists (at most 30 s): processes started
 * one after another then pin at the same moment, each with a reading taken before the others'.
 * Once filled, the process then writes START_FILE.PID and holds until START_FILE is removed (at
 * most 30 s) instead of for HOLD_MS: the test looks at the group while every member holds.
 * Prints STATS {"pinned":CALLS,"refused":CALLS,"rc":FIRST_REFUSAL_CODE}. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static size_t size;
static int max_calls;
static pthread_barrier_t filled;
static long pinned[64], refused[64];
static int first_rc[64];

static void *worker(void *arg) {
    long id = (long)arg;
    void **held = calloc((size_t)max_calls, sizeof *held);
    int n = 0;
    while (n < max_calls) {
        void *p = NULL;
        int rc = cudaHostAlloc(&p, size, 0);
        if (rc != 0) {
            refused[id]++;
            first_rc[id] = rc;
            break;
        }
        ((volatile char *)p)[0] = 1;
        held[n++] = p;
    }
    pinned[id] = n;
    pthread_barrier_wait(&filled);
    pthread_barrier_wait(&filled); /* main has held it all for HOLD_MS */
    for (int i = 0; i < n; i++)
        if (cudaFreeHost(held[i])) { fprintf(stderr, "host_fill: free failed\n"); exit(3); }
    free(held);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: host_fill THREADS SIZE MAX HOLD_MS [START_FILE]\n"); return 2; }
    int threads = atoi(argv[1]);
    size = strtoul(argv[2], NULL, 0);
    max_calls = atoi(argv[3]);
    long hold_ms = atol(argv[4]);
    if (threads < 1 || threads > 64) return 2;
    if (argc > 5) {
        struct timespec tick = {0, 1000000L};
        for (int i = 0; i < 30000 && access(argv[5], F_OK) != 0; i++) nanosleep(&tick, NULL);
    }
    pthread_barrier_init(&filled, NULL, (unsigned)threads + 1);
    pthread_t t[64];
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    pthread_barrier_wait(&filled);
    if (argc > 5) {
        char mark[4096];
        snprintf(mark, sizeof mark, "%s.%d", argv[5], (int)getpid());
        FILE *f = fopen(mark, "w");
        if (f) fclose(f);
        struct timespec tick = {0, 1000000L};
        for (int i = 0; i < 30000 && access(argv[5], F_OK) == 0; i++) nanosleep(&tick, NULL);
    } else {
        struct timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_barrier_wait(&filled);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    long p = 0, r = 0;
    int rc = 0;
    for (int i = 0; i < threads; i++) {
        p += pinned[i];
        r += refused[i];
        if (!rc) rc = first_rc[i];
    }
    printf("STATS {\"pinned\":%ld,\"refused\":%ld,\"rc\":%d}\n", p, r, rc);
    fflush(stdout);
    return 0;
}
