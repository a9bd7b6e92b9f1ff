/* The benchmark driver of scripts/bench.sh; run with and without pinguard.
 *   bench pairs  KIND THREADS N   ns per allocate/release pair (KIND: cuda, mlock, mmap)
 *   bench scale  KIND N ROUNDS    two threads on one callsite: the median over ROUNDS of two
 *                                 threads' throughput over one thread's, phases back to back
 *                                 (BENCH_THREADS=T: the main thread and T-1 workers).
 *                                 BENCH_ALTERNATE=1 (cuda): rounds alternate between the hooked
 *                                 entry points and the runtime's own, found with dlsym in
 *                                 libcudart.so itself (so that a preloaded library is passed
 *                                 by): prints the medians of the tracked and untracked rounds'
 *                                 scaling and of each neighbouring pair's tracked/untracked.
 *                                 BENCH_WORKERS=1: only workers pin, after one pair of the
 *                                 main thread's (pin-memory threads): one worker alone, then
 *                                 BENCH_THREADS of them
 *   bench live   N                memory: N live allocations from one callsite (EMU_NO_PIN=1)
 *   bench report N SITES          N live allocations over SITES callsites, then one report
 *   bench mlockfail MAPS N        ns per failing mlock: N calls over RLIMIT_MEMLOCK (64 KiB,
 *                                 CAP_IPC_LOCK dropped) in a process with MAPS more mappings
 *   bench mlockhole MAPS N        ns per mlock over a hole: N calls of mlock of 16 pages whose
 *                                 9th is unmapped (the kernel locks the first 8, then fails with
 *                                 ENOMEM), after a first such call, with MAPS more mappings
 * BENCH_FRAMES sets the loop's depth (default 32). For `pairs`: BENCH_MAIN_FIRST=1 has the main
 * thread make one pair from the same callsite before the workers start (as a program whose main
 * thread pinned before its pin-memory thread did); BENCH_SHORT=K makes each worker a chain of
 * threads of K pairs each, one starting when the last has ended (threads that start and end).
 * BENCH_TURNS=1 makes the workers take turns pair by pair (never two holding memory at once);
 * BENCH_SITES=2 makes each thread's cuda pairs alternate between two callsites.
 * BENCH_MALLOC=1 makes the cuda kind a malloc/free pair of the same size (for a heap tracer). For `scale`: BENCH_SITES=2 gives the second
 * thread a callsite of its own (at PINGUARD_DEPTH 32), BENCH_SITES=3 alternates the two and
 * prints the shared callsite's scaling over the separate one's, BENCH_TRACE=1 prints each round's
 * times on stderr. BENCH_MAPS=1 makes `pairs` print its /proc/self/maps on stderr (to place the
 * addresses a tracing tool reports). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static const char *kind;
static long n;
static int use_malloc;
/* The runtime's own entry points, past any preloaded library (BENCH_ALTERNATE), and whether the
 * phase running now calls them. */
static int (*real_alloc)(void **, size_t, unsigned);
static int (*real_free)(void *);
static volatile int untracked;

/* BENCH_TURNS=1 (`pairs`): the workers take turns, pair by pair (a mutex and a condition
 * variable pass the turn), so that no two of them ever hold memory at once. */
static int turns;
static long turn;
static pthread_mutex_t turn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cv = PTHREAD_COND_INITIALIZER;
static __thread long my_turn = -1;
static void take_turn(void) {
    pthread_mutex_lock(&turn_mu);
    while (turn % turns != my_turn) pthread_cond_wait(&turn_cv, &turn_mu);
    pthread_mutex_unlock(&turn_mu);
}
static void pass_turn(void) {
    pthread_mutex_lock(&turn_mu);
    turn++;
    pthread_cond_broadcast(&turn_cv);
    pthread_mutex_unlock(&turn_mu);
}

/* The loop runs under BENCH_FRAMES frames of its own (default 32), as in a real program, so a
 * walk at PINGUARD_DEPTH=32 has 32 frames to walk. */
static void loop(void);
__attribute__((noinline)) static void nest(int depth) {
    if (depth <= 1) loop();
    else nest(depth - 1);
    __asm__ volatile("" ::: "memory"); /* not a tail call */
}

static void *pairs(void *arg) {
    if (turns && arg) my_turn = (long)arg - 1;
    const char *f = getenv("BENCH_FRAMES");
    nest(f ? atoi(f) : 32);
    return NULL;
}

