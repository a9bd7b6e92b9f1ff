/* Pins SIZE bytes from pin_buffer(), says "pinned pid=PID" on stdout, then ends the way argv[2]
 * says:
 *   exit        returns 0
 *   raise:SIG   sends itself signal SIG (SIGKILL: no chance to write a report)
 *   wait        waits up to ten minutes for a signal from outside, dispositions left at default
 * For tests/run_endings.rs: how `pinguard run` tells what happened to the processes it ran. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

/* Its own function, kept out of main, so the callsite has a name the tests can look for. */
__attribute__((noinline)) static void *pin_buffer(size_t size) {
    void *p = NULL;
    if (cudaHostAlloc(&p, size, 0) != 0) return NULL;
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: run_ending SIZE exit|raise:SIG|wait\n");
        return 2;
    }
    if (!pin_buffer(strtoul(argv[1], NULL, 0))) {
        fprintf(stderr, "run_ending: cudaHostAlloc failed\n");
        return 3;
    }
    printf("pinned pid=%d\n", (int)getpid());
    fflush(stdout);
    const char *how = argv[2];
    if (!strcmp(how, "exit")) return 0;
    if (!strncmp(how, "raise:", 6)) {
        kill(getpid(), atoi(how + 6));
        pause();
    }
    if (!strcmp(how, "wait")) {
        /* Bounded: a test that fails before it signals never leaves this behind for long. */
        for (int i = 0; i < 600; i++) sleep(1);
        return 4;
    }
    fprintf(stderr, "run_ending: unknown ending %s\n", how);
    return 2;
}
