/* Under the first stage (libpinguard-lazy.so, tests/front.rs): registers an exit handler that
 * unlocks, then maps without MAP_LOCKED (nothing of pinguard's loads) and prints whether the
 * library is mapped; then locks argv[1] bytes (mlock, or mmap with MAP_LOCKED when argv[2] is
 * "map"), prints the call's result and whether the library is mapped now, and exits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "library_mapped.h"

static char *held;
static size_t held_len;

static void unlock_at_exit(void) {
    if (held) munlock(held, held_len);
}


int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
    int by_map = argc > 2 && !strcmp(argv[2], "map");
    atexit(unlock_at_exit);
    void *m = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(m, 1 << 20);
    printf("before: library %d\n", library_mapped());
    int rc, err = 0;
    if (by_map) {
        void *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
        rc = p == MAP_FAILED ? -1 : 0;
        err = rc ? errno : 0;
    } else {
        held = aligned_alloc(4096, n);
        memset(held, 1, n);
        held_len = n;
        rc = mlock(held, n);
        err = rc ? errno : 0;
        if (rc) held = NULL;
    }
    printf("lock: %d errno %d\n", rc, err);
    printf("after: library %d\n", library_mapped());
    return 0;
}