/* A worker made of short-lived threads: N pairs in all, K per thread, one thread after another. */
static long total_n, per_thread;
static void *chain(void *arg) {
    for (long done = 0; done < total_n; done += per_thread) {
        pthread_t t;
        pthread_create(&t, NULL, pairs, arg);
        pthread_join(t, NULL);
    }
    return NULL;
}

/* A second callsite for the same loop: walked 32 frames deep, it differs from `nest(32)`'s only
 * in its outermost frame, so the work per call is the same. */
__attribute__((noinline)) static void outer_alt(void) {
    nest(31);
    __asm__ volatile("" ::: "memory"); /* not a tail call */
}

/* BENCH_SITES=2 for `pairs` (cuda): the pairs alternate between two callsites (their innermost
 * frames differ), one thread's pattern of two callsites. */
static int pair_sites;
__attribute__((noinline)) static void pin_at_a(void) {
    void *p;
    cudaHostAlloc(&p, 4096, 0);
    cudaFreeHost(p);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) static void pin_at_b(void) {
    void *p;
    cudaHostAlloc(&p, 4096, 0);
    cudaFreeHost(p);
    __asm__ volatile("" ::: "memory");
}

static void loop(void) {
    char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    page[0] = 1;
    if (pair_sites) {
        for (long i = 0; i < n; i++) {
            if (i & 1) pin_at_b();
            else pin_at_a();
        }
        return;
    }
    for (long i = 0; i < n; i++) {
        if (my_turn >= 0) take_turn();
        if (untracked) {
            void *p;
            real_alloc(&p, 4096, 0);
            real_free(p);
        } else if (use_malloc) {
            void *volatile p = malloc(4096);
            free(p);
        } else if (kind[0] == 'c') {
            void *p;
            cudaHostAlloc(&p, 4096, 0);
            cudaFreeHost(p);
        } else if (kind[1] == 'l') {
            mlock(page, 4096);
            munlock(page, 4096);
        } else {
            void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            munmap(p, 4096);
        }
        if (my_turn >= 0) pass_turn();
    }
}

/* Two threads on one callsite, as a DataLoader's pin thread and the main thread: the main thread
 * runs N pairs alone, then the main thread and a worker run N pairs each at once, ROUNDS times.
 * Each round's two phases are a few milliseconds apart, so the machine's slow spells (seconds
 * long) hit both alike; the median of the rounds' ratios is the scaling. BENCH_WORKERS=1: the
 * main thread pins once and then only starts the phases; worker 0 pins alone, then with the
 * others (pin-memory threads after the main thread pinned), each phase timed from its first
 * pinning thread's start to its last one's end. */
static pthread_barrier_t go, done, solo_go, solo_done;
static int rounds, frames = 32, nthreads = 2, workers;
static double started[16], ended[16];
/* A phase of a thread other than the first (BENCH_SITES: its callsite). */
static void pin_phase(int r) {
    const char *sites = getenv("BENCH_SITES");
    int mode = sites ? atoi(sites) : 1;
    if (mode == 2 || (mode == 3 && r % 2)) outer_alt();
    else nest(frames);
}
static void *scale_worker(void *arg) {
    long id = (long)arg;
    for (int r = 0; r < rounds; r++) {
        if (workers && id == 0) {
            pthread_barrier_wait(&solo_go);
            started[0] = now();
            nest(frames);
            ended[0] = now();
            pthread_barrier_wait(&solo_done);
        }
        pthread_barrier_wait(&go);
        started[id] = now();
        if (workers && id == 0) nest(frames);
        else pin_phase(r);
        ended[id] = now();
        pthread_barrier_wait(&done);
    }
    return NULL;
}
/* Every phase of the main thread pins from here, so that its stack is the same in each (a
 * walk reads the return address one frame past the depth it keeps). */
__attribute__((noinline)) static void phase(void) {
    nest(frames);
    __asm__ volatile("" ::: "memory"); /* not a tail call */
}

