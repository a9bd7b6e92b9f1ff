/* Children made without the atfork handlers (issue 44 item 4): the parent locks 1 MiB (or, with
 * argv[1] "cuda", allocates 768 KiB of pinned memory), then makes a child with glibc's _Fork and
 * one with a raw clone(SIGCHLD); each child locks 128 KiB of its own (or allocates 512 KiB
 * pinned) and exits. The parent then prints each child's status and its own VmLck, and exits
 * normally with its memory still locked. With argv[1] "threads": as "cuda", but a thread locks
 * and unlocks 64 KiB in a loop (inside pinguard's hooks much of the time) while the main thread
 * makes 40 children each way; prints how many did not exit 0. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_status.h"

pid_t _Fork(void);
int cudaHostAlloc(void **, unsigned long, unsigned);

static char mine[1 << 20] __attribute__((aligned(4096)));
static char child_buf[128 << 10] __attribute__((aligned(4096)));
static int cuda;
static atomic_int stop;

static void *churn(void *arg) {
    static char buf[64 << 10] __attribute__((aligned(4096)));
    (void)arg;
    while (!atomic_load(&stop)) {
        mlock(buf, sizeof buf);
        munlock(buf, sizeof buf);
    }
    return NULL;
}

static void child(void) {
    if (cuda) {
        void *p;
        _exit(cudaHostAlloc(&p, 512 << 10, 0) == 0 ? 0 : 20);
    }
    _exit(mlock(child_buf, sizeof child_buf) == 0 ? 0 : 10);
}

static void report(const char *how, pid_t c) {
    int st = -1;
    if (c < 0) { printf("%s: no child\n", how); return; }
    waitpid(c, &st, 0);
    printf("%s child: exit %d\n", how, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

static int status_of(pid_t c) {
    int st = -1;
    if (c < 0 || waitpid(c, &st, 0) != c) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int with_threads(void) {
    void *p;
    if (cudaHostAlloc(&p, 768 << 10, 0) != 0) return 1;
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
    int bad = 0;
    for (int i = 0; i < 40; i++) {
        pid_t c = _Fork();
        if (c == 0) child();
        bad += status_of(c) != 0;
        c = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (c == 0) child();
        bad += status_of(c) != 0;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("children that failed: %d\n", bad);
    return 0;
}

int main(int argc, char **argv) {
    cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (argc > 1 && strcmp(argv[1], "threads") == 0) {
        cuda = 1;
        return with_threads();
    }
    void *p = NULL;
    if (cuda ? cudaHostAlloc(&p, 768 << 10, 0) != 0 : mlock(mine, sizeof mine) != 0) {
        printf("parent's pin failed\n");
        return 1;
    }
    fflush(stdout);
    pid_t c = _Fork();
    if (c == 0) child();
    report("_Fork", c);
    fflush(stdout);
    c = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    if (c == 0) child();
    report("clone", c);
    printf("VmLck %ld kB\n", status_kb("VmLck:"));
    return 0;
}
