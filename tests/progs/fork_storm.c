/* FORKS forks while 4 threads pin and release in a loop (runtime and mlock) and a fifth writes
 * reports through the C API. Each child checks that its ledger starts empty and that the hooks
 * work, then leaves (every tenth through exit(), which writes its report; the rest _exit()).
 * A child that does not finish in 10 s counts as hung and is killed.
 *   fork_storm FORKS REPORT_PATH */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static volatile int stop;
static long allocs[4];
static const char *report_path;
static uint64_t (*live)(void);
static int (*write_report)(const char *);

static void *pinner(void *arg) {
    long id = (long)arg;
    char *arena = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    while (!stop) {
        void *p;
        if (cudaHostAlloc(&p, 4096 * (1 + id), 0) == 0) { allocs[id]++; cudaFreeHost(p); }
        if (mlock(arena, 8192) == 0) { allocs[id]++; munlock(arena, 8192); }
    }
    return NULL;
}

static void *reporter(void *arg) {
    (void)arg;
    while (!stop) write_report(report_path);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 200;
    report_path = argc > 2 ? argv[2] : "/tmp/fork_storm.json";
    live = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    write_report = (int (*)(const char *))dlsym(RTLD_DEFAULT, "pinguard_write_report");
    if (!live || !write_report) { fprintf(stderr, "run me under pinguard\n"); return 2; }
    void *keep;
    cudaHostAlloc(&keep, 65536, 0); /* the parent's own: must not show in any child */
    pthread_t th[5];
    for (long i = 0; i < 4; i++) pthread_create(&th[i], NULL, pinner, (void *)i);
    pthread_create(&th[4], NULL, reporter, NULL);
    int hung = 0, bad = 0;
    double slowest = 0;
    for (int i = 0; i < forks; i++) {
        double t0 = now();
        pid_t c = fork();
        if (c == 0) {
            if (live() != 0) _exit(11);
            void *p;
            if (cudaHostAlloc(&p, 4096, 0) != 0 || live() != 4096) _exit(12);
            if (cudaFreeHost(p) != 0 || live() != 0) _exit(13);
            if (i % 10 == 0) {
                cudaHostAlloc(&p, 8192, 0); /* left live: the child's exit report shows it */
                exit(0);
            }
            _exit(0);
        }
        int st = 0;
        pid_t w = 0;
        while ((w = waitpid(c, &st, WNOHANG)) == 0 && now() - t0 < 10) usleep(500);
        if (w == 0) {
            hung++;
            fprintf(stderr, "child %d (pid %d) hung\n", i, (int)c);
            if (getenv("FORK_STORM_KEEP_HUNG")) sleep(600); /* time to attach a debugger */
            kill(c, SIGKILL);
            waitpid(c, &st, 0);
            continue;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { bad++; fprintf(stderr, "child %d: status %x\n", i, st); }
        if (now() - t0 > slowest) slowest = now() - t0;
    }
    stop = 1;
    for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
    long total = 1;
    for (int i = 0; i < 4; i++) total += allocs[i];
    printf("STATS {\"forks\":%d,\"hung\":%d,\"bad\":%d,\"slowest_ms\":%.1f,\"parent_allocs\":%ld,\"parent_live\":%ld}\n",
           forks, hung, bad, slowest * 1000, total, (long)live());
    return 0;
}
