/* Runs device-memory and I/O-memory operations given as arguments through one runtime API and
 * prints what each returned, then that emulated runtime's own counters and pinguard's live bytes.
 *
 *   DM_API=cuda (default: libcudart), driver (libcuda.so.1), hip (libamdhip64.so.5)
 *   DM_ROUTE=export (default: the exports, linked by name), proc (cuGetProcAddress at 12000,
 *            hipGetProcAddress; the runtime API has none and takes its exports)
 *
 *   malloc:SIZE (cudaMalloc, cuMemAlloc_v2, hipMalloc)  managed:SIZE:FLAGS (cudaMallocManaged, ...)
 *   free:SLOT (cudaFree, cuMemFree_v2, hipFree)  free_null:0
 *   register:SIZE:FLAGS (fresh pages: cudaHostRegister, cuMemHostRegister_v2, hipHostRegister)
 *   unregister:SLOT  set_device:N (cudaSetDevice, hipSetDevice)
 *   unload:0 (dlopen and dlclose the library DM_PLUGIN names: an object unloaded)
 *   fork:0 (a child runs the operations after this one, prints its own STATS, and exits; the
 *          parent waits for it and goes on with none of them)
 */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int cudaMalloc(void **, size_t);
int cudaMallocManaged(void **, size_t, unsigned);
int cudaFree(void *);
int cudaHostRegister(void *, size_t, unsigned);
int cudaHostUnregister(void *);
int cudaSetDevice(int);
int cuMemAlloc_v2(unsigned long long *, size_t);
int cuMemAllocManaged(unsigned long long *, size_t, unsigned);
int cuMemFree_v2(unsigned long long);
int cuMemHostRegister_v2(void *, size_t, unsigned);
int cuMemHostUnregister(void *);
int cuGetProcAddress(const char *, void **, int, unsigned long long);
int hipMalloc(void **, size_t);
int hipMallocManaged(void **, size_t, unsigned);
int hipFree(void *);
int hipHostRegister(void *, size_t, unsigned);
int hipHostUnregister(void *);
int hipSetDevice(int);
int hipGetProcAddress(const char *, void **, int, uint64_t, int *);
void emu_cuda_stats(struct emu_stats *);
void emu_driver_stats(struct emu_stats *);
void emu_hip_stats(struct emu_stats *);
void emu_cuda_device_stats(struct emu_device_stats *);
void emu_driver_device_stats(struct emu_device_stats *);
void emu_hip_device_stats(struct emu_device_stats *);

typedef int (*alloc_fn)(void **, size_t);
typedef int (*managed_fn)(void **, size_t, unsigned);
typedef int (*free_fn)(void *);
typedef int (*register_fn)(void *, size_t, unsigned);
typedef int (*dalloc_fn)(unsigned long long *, size_t);
typedef int (*dmanaged_fn)(unsigned long long *, size_t, unsigned);
typedef int (*dfree_fn)(unsigned long long);

static const char *api = "cuda";
static int proc;
static void *slots[256];
static size_t slot_size[256];
static int nslots;

/* The function `name` through the route asked for, else `export`. */
static void *fn(const char *name, void *export) {
    void *p = NULL;
    if (!proc) return export;
    if (!strcmp(api, "driver") && cuGetProcAddress(name, &p, 12000, 0) == 0 && p) return p;
    if (!strcmp(api, "hip") && hipGetProcAddress(name, &p, 60100000, 0, NULL) == 0 && p) return p;
    return export;
}

static int dev_alloc(void **out, size_t size) {
    if (!strcmp(api, "driver")) {
        unsigned long long d = 0;
        int rc = ((dalloc_fn)fn("cuMemAlloc", (void *)cuMemAlloc_v2))(&d, size);
        *out = (void *)(uintptr_t)d;
        return rc;
    }
    if (!strcmp(api, "hip")) return ((alloc_fn)fn("hipMalloc", (void *)hipMalloc))(out, size);
    return cudaMalloc(out, size);
}

static int dev_managed(void **out, size_t size, unsigned flags) {
    if (!strcmp(api, "driver")) {
        unsigned long long d = 0;
        int rc = ((dmanaged_fn)fn("cuMemAllocManaged", (void *)cuMemAllocManaged))(&d, size, flags);
        *out = (void *)(uintptr_t)d;
        return rc;
    }
    if (!strcmp(api, "hip")) return ((managed_fn)fn("hipMallocManaged", (void *)hipMallocManaged))(out, size, flags);
    return cudaMallocManaged(out, size, flags);
}