/* The workers' phase: from the first one's start to the last one's end. */
static double span(int k) {
    double a = started[0], b = ended[0];
    for (int i = 1; i < k; i++) {
        if (started[i] < a) a = started[i];
        if (ended[i] > b) b = ended[i];
    }
    return b - a;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static void scale(void) {
    double ratio[256];
    pthread_t w[16];
    const char *th = getenv("BENCH_THREADS");
    if (th) nthreads = atoi(th);
    if (nthreads < 2 || nthreads > 16) exit(2);
    workers = getenv("BENCH_WORKERS") != NULL;
    /* With workers, every pinning thread is one: the main thread only starts the phases. */
    int made = workers ? nthreads : nthreads - 1;
    pthread_barrier_init(&go, NULL, made + 1);
    pthread_barrier_init(&done, NULL, made + 1);
    pthread_barrier_init(&solo_go, NULL, 2);
    pthread_barrier_init(&solo_done, NULL, 2);
    const char *f = getenv("BENCH_FRAMES");
    if (f) frames = atoi(f);
    int alternate = getenv("BENCH_ALTERNATE") != NULL;
    if (alternate) {
        void *rt = dlopen("libcudart.so", RTLD_LAZY | RTLD_NOLOAD);
        real_alloc = rt ? (int (*)(void **, size_t, unsigned))dlsym(rt, "cudaHostAlloc") : NULL;
        real_free = rt ? (int (*)(void *))dlsym(rt, "cudaFreeHost") : NULL;
        if (!real_alloc || !real_free) exit(3);
    }
    phase(); /* first walks and look-ups: not the steady cost */
    for (long i = 0; i < made; i++) pthread_create(&w[i], NULL, scale_worker, (void *)(workers ? i : i + 1));
    for (int r = 0; r < rounds; r++) {
        untracked = alternate && r % 2;
        double one, two, t0;
        if (workers) {
            pthread_barrier_wait(&solo_go);
            pthread_barrier_wait(&solo_done);
            one = span(1);
            pthread_barrier_wait(&go);
            pthread_barrier_wait(&done);
            two = span(nthreads);
        } else {
            t0 = now();
            phase();
            one = now() - t0;
            pthread_barrier_wait(&go);
            t0 = now();
            phase();
            pthread_barrier_wait(&done);
            two = now() - t0;
        }
        ratio[r] = nthreads * one / two;
        if (getenv("BENCH_TRACE")) fprintf(stderr, "round %d one %.3f ms two %.3f ms ratio %.3f\n", r, one * 1e3, two * 1e3, ratio[r]);
    }
    for (int i = 0; i < made; i++) pthread_join(w[i], NULL);
    if (alternate) { /* even rounds tracked, odd ones not */
        double t[128], u[128], k[128];
        int m = 0;
        for (int r = 0; r + 1 < rounds && m < 128; r += 2, m++) {
            t[m] = ratio[r];
            u[m] = ratio[r + 1];
            k[m] = ratio[r] / ratio[r + 1];
        }
        qsort(t, m, sizeof *t, cmp);
        qsort(u, m, sizeof *u, cmp);
        qsort(k, m, sizeof *k, cmp);
        printf("%.3f %.3f %.3f\n", t[m / 2], u[m / 2], k[m / 2]);
        return;
    }
    const char *sites = getenv("BENCH_SITES");
    if (sites && atoi(sites) == 3) {
        /* The worker pins from the main thread's callsite in even rounds and from its own in
         * odd ones: the same work either way, so what the shared callsite costs the pair of
         * threads is the ratio of neighbouring rounds. */
        double r2[128];
        int m = 0;
        for (int r = 0; r + 1 < rounds && m < 128; r += 2) r2[m++] = ratio[r] / ratio[r + 1];
        qsort(r2, m, sizeof *r2, cmp);
        printf("%.3f\n", r2[m / 2]);
        return;
    }
    qsort(ratio, rounds, sizeof *ratio, cmp);
    printf("%.3f\n", ratio[rounds / 2]);
}

/* 100 distinct call sites times 100 recursion depths: 10,000 distinct stacks. */
#define SITE(k) case k: return cudaHostAlloc(p, 64, 0);
__attribute__((noinline)) static int leaf(int site, void **p) {
    switch (site) {
#define TEN(a) SITE(a##0) SITE(a##1) SITE(a##2) SITE(a##3) SITE(a##4) SITE(a##5) SITE(a##6) SITE(a##7) SITE(a##8) SITE(a##9)
        SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7) SITE(8) SITE(9)
        TEN(1) TEN(2) TEN(3) TEN(4) TEN(5) TEN(6) TEN(7) TEN(8) TEN(9)
    }
    return -1;
}
__attribute__((noinline)) static int descend(int depth, int site, void **p) {
    if (depth == 0) return leaf(site, p);
    int r = descend(depth - 1, site, p);
    __asm__ volatile("" ::: "memory"); /* not a tail call: each level is a frame */
    return r;
}

/* A failing mlock, as an opportunistic locker (a secure heap, a database) meets it under
 * Docker's RLIMIT_MEMLOCK: refused up front, nothing locked. */
