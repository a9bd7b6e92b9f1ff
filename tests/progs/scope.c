/* Pins from distinct native callsites, for tests/scope.rs (PINGUARD_DOWNGRADE_MATCH):
 *   framework:SIZE  through libframework.so's framework_pin (another module, another symbol)
 *   direct:SIZE     cudaHostAlloc from direct_pin, in this program
 *   deep:SIZE       deep_a -> deep_b -> deep_c -> cudaHostAlloc (a match in a deep frame)
 * Prints "OP rc=N" (0 or the runtime's code; 2 when refused), then pinguard's live bytes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cudaHostAlloc(void **, size_t, unsigned);
void *framework_pin(size_t);

__attribute__((noinline)) int direct_pin(size_t size) {
    void *p = NULL;
    int rc = cudaHostAlloc(&p, size, 0);
    if (!rc) memset(p, 1, size); /* usable, pinned or not */
    return rc;
}
__attribute__((noinline)) int deep_c(size_t size) { return direct_pin(size) + 0 * (int)size; }
__attribute__((noinline)) int deep_b(size_t size) { int rc = deep_c(size); __asm__ volatile("" ::: "memory"); return rc; }
__attribute__((noinline)) int deep_a(size_t size) { int rc = deep_b(size); __asm__ volatile("" ::: "memory"); return rc; }

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char op[32] = {0};
        size_t size = 0;
        sscanf(argv[i], "%31[^:]:%zu", op, &size);
        int rc;
        if (!strcmp(op, "framework")) rc = framework_pin(size) ? 0 : 2;
        else if (!strcmp(op, "direct")) rc = direct_pin(size);
        else if (!strcmp(op, "deep")) rc = deep_a(size);
        else { fprintf(stderr, "scope: unknown op %s\n", op); return 2; }
        printf("%s rc=%d\n", argv[i], rc);
    }
    uint64_t (*live)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {\"pinguard_live_bytes\":%ld}\n", live ? (long)live() : -1L);
    return 0;
}
