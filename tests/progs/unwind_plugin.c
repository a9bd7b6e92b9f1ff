/* A plugin opened after start-up by tests/progs/unwind.c, built twice (-DPLUG=a, -DPLUG=b) without
 * frame pointers, so the two copies have different names at (likely) the same address. */
#include <stddef.h>

extern int cudaHostAlloc(void **p, size_t n, unsigned int flags);
static volatile int sink;

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define INNER CAT(CAT(plug_, PLUG), _inner)
#define MIDDLE CAT(CAT(plug_, PLUG), _middle)

__attribute__((noinline)) int INNER(size_t n) {
    void *p = 0;
    int rc = cudaHostAlloc(&p, n, 0);
    sink++;
    return rc;
}
__attribute__((noinline)) int MIDDLE(size_t n) { int rc = INNER(n); sink++; return rc; }
int plug_entry(size_t n) { int rc = MIDDLE(n); sink++; return rc; }
