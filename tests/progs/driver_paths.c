/* The ways a program reaches pinned memory without calling an exported runtime name:
 *   runtime  the layered libcudart (cudaHostAlloc on cuMemHostAlloc via cuGetProcAddress)
 *   static   the static-cudart/JAX pattern: dlopen(libcuda.so.1) + dlsym + cuGetProcAddress
 *   answers  cuGetProcAddress answers for names pinguard does not wrap, unchanged
 *   acl      torch_npu's pattern: dlopen(libascendcl, RTLD_LOCAL) + dlsym(handle, name)
 *   late     a runtime and a framework dlopen'ed RTLD_LOCAL from a second thread
 * Each prints "what rc=N" lines and a final STATS line with the driver's own counters. */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaMallocHost(void **, size_t);
int cudaFreeHost(void *);

typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa1_t)(const char *, void **, int, unsigned long long);
typedef int (*host_alloc_t)(void **, size_t, unsigned);
typedef int (*alloc_host_t)(void **, size_t);
typedef int (*alloc_host_legacy_t)(void **, unsigned);
typedef int (*free_t)(void *);
typedef int (*reg_t)(void *, size_t, unsigned);

static size_t size_arg = 8192;
static unsigned flags_arg = 0;

static void *driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); exit(3); }
    return h;
}

static void mode_runtime(void) {
    void *p, *q;
    printf("cudaHostAlloc rc=%d\n", cudaHostAlloc(&p, size_arg, flags_arg));
    printf("cudaMallocHost rc=%d\n", cudaMallocHost(&q, 4096));
    printf("cudaFreeHost rc=%d\n", cudaFreeHost(q));
}

static void mode_static(void) {
    void *h = driver();
    gpa2_t gpa = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    int st = -1;
    host_alloc_t host_alloc;
    free_t free_host;
    gpa("cuMemHostAlloc", (void **)&host_alloc, 12090, 0, &st);
    gpa("cuMemFreeHost", (void **)&free_host, 12090, 0, &st);
    void *p, *q, *r, *s;
    printf("gpa.cuMemHostAlloc rc=%d\n", host_alloc(&p, size_arg, flags_arg));
    printf("gpa.cuMemHostAlloc.free rc=%d\n", host_alloc(&q, 4096, 0));
    printf("gpa.cuMemFreeHost rc=%d\n", free_host(q));
    alloc_host_t v2 = (alloc_host_t)dlsym(h, "cuMemAllocHost_v2");
    printf("dlsym.cuMemAllocHost_v2 rc=%d\n", v2(&r, 4096));
    alloc_host_legacy_t legacy = (alloc_host_legacy_t)dlsym(h, "cuMemAllocHost");
    printf("dlsym.cuMemAllocHost rc=%d\n", legacy(&s, 4096u));
    /* cuGetProcAddress looked up through itself, then used for a registration. */
    gpa2_t gpa_again = NULL;
    gpa("cuGetProcAddress", (void **)&gpa_again, 12090, 0, &st);
    reg_t reg = NULL;
    gpa_again("cuMemHostRegister", (void **)&reg, 12090, 0, &st);
    void *buf = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("gpa.gpa.cuMemHostRegister rc=%d\n", reg(buf, 8192, 0));
    /* The v1 entry point from dlsym, for a legacy-version look-up. */
    gpa1_t gpa1 = (gpa1_t)dlsym(h, "cuGetProcAddress");
    alloc_host_legacy_t legacy2 = NULL;
    gpa1("cuMemAllocHost", (void **)&legacy2, 3010, 0);
    void *t;
    printf("gpa1.cuMemAllocHost.legacy rc=%d\n", legacy2(&t, 4096u));
}

static int check(const char *what, int ok) {
    printf("%s %s\n", what, ok ? "ok" : "BAD");
    return ok;
}