static int mlockfail(long maps, long calls) {
    struct { unsigned version; int pid; } h = {0x20080522, 0};
    struct { unsigned effective, permitted, inheritable; } d[2];
    if (!syscall(SYS_capget, &h, d)) { /* CAP_IPC_LOCK lifts the limit: dropped */
        d[0].effective &= ~(1u << 14);
        d[0].permitted &= ~(1u << 14);
        syscall(SYS_capset, &h, d);
    }
    struct rlimit r = {64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &r)) return 1;
    for (long i = 0; i < maps; i++) /* neighbours of different protections never merge */
        if (mmap(NULL, 4096, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) return 1;
    size_t len = 1 << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mlock(p, len) == 0) return 1; /* the call must fail */
    double t0 = now();
    for (long i = 0; i < calls; i++) mlock(p, len);
    printf("%.1f\n", (now() - t0) * 1e9 / calls);
    return 0;
}

/* An mlock over a hole, as a program that locks a range it partly unmapped meets it: the kernel
 * locks the pages up to the hole and fails with ENOMEM, every time. */
static int mlockhole(long maps, long calls) {
    for (long i = 0; i < maps; i++) /* neighbours of different protections never merge */
        if (mmap(NULL, 4096, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) return 1;
    size_t page = 4096, len = 16 * page;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || munmap(p + 8 * page, page)) return 1;
    if (mlock(p, len) == 0) return 1; /* the first: the pages before the hole, then ENOMEM */
    double t0 = now();
    for (long i = 0; i < calls; i++) mlock(p, len);
    printf("%.1f\n", (now() - t0) * 1e9 / calls);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    if (!strcmp(argv[1], "mlockhole")) return argc < 4 ? 2 : mlockhole(atol(argv[2]), atol(argv[3]));
    if (!strcmp(argv[1], "mlockfail")) return argc < 4 ? 2 : mlockfail(atol(argv[2]), atol(argv[3]));
    if (!strcmp(argv[1], "pairs")) {
        kind = argv[2];
        int threads = atoi(argv[3]);
        n = atol(argv[4]);
        if (threads < 1 || threads > 16) return 2;
        use_malloc = getenv("BENCH_MALLOC") != NULL;
        pair_sites = kind[0] == 'c' && getenv("BENCH_SITES") && atoi(getenv("BENCH_SITES")) == 2;
        pthread_t t[16];
        void *(*worker)(void *) = pairs;
        if (getenv("BENCH_MAIN_FIRST")) { /* one pair from the main thread, same callsite */
            long keep = n;
            n = 1;
            pairs(NULL);
            n = keep;
        }
        if (getenv("BENCH_SHORT")) {
            per_thread = atol(getenv("BENCH_SHORT"));
            if (per_thread < 1 || per_thread > n) return 2;
            total_n = n;
            n = per_thread;
            worker = chain;
        }
        double t0 = now();
        if (getenv("BENCH_TURNS")) {
            if (getenv("BENCH_SHORT")) return 2;
            turns = threads;
        }
        for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
        for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
        double el = now() - t0;
        if (worker == chain) n = total_n;
        /* ns per pair per thread, and pairs per second in all */
        printf("%.1f %.0f\n", el * 1e9 / n, threads * n / el);
        if (getenv("BENCH_MAPS")) { /* where things are, for tracing tools */
            FILE *m = fopen("/proc/self/maps", "r");
            char line[512];
            while (m && fgets(line, sizeof line, m)) fputs(line, stderr);
            if (m) fclose(m);
        }
        return 0;
    }
    if (!strcmp(argv[1], "scale")) {
        if (argc < 5) return 2;
        kind = argv[2];
        n = atol(argv[3]);
        rounds = atoi(argv[4]);
        if (rounds < 1 || rounds > 256) return 2;
        scale();
        return 0;
    }
    n = atol(argv[2]);
    void **keep = malloc(n * sizeof *keep);
    if (!strcmp(argv[1], "live")) {
        long before = rss_kb();
        for (long i = 0; i < n; i++) cudaHostAlloc(&keep[i], 64, 0);
        long after = rss_kb();
        printf("%.1f\n", (after - before) * 1024.0 / n);
        return 0;
    }
    if (!strcmp(argv[1], "report")) {
        int sites = argc > 3 ? atoi(argv[3]) : 10000;
        for (long i = 0; i < n; i++) descend((int)(i % sites) / 100, (int)(i % sites) % 100, &keep[i]);
        int (*write)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "pinguard_write_report");
        if (!write) { printf("0 0\n"); return 0; }
        long before = rss_kb();
        double t0 = now();
        write(getenv("BENCH_REPORT"));
        double el = now() - t0;
        /* VmHWM would include the allocations; the growth during the write is what it costs */
        printf("%.3f %ld\n", el, (rss_kb() - before) / 1024);
        return 0;
    }
    return 2;
}