static int dev_free(void *p) {
    if (!strcmp(api, "driver")) return ((dfree_fn)fn("cuMemFree", (void *)cuMemFree_v2))((uintptr_t)p);
    if (!strcmp(api, "hip")) return ((free_fn)fn("hipFree", (void *)hipFree))(p);
    return cudaFree(p);
}

static int host_register(void *p, size_t size, unsigned flags) {
    if (!strcmp(api, "driver")) return ((register_fn)fn("cuMemHostRegister", (void *)cuMemHostRegister_v2))(p, size, flags);
    if (!strcmp(api, "hip")) return ((register_fn)fn("hipHostRegister", (void *)hipHostRegister))(p, size, flags);
    return cudaHostRegister(p, size, flags);
}

static int host_unregister(void *p) {
    if (!strcmp(api, "driver")) return ((free_fn)fn("cuMemHostUnregister", (void *)cuMemHostUnregister))(p);
    if (!strcmp(api, "hip")) return ((free_fn)fn("hipHostUnregister", (void *)hipHostUnregister))(p);
    return cudaHostUnregister(p);
}

static int run_op(const char *op, long a, long b, int *slot) {
    void *p = NULL;
    int rc;
    if (!strcmp(op, "malloc") || !strcmp(op, "managed")) {
        rc = !strcmp(op, "malloc") ? dev_alloc(&p, a) : dev_managed(&p, a, b);
    } else if (!strcmp(op, "register")) {
        p = mmap(NULL, a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return -1;
        rc = host_register(p, a, b);
    } else if (!strcmp(op, "free")) {
        return dev_free(slots[a]);
    } else if (!strcmp(op, "free_null")) {
        return dev_free(NULL);
    } else if (!strcmp(op, "unregister")) {
        return host_unregister(slots[a]);
    } else if (!strcmp(op, "unload")) {
        void *h = dlopen(getenv("DM_PLUGIN"), RTLD_NOW | RTLD_LOCAL);
        if (!h) return -1;
        return dlclose(h);
    } else if (!strcmp(op, "set_device")) {
        return !strcmp(api, "hip") ? hipSetDevice(a) : cudaSetDevice(a);
    } else {
        return -2;
    }
    if (nslots < 256) {
        slots[nslots] = p;
        slot_size[nslots] = a;
        *slot = nslots++;
    }
    return rc;
}

static void print_stats(void) {
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    struct emu_stats s = {0};
    struct emu_device_stats d = {0};
    if (!strcmp(api, "driver")) {
        emu_driver_stats(&s);
        emu_driver_device_stats(&d);
    } else if (!strcmp(api, "hip")) {
        emu_hip_stats(&s);
        emu_hip_device_stats(&d);
    } else {
        emu_cuda_stats(&s);
        emu_cuda_device_stats(&d);
    }
    printf("STATS {\"emu\":{\"outstanding_bytes\":%ld,\"alloc_calls\":%ld,\"failed_calls\":%ld},"
           "\"device\":{\"outstanding_bytes\":%ld,\"allocs\":%ld,\"frees\":%ld,\"integrated_queries\":%ld,"
           "\"io_registrations\":%ld},\"pinguard_live_bytes\":%ld}\n",
           (long)s.outstanding_bytes, (long)s.alloc_calls, (long)s.failed_calls, (long)d.outstanding_bytes,
           (long)d.allocs, (long)d.frees, (long)d.integrated_queries, (long)d.io_registrations,
           live ? (long)live() : -1L);
}

int main(int argc, char **argv) {
    if (getenv("DM_API")) api = getenv("DM_API");
    proc = getenv("DM_ROUTE") && !strcmp(getenv("DM_ROUTE"), "proc");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "fork:0")) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                printf("child\n");
                continue;
            }
            int st = 0;
            waitpid(pid, &st, 0);
            printf("fork:0 rc=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
            break;
        }
        char op[32] = {0};
        long a = 0, b = 0;
        if (sscanf(argv[i], "%31[a-z_]:%li:%li", op, &a, &b) < 1) return 2;
        int slot = -1;
        int rc = run_op(op, a, b, &slot);
        printf("%s rc=%d", argv[i], rc);
        if (slot >= 0) printf(" slot=%d", slot);
        printf("\n");
    }
    print_stats();
    fflush(stdout);
    return 0;
}
