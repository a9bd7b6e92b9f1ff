/* Refused calls by the thousand, for the per-callsite refused bytes.
 *   refusals N [hold] : pins 4 KiB, then asks N times for 8 KiB (under a budget of 4 KiB each is
 *                       refused), prints "refused=K" (the calls the runtime's answer refused),
 *                       and with "hold" says "ready" and runs until its stdin closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cudaHostAlloc(void **p, size_t size, unsigned int flags);

static long ask(long n) {
    long refused = 0;
    for (long i = 0; i < n; i++) {
        void *p = 0;
        if (cudaHostAlloc(&p, 8192, 0) != 0) refused++;
    }
    return refused;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *keep = 0;
    if (cudaHostAlloc(&keep, 4096, 0) != 0) return 3;
    printf("refused=%ld\n", ask(atol(argv[1])));
    fflush(stdout);
    if (argc > 2 && !strcmp(argv[2], "hold")) {
        printf("ready\n");
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof buf) > 0) {
        }
    }
    return 0;
}