static void mode_answers(void) {
    void *h = driver();
    gpa2_t gpa = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    void *pfn = (void *)1;
    int st = -1;
    int rc = gpa("cuDriverGetVersion", &pfn, 12090, 0, &st);
    check("other.symbol", rc == 0 && st == 0 && pfn == dlsym(h, "cuDriverGetVersion"));
    pfn = (void *)1;
    rc = gpa("cuNoSuchFunction", &pfn, 12090, 0, &st);
    check("unknown.symbol", rc == 0 && st == 1 && pfn == NULL);
    pfn = (void *)1;
    rc = gpa("cuMemHostRegister", &pfn, 3000, 0, &st);
    check("version.too.low", rc == 0 && st == 2 && pfn == NULL);
    check("null.symbol", gpa(NULL, &pfn, 12090, 0, &st) == 1);
    /* A wrapped name still comes back as a function, with the driver's status. */
    pfn = NULL;
    rc = gpa("cuMemHostAlloc", &pfn, 12090, 0, NULL);
    check("wrapped.null.status", rc == 0 && pfn != NULL);
    void *real = dlsym(h, "cuDriverGetVersion");
    int (*ver)(int *) = (int (*)(int *))real;
    int v = 0;
    check("other.callable", ver(&v) == 0 && v == 12090);
    /* dlsym of a name pinguard does not wrap, through the handle: the loader's answer. */
    Dl_info info;
    check("dlsym.other", dladdr(dlsym(h, "cuCtxSynchronize"), &info) && strstr(info.dli_fname, "libcuda.so.1"));
}

static void mode_acl(void) {
    void *h = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
    int (*with_cfg)(void **, uint64_t, void *) = (int (*)(void **, uint64_t, void *))dlsym(h, "aclrtMallocHostWithCfg");
    int (*reg)(void *, uint64_t, int, void **) = (int (*)(void *, uint64_t, int, void **))dlsym(h, "aclrtHostRegister");
    void *p, *dev;
    printf("acl.aclrtMallocHostWithCfg rc=%d\n", with_cfg(&p, size_arg, NULL));
    void *buf = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("acl.aclrtHostRegister rc=%d\n", reg(buf, 8192, 0, &dev));
}

static void *late_thread(void *arg) {
    (void)arg;
    void *h = dlopen("libascendcl.so", RTLD_NOW | RTLD_LOCAL);
    int (*mh)(void **, size_t) = (int (*)(void **, size_t))dlsym(h, "aclrtMallocHost");
    void *p;
    printf("late.dlsym.aclrtMallocHost rc=%d\n", mh(&p, 4096));
    void *fw = dlopen("libframework.so", RTLD_NOW | RTLD_LOCAL);
    void *(*pin)(size_t) = (void *(*)(size_t))dlsym(fw, "framework_pin_npu");
    printf("late.framework.pin rc=%d\n", pin(8192) ? 0 : -1);
    return NULL;
}

static void mode_late(void) {
    pthread_t t;
    pthread_create(&t, NULL, late_thread, NULL);
    pthread_join(t, NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (argc > 2) size_arg = strtoul(argv[2], NULL, 0);
    if (argc > 3) flags_arg = strtoul(argv[3], NULL, 0);
    if (!strcmp(argv[1], "runtime")) mode_runtime();
    else if (!strcmp(argv[1], "static")) mode_static();
    else if (!strcmp(argv[1], "answers")) mode_answers();
    else if (!strcmp(argv[1], "acl")) mode_acl();
    else if (!strcmp(argv[1], "late")) mode_late();
    else return 2;
    struct emu_stats d = {0}, a = {0};
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h) ((void (*)(struct emu_stats *))dlsym(h, "emu_driver_stats"))(&d);
    void *ha = dlopen("libascendcl.so", RTLD_NOW | RTLD_NOLOAD);
    if (ha) ((void (*)(struct emu_stats *))dlsym(ha, "emu_acl_stats"))(&a);
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {\"driver_alloc\":%ld,\"driver_outstanding\":%ld,\"driver_max\":%ld,\"driver_failed\":%ld,"
           "\"acl_alloc\":%ld,\"acl_outstanding\":%ld,\"pinguard_live_bytes\":%ld}\n",
           (long)d.alloc_calls, (long)d.outstanding_bytes, (long)d.max_outstanding_bytes, (long)d.failed_calls,
           (long)a.alloc_calls, (long)a.outstanding_bytes, live ? (long)live() : -1L);
    return 0;
}
