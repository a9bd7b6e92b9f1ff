/* Another interposer, as a second LD_PRELOAD library: it wraps getpid and getppid through
 * dlsym(RTLD_NEXT) and dlvsym(RTLD_NEXT), which glibc answers by the caller's address. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "glibc_base.h"
#include <sys/types.h>

static pid_t (*next_getpid)(void);
static pid_t (*next_getppid)(void);
static int calls;

pid_t getpid(void) {
    if (!next_getpid) next_getpid = (pid_t(*)(void))dlsym(RTLD_NEXT, "getpid");
    calls++;
    return next_getpid();
}

pid_t getppid(void) {
    if (!next_getppid) next_getppid = (pid_t(*)(void))dlvsym(RTLD_NEXT, "getppid", BASE_VERSION);
    calls++;
    return next_getppid();
}

void *wrap_next_getpid(void) { return (void *)next_getpid; }
void *wrap_next_getppid(void) { return (void *)next_getppid; }
int wrap_calls(void) { return calls; }
