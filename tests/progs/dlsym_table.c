/* dlsym_table LIB NAME...: looks each name up through a handle of LIB (opened RTLD_LOCAL) and
 * prints "NAME FILE", FILE being the file name of the object that holds the answer ("none" when
 * there is none). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        void *p = dlsym(h, argv[i]);
        Dl_info info;
        const char *file = p && dladdr(p, &info) && info.dli_fname ? info.dli_fname : "none";
        const char *base = strrchr(file, '/');
        printf("%s %s\n", argv[i], base ? base + 1 : file);
    }
    return 0;
}
