/* Checks that dlsym/dlvsym answer as glibc does with pinguard (and another interposer) preloaded:
 * RTLD_NEXT chains, RTLD_DEFAULT from a library loaded RTLD_LOCAL, dlerror texts. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "glibc_base.h"
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int bad;
static void check(const char *what, int ok) {
    printf("%s %s\n", what, ok ? "ok" : "BAD");
    bad |= !ok;
}

static int in_libc(void *p) {
    Dl_info i;
    return p && dladdr(p, &i) && strstr(i.dli_fname, "libc.so.6");
}

int main(void) {
    check("getpid.value", getpid() == (pid_t)syscall(SYS_getpid));
    check("getppid.value", getppid() == (pid_t)syscall(SYS_getppid));
    void *(*next_pid)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "wrap_next_getpid");
    void *(*next_ppid)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "wrap_next_getppid");
    int (*calls)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "wrap_calls");
    if (next_pid) {
        check("wrapper.rtld_next.is.libc", in_libc(next_pid()));
        check("wrapper.dlvsym.rtld_next.is.libc", in_libc(next_ppid()));
        check("wrapper.calls", calls() == 2);
    }
    check("rtld_default.getpid", dlsym(RTLD_DEFAULT, "getpid") != NULL);
    dlerror();
    check("missing.is.null", dlsym(RTLD_DEFAULT, "no_such_symbol_xyz") == NULL);
    const char *e = dlerror();
    check("missing.dlerror", e && strstr(e, "no_such_symbol_xyz"));
    check("dlerror.cleared", dlerror() == NULL);
    check("dlvsym.versioned", in_libc(dlvsym(RTLD_DEFAULT, "getppid", BASE_VERSION)));
    check("dlvsym.bad.version", dlvsym(RTLD_DEFAULT, "getppid", "GLIBC_9.9") == NULL && dlerror() != NULL);
    /* A library opened RTLD_LOCAL finds its own dependencies' symbols through RTLD_DEFAULT and
     * RTLD_NEXT: glibc searches the caller's scope. */
    void *fw = dlopen("libframework.so", RTLD_NOW | RTLD_LOCAL);
    void *(*lookup)(const char *, int) = (void *(*)(const char *, int))dlsym(fw, "framework_lookup");
    check("local.rtld_default.dependency", lookup("emu_cuda_stats", 0) != NULL);
    check("local.rtld_next.dependency", lookup("emu_cuda_stats", 1) != NULL);
    check("main.cannot.see.local", dlsym(RTLD_DEFAULT, "emu_cuda_stats") == NULL);
    return bad;
}
