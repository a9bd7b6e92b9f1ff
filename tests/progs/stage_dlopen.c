/* Opens the first stage given as argv[1] with dlopen (not preloaded) and locks 64 KiB through
 * its mlock: the stage finds dlopen in the program's scope and loads the library from its own
 * folder. Prints the call's result and whether the library is mapped. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "library_mapped.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return 3;
    }
    int (*lock)(const void *, size_t) = (int (*)(const void *, size_t))dlsym(h, "mlock");
    int (*unlock)(const void *, size_t) = (int (*)(const void *, size_t))dlsym(h, "munlock");
    char *buf = aligned_alloc(4096, 65536);
    memset(buf, 1, 65536);
    int rc = lock(buf, 65536);
    int urc = unlock(buf, 65536);
    printf("mlock %d munlock %d library %d\n", rc, urc, library_mapped());
    return 0;
}
