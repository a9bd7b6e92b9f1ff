/* Many live allocations, so that each report takes a while to write (PINGUARD_INTERVAL keeps
 * the report thread writing): the test kills the process while a report is being written.
 *   end_midwrite N   pins N allocations of 64 bytes (N*64 bytes live), prints "ready", waits
 * Meant for EMU_NO_PIN=1: the runtime mallocs instead of locking pages, pinguard tracks the calls
 * just the same. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 0;
    for (long i = 0; i < n; i++) {
        void *p;
        if (cudaHostAlloc(&p, 64, 0) != 0) return 3;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
