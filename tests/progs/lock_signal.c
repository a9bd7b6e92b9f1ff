/* mlock and munlock from a signal handler.
 *
 *   lock_signal heap ITERS    a 10 kHz SIGALRM (setitimer) handler locks and unlocks a static
 *                             buffer while the main thread only mallocs and frees random sizes,
 *                             ITERS times, so the handler interrupts malloc and free
 *   lock_signal nested N      the main thread locks and unlocks its own buffer N times; with
 *                             lock_shim.so preloaded after pinguard, every real mlock first
 *                             raises SIGUSR1, whose handler locks another buffer while the thread
 *                             is inside pinguard's mlock
 *
 * Prints "handled=H" (handler runs) and exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>

static char buf[16 * 4096] __attribute__((aligned(4096)));
static char main_buf[4 * 4096] __attribute__((aligned(4096)));
static volatile sig_atomic_t handled;

static void on_signal(int sig) {
    (void)sig;
    int saved = errno;
    if (handled % 2 == 0)
        mlock(buf, 4096 * (1 + handled % 16));
    else
        munlock(buf, sizeof buf);
    handled++;
    errno = saved;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long n = atol(argv[2]);
    memset(buf, 1, sizeof buf);
    memset(main_buf, 1, sizeof main_buf);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (!strcmp(argv[1], "heap")) {
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 100}, {0, 100}};
        setitimer(ITIMER_REAL, &it, NULL);
        uint64_t x = 0x9E3779B97F4A7C15ull;
        void *held[64] = {0};
        for (long i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            int k = (int)(x % 64);
            free(held[k]);
            /* Mostly small blocks, sometimes one large enough to be mmapped. */
            size_t size = (x >> 8) % 16 == 0 ? 64 * 1024 + (x >> 16) % (512 * 1024) : 1 + (x >> 16) % 4096;
            held[k] = malloc(size);
            if (held[k]) ((volatile char *)held[k])[0] = 1;
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        for (int k = 0; k < 64; k++) free(held[k]);
    } else if (!strcmp(argv[1], "nested")) {
        sigaction(SIGUSR1, &sa, NULL);
        for (long i = 0; i < n; i++) {
            if (mlock(main_buf, sizeof main_buf) != 0) { perror("mlock"); return 1; }
            if (munlock(main_buf, sizeof main_buf) != 0) { perror("munlock"); return 1; }
        }
    } else {
        return 2;
    }
    munlock(buf, sizeof buf);
    printf("handled=%d\n", (int)handled);
    return 0;
}
