/* Stands in for a framework library (libtorch, torch_npu) that links the runtime and pins through
 * its PLT. Python loads it with ctypes, i.e. RTLD_LOCAL, so the runtime is invisible to RTLD_NEXT. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int aclrtMallocHost(void **, size_t);
int aclrtFreeHost(void *);

void *framework_pin(size_t size) {
    void *p = NULL;
    return cudaHostAlloc(&p, size, 0) == 0 ? p : NULL;
}
int framework_unpin(void *p) { return cudaFreeHost(p); }
void *framework_pin_npu(size_t size) {
    void *p = NULL;
    return aclrtMallocHost(&p, size) == 0 ? p : NULL;
}
int framework_unpin_npu(void *p) { return aclrtFreeHost(p); }

/* dlsym from inside a library loaded RTLD_LOCAL: glibc answers by the caller's scope. */
void *framework_lookup(const char *name, int next) { return dlsym(next ? RTLD_NEXT : RTLD_DEFAULT, name); }

/* Pins from a thread of its own, which Python never sees: its callsite has no Python frames. */
#include <pthread.h>
static void *pin_thread(void *size) { return framework_pin((size_t)size); }
void *framework_pin_in_native_thread(size_t size) {
    pthread_t t;
    void *p = NULL;
    if (pthread_create(&t, NULL, pin_thread, (void *)size) != 0) return NULL;
    pthread_join(t, &p);
    return p;
}
