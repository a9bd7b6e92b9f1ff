/* Pins 8 KiB, then ends the way argv[1] says: return, exit-thread (exit() from another thread
 * while main is pinning), _exit, _Exit, signal-exit (_exit from a SIGTERM handler). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static void *exiter(void *arg) {
    (void)arg;
    usleep(20000);
    exit(0);
}

static void on_term(int s) {
    (void)s;
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *p;
    cudaHostAlloc(&p, 8192, 0);
    if (!strcmp(argv[1], "return")) return 0;
    if (!strcmp(argv[1], "_exit")) _exit(0);
    if (!strcmp(argv[1], "_Exit")) _Exit(0);
    if (!strcmp(argv[1], "exit-thread")) {
        pthread_t t;
        pthread_create(&t, NULL, exiter, NULL);
        for (;;) {
            void *q;
            if (cudaHostAlloc(&q, 4096, 0) == 0) cudaFreeHost(q);
        }
    }
    if (!strcmp(argv[1], "signal-exit")) {
        signal(SIGTERM, on_term);
        raise(SIGTERM);
    }
    return 3;
}
