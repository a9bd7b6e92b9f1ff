/* A program built with AddressSanitizer (-fsanitize=address) that pins host memory through
 * libc's mlock and through the (emulated) CUDA runtime, for tests/asan.rs and the CLI's tests.
 *
 *   asan_pin STEP...
 *   STEP: mlock:N   mlock of N MiB of a fresh anonymous mapping; prints "mlock N MiB rc=RC"
 *         mmap_locked:N  mmap(MAP_LOCKED) of N MiB; prints "mmap_locked N MiB ok=1" (0: refused)
 *         cuda:N    cudaHostAlloc of N MiB, kept; prints "cuda N MiB rc=RC"
 *         vmlck     prints "vmlck=KB", the kernel's count of this process's locked memory
 *         uaf       reads a freed heap byte: AddressSanitizer reports it and ends the program
 * Prints "exit" last and exits 0 without freeing. Output is unbuffered: ASan ends a program with
 * _exit, which would lose a buffer. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int cudaHostAlloc(void **, size_t, unsigned);

static long vmlck_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmLck:", 6) == 0) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strncmp(s, "mlock:", 6) == 0) {
            size_t len = (size_t)atol(s + 6) << 20;
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            printf("mlock %s MiB rc=%d\n", s + 6, p == MAP_FAILED ? -2 : mlock(p, len));
        } else if (strncmp(s, "mmap_locked:", 12) == 0) {
            size_t len = (size_t)atol(s + 12) << 20;
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
            printf("mmap_locked %s MiB ok=%d\n", s + 12, p != MAP_FAILED);
        } else if (strncmp(s, "cuda:", 5) == 0) {
            void *p = NULL;
            printf("cuda %s MiB rc=%d\n", s + 5, cudaHostAlloc(&p, (size_t)atol(s + 5) << 20, 0));
        } else if (strcmp(s, "vmlck") == 0) {
            printf("vmlck=%ld\n", vmlck_kb());
        } else if (strcmp(s, "uaf") == 0) {
            /* A volatile pointer: the compiler cannot see (or warn) that it was freed. */
            char *volatile x = malloc(16);
            free(x);
            printf("read %d\n", x[3]);
        } else {
            fprintf(stderr, "asan_pin: unknown step %s\n", s);
            return 2;
        }
    }
    printf("exit\n");
    return 0;
}
