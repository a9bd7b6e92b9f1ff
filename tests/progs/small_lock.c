/* Locks N bytes (argv[1]) of its own memory, as gpg locks its secure memory, and exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 32768;
    char *p = aligned_alloc(4096, n);
    memset(p, 1, n);
    if (mlock(p, n) != 0) { perror("mlock"); return 1; }
    printf("locked %zu\n", n);
    return 0;
}
