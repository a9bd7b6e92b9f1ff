/* A plugin host that reloads its backend (issue 44 item 2): each round loads a plugin linked
 * against the CUDA runtime, pins through it (the plugin's own call, and the runtime's functions
 * found with dlsym), unloads it (the runtime goes with it), and maps PROT_NONE over the range the
 * runtime had, so that the next round finds it at another address. A call through an address of
 * the unloaded runtime faults. argv[1]: the plugin's path; argv[2]: rounds. Prints one line per
 * round and "done". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int (*alloc_fn)(void **, unsigned long, unsigned);
typedef int (*free_fn)(void *);

static unsigned long lo, hi;

static int extent(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    (void)arg;
    if (!strstr(info->dlpi_name, "libcudart.so")) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        unsigned long a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        if (!lo || a < lo) lo = a;
        if (b > hi) hi = b;
    }
    return 1;
}

int main(int argc, char **argv) {
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    for (int r = 0; r < rounds; r++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) { printf("dlopen: %s\n", dlerror()); return 3; }
        int (*pin)(void) = (int (*)(void))dlsym(h, "plugin_pin");
        void *rt = dlopen("libcudart.so", RTLD_NOW | RTLD_NOLOAD);
        alloc_fn a = rt ? (alloc_fn)dlsym(rt, "cudaHostAlloc") : NULL;
        free_fn f = rt ? (free_fn)dlsym(rt, "cudaFreeHost") : NULL;
        if (!pin || !a || !f) { printf("symbols missing\n"); return 4; }
        int rc = pin();
        void *p = NULL;
        int rc2 = a(&p, 8192, 0);
        int rc3 = rc2 == 0 ? f(p) : -1;
        printf("round %d: plugin %d, dlsym alloc %d free %d\n", r, rc, rc2, rc3);
        lo = hi = 0;
        dl_iterate_phdr(extent, NULL);
        dlclose(rt);
        dlclose(h);
        if (dlopen("libcudart.so", RTLD_NOW | RTLD_NOLOAD)) { printf("runtime still loaded\n"); return 5; }
        /* Something else takes the range the runtime had: the next load goes elsewhere. */
        lo &= ~4095UL;
        hi = (hi + 4095) & ~4095UL;
        if (mmap((void *)lo, hi - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != (void *)lo) {
            printf("range taken\n");
            return 6;
        }
    }
    printf("done\n");
    return 0;
}
