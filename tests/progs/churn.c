/* Keeps 64 KiB pinned and churns 4 KiB allocations until SIGTERM, with its own SIGUSR2 handler
 * (installed in main, after pinguard's start-up, as applications do). Prints "ready" once running
 * and, at the end, how many SIGUSR2 its handler saw. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static volatile sig_atomic_t stop, usr2;
static void on_usr2(int s) { (void)s; usr2++; }
static void on_term(int s) { (void)s; stop = 1; }

int main(void) {
    signal(SIGUSR2, on_usr2);
    signal(SIGTERM, on_term);
    void *keep;
    cudaHostAlloc(&keep, 65536, 0);
    printf("ready\n");
    fflush(stdout);
    while (!stop) {
        void *p;
        if (cudaHostAlloc(&p, 4096, 0) == 0) cudaFreeHost(p);
        usleep(1000);
    }
    printf("usr2=%d\n", (int)usr2);
    return 0;
}
