/* An emulated libcudart that reaches the driver the way NVIDIA's does: dlopen("libcuda.so.1"),
 * dlsym(handle, "cuGetProcAddress_v2"), then cuGetProcAddress_v2 for every driver function, and
 * implements the host-memory calls on the driver's. It pins nothing itself. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*gpa_t)(const char *, void **, int, unsigned long long, int *);
static int (*drv_host_alloc)(void **, size_t, unsigned);
static int (*drv_free_host)(void *);
static int (*drv_register)(void *, size_t, unsigned);
static int (*drv_unregister)(void *);
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int init_error;

static void load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { init_error = 35; return; } /* cudaErrorInsufficientDriver */
    gpa_t gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) { init_error = 35; return; }
    int st;
    gpa("cuMemHostAlloc", (void **)&drv_host_alloc, 12090, 0, &st);
    gpa("cuMemFreeHost", (void **)&drv_free_host, 12090, 0, &st);
    gpa("cuMemHostRegister", (void **)&drv_register, 12090, 0, &st);
    gpa("cuMemHostUnregister", (void **)&drv_unregister, 12090, 0, &st);
    if (!drv_host_alloc || !drv_free_host || !drv_register || !drv_unregister) init_error = 35;
}

/* CUresult to cudaError_t for the codes the driver emulation returns. */
static int map(int cu) {
    switch (cu) {
    case 0: return 0;
    case 1: return 1;
    case 2: return 2;
    case 712: return 712;
    case 713: return 713;
    default: return 999;
    }
}

int cudaHostAlloc(void **ptr, size_t size, unsigned flags) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    if (!ptr) return 1;
    if (size == 0) { *ptr = NULL; return 0; }
    return map(drv_host_alloc(ptr, size, flags));
}
int cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }
int cudaFreeHost(void *p) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    if (!p) return 0;
    return map(drv_free_host(p));
}
int cudaHostRegister(void *p, size_t size, unsigned flags) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    return map(drv_register(p, size, flags));
}
int cudaHostUnregister(void *p) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    return map(drv_unregister(p));
}
