/* Preloaded after pinguard: pinguard's real mlock is this one, which raises SIGUSR1 (once per
 * call, not from inside its own handler) before calling libc's, so the application's handler runs
 * while the thread is inside pinguard's hook. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stddef.h>

static __thread volatile int raising;

int mlock(const void *addr, size_t len) {
    static int (*next)(const void *, size_t);
    if (!next) next = (int (*)(const void *, size_t))dlsym(RTLD_NEXT, "mlock");
    if (!raising) {
        raising = 1;
        raise(SIGUSR1);
        raising = 0;
    }
    return next(addr, len);
}
