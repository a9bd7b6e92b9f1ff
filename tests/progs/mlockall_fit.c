/* How much a program can lock after mlockall(MCL_CURRENT | MCL_FUTURE) under an 8 MiB
 * RLIMIT_MEMLOCK (CAP_IPC_LOCK dropped, so that the limit applies to root too): the number of
 * 256 KiB blocks it can then map, each locked by MCL_FUTURE, until the kernel refuses one.
 *   mlockall_fit THREADS    THREADS threads (64 KiB stacks) each lock and unlock a page first
 *                           (so that they have been through any hook), then wait while the main
 *                           thread calls mlockall and maps blocks; 0: a bare program that calls
 *                           only mlockall.
 *   mlockall_fit THREADS main-first   the main thread locks and unlocks the page before it
 *                           starts the threads (so that pinguard sets up on the main thread).
 * Prints "mlockall rc=R errno=E vmlck=KB" (VmLck right after mlockall), then
 * "blocks=N vmlck=KB" (VmLck once no block more fits). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "proc_status.h"

#define BLOCK (256 << 10)

static pthread_barrier_t started, done;
static char page[4096] __attribute__((aligned(4096)));

static void *worker(void *arg) {
    (void)arg;
    if (mlock(page, sizeof page) || munlock(page, sizeof page)) exit(3);
    pthread_barrier_wait(&started);
    pthread_barrier_wait(&done);
    return NULL;
}

static void drop_cap_ipc_lock(void) {
    struct { unsigned version; int pid; } h = {0x20080522, 0};
    struct { unsigned effective, permitted, inheritable; } d[2];
    if (!syscall(SYS_capget, &h, d)) {
        d[0].effective &= ~(1u << 14);
        d[0].permitted &= ~(1u << 14);
        syscall(SYS_capset, &h, d);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int threads = atoi(argv[1]);
    if (threads < 0 || threads > 256) return 2;
    drop_cap_ipc_lock();
    struct rlimit r = {8 << 20, 8 << 20};
    if (setrlimit(RLIMIT_MEMLOCK, &r)) return 1;
    if (argc > 2 && !strcmp(argv[2], "main-first") && (mlock(page, sizeof page) || munlock(page, sizeof page)))
        return 3;
    pthread_t t[256];
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 << 10);
    if (threads) {
        pthread_barrier_init(&started, NULL, threads + 1);
        pthread_barrier_init(&done, NULL, threads + 1);
        for (int i = 0; i < threads; i++)
            if (pthread_create(&t[i], &a, worker, NULL)) return 1;
        pthread_barrier_wait(&started);
    }
    int rc = mlockall(MCL_CURRENT | MCL_FUTURE);
    int e = rc ? errno : 0;
    printf("mlockall rc=%d errno=%d vmlck=%ld\n", rc, e, status_kb("VmLck:"));
    fflush(stdout);
    long n = 0;
    while (rc == 0 && n < 1000) {
        void *p = mmap(NULL, BLOCK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) break;
        n++;
    }
    printf("blocks=%ld vmlck=%ld\n", n, status_kb("VmLck:"));
    fflush(stdout);
    if (threads) {
        pthread_barrier_wait(&done);
        for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    }
    return 0;
}
