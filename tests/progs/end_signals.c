/* Pins known amounts through the emulated CUDA runtime (86016 bytes in 3 allocations left
 * pinned, one more pinned and freed), then ends by a signal whose default action ends it:
 *   end_signals SIG wait    prints "ready" and waits to be sent SIG from outside
 *   end_signals SIG raise   raise(SIG)
 *   end_signals SIG fault   the real thing: SEGV (null store), BUS (a mapping past the end of its
 *                           file), FPE (integer division by zero, x86 only), ILL (an undefined
 *                           instruction), PIPE (a write to a pipe nobody reads), ABRT (abort())
 * Exit 3 if it survives, 4 if it knows no fault for SIG here. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

__attribute__((noinline)) static void pin_known(void) {
    static const size_t kept[] = {8192, 65536, 12288};
    for (int i = 0; i < 3; i++) {
        void *p;
        if (cudaHostAlloc(&p, kept[i], 0) != 0) exit(3);
    }
    void *q;
    if (cudaHostAlloc(&q, 4096, 0) != 0 || cudaFreeHost(q) != 0) exit(3);
}

static int fault(int sig) {
    switch (sig) {
    case SIGSEGV:
        *(volatile int *)(uintptr_t)0 = 1;
        break;
    case SIGBUS: {
        FILE *f = tmpfile();
        if (!f) return 3;
        volatile char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
        if (p == MAP_FAILED) return 3;
        p[0] = 1; /* the file is empty: no page backs this */
        break;
    }
    case SIGFPE: {
#if defined(__x86_64__) || defined(__i386__)
        volatile int zero = 0, one = 1;
        volatile int q = one / zero;
        (void)q;
        break;
#else
        return 4; /* aarch64 divides by zero without a trap */
#endif
    }
    case SIGILL:
#if defined(__x86_64__) || defined(__i386__)
        __asm__ volatile("ud2");
#elif defined(__aarch64__)
        __asm__ volatile(".inst 0x00000000"); /* udf #0 */
#else
        return 4;
#endif
        break;
    case SIGPIPE: {
        int fds[2];
        if (pipe(fds) != 0) return 3;
        close(fds[0]);
        if (write(fds[1], "x", 1) < 0) return 3;
        break;
    }
    case SIGABRT:
        abort();
    default:
        return 4;
    }
    return 3;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int sig = atoi(argv[1]);
    pin_known();
    if (!strcmp(argv[2], "wait")) {
        printf("ready\n");
        fflush(stdout);
        for (;;) pause();
    }
    if (!strcmp(argv[2], "raise")) {
        raise(sig);
        return 3;
    }
    if (!strcmp(argv[2], "fault")) return fault(sig);
    return 2;
}
