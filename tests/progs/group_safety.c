/* Group-ledger safety cases (tests/safety_group.rs), one per mode:
 *
 *   exec SIZE         pins SIZE bytes, then execs itself as "after_exec SIZE"
 *   after_exec SIZE   pins SIZE bytes, prints "ready", and holds them until a line on stdin
 *   fsize GROUP       execs itself as "idle" in GROUP with a 4 KiB file-size limit, so that the
 *                     new image is killed (SIGXFSZ) the moment pinguard sizes the group's ledger
 *   idle              prints "alive"
 *   try N             makes N cudaHostAlloc calls of 64 KiB, prints how many were refused, and
 *                     stays a member until its stdin closes
 *   nofile            a 64 KiB cudaHostAlloc with no descriptor left (RLIMIT_NOFILE 3), then
 *                     one of 64 KiB and one of 4 KiB with the limit back
 *   cancel N          a thread makes N refused cudaHostAlloc calls with a cancellation already
 *                     requested; it is cancelled at its own pthread_testcancel afterwards
 *   steps             one call per line of stdin, each answered with a line "rc=RC ms=MS" (MS:
 *                     how long the call took): "alloc SIZE" (cudaHostAlloc into the next slot),
 *                     "free SLOT" (cudaFreeHost); "exit" or the end of stdin ends the program
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static int calls;
static int go;
static int refused;
static pthread_barrier_t started;

static void *canceled_worker(void *arg) {
    (void)arg;
    void *p = NULL;
    /* Untracked (size 0): sets up pinguard's per-thread state before the cancellation arrives. */
    cudaHostAlloc(&p, 0, 0);
    pthread_barrier_wait(&started);
    while (!__atomic_load_n(&go, __ATOMIC_SEQ_CST)) {
    }
    /* No cancellation point of this program's own until the loop is over: a cancellation acted on
     * before pthread_testcancel happened inside pinguard. */
    for (int i = 0; i < calls; i++)
        if (cudaHostAlloc(&p, 65536, 0) != 0) refused++;
    pthread_testcancel();
    return NULL;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int steps(void) {
    void *slots[64] = {0};
    int n = 0;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long arg = 0;
        int rc;
        double start = now_ms();
        if (sscanf(line, "alloc %lu", &arg) == 1 && n < 64) {
            rc = cudaHostAlloc(&slots[n++], arg, 0);
        } else if (sscanf(line, "free %lu", &arg) == 1 && arg < 64) {
            rc = cudaFreeHost(slots[arg]);
        } else {
            break;
        }
        printf("rc=%d ms=%.0f\n", rc, now_ms() - start);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    void *p = NULL;
    if (!strcmp(mode, "exec") && argc > 2) {
        int rc = cudaHostAlloc(&p, strtoul(argv[2], NULL, 0), 0);
        printf("first rc=%d\n", rc);
        fflush(stdout);
        char *args[] = {argv[0], "after_exec", argv[2], NULL};
        execv(argv[0], args);
        perror("execv");
        return 2;
    }
    if (!strcmp(mode, "after_exec") && argc > 2) {
        int rc = cudaHostAlloc(&p, strtoul(argv[2], NULL, 0), 0);
        printf("second rc=%d\nready\n", rc);
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 3;
        return 0;
    }
    if (!strcmp(mode, "fsize") && argc > 2) {
        setenv("PINGUARD_GROUP", argv[2], 1);
        struct rlimit fsize = {4096, 4096}, core = {0, 0};
        setrlimit(RLIMIT_FSIZE, &fsize);
        setrlimit(RLIMIT_CORE, &core);
        char *args[] = {argv[0], "idle", NULL};
        execv(argv[0], args);
        perror("execv");
        return 2;
    }
    if (!strcmp(mode, "idle")) {
        printf("alive\n");
        return 0;
    }
    if (!strcmp(mode, "try") && argc > 2) {
        int n = atoi(argv[2]), denied = 0;
        for (int i = 0; i < n; i++)
            if (cudaHostAlloc(&p, 65536, 0) != 0) denied++;
        printf("refused=%d\n", denied);
        fflush(stdout);
        char line[16];
        while (fgets(line, sizeof line, stdin)) {
        }
        return 0;
    }
    if (!strcmp(mode, "nofile")) {
        struct rlimit was, none;
        getrlimit(RLIMIT_NOFILE, &was);
        none = was;
        none.rlim_cur = 3;
        setrlimit(RLIMIT_NOFILE, &none);
        int starved = cudaHostAlloc(&p, 65536, 0);
        setrlimit(RLIMIT_NOFILE, &was);
        int big = cudaHostAlloc(&p, 65536, 0);
        int small = cudaHostAlloc(&p, 4096, 0);
        printf("starved=%d big=%d small=%d\n", starved, big, small);
        return 0;
    }
    if (!strcmp(mode, "cancel") && argc > 2) {
        calls = atoi(argv[2]);
        pthread_t t;
        pthread_barrier_init(&started, NULL, 2);
        pthread_create(&t, NULL, canceled_worker, NULL);
        pthread_barrier_wait(&started);
        pthread_cancel(t);
        __atomic_store_n(&go, 1, __ATOMIC_SEQ_CST);
        void *ret = NULL;
        pthread_join(t, &ret);
        printf("canceled=%d refused=%d\n", ret == PTHREAD_CANCELED, refused);
        return 0;
    }
    if (!strcmp(mode, "steps")) return steps();
    fprintf(stderr, "usage: group_safety exec SIZE | fsize GROUP | try N | nofile | cancel N | steps\n");
    return 2;
}
