/* Pins 8 KiB, then calls _exit in the way argv[1] says, with signal handlers around:
 *   blocked          SIGTERM has a handler (sigaction) and is blocked; _exit from main
 *   blocked-signal   the same with signal()
 *   in-handler       _exit from inside the SIGTERM handler
 *   longjmp          the handler siglongjmps back to main, which then calls _exit
 *   alt-in-handler   _exit from a handler running on the alternate signal stack
 *   alt-longjmp      a handler on the alternate stack siglongjmps back to main; then _exit
 *   nested           a SIGUSR1 handler raises SIGTERM, whose handler siglongjmps back into the
 *                    SIGUSR1 handler, which then calls _exit (still inside a handler)
 *   deep-after-jump  the handler siglongjmps back to main; _exit is then called from deeper in
 *                    the stack than the handler ran
 *   signal-in-handler        _exit from inside a handler set with signal()
 *   sigaction-alias-in-handler  _exit from inside a handler (SA_NODEFER) set through glibc's
 *                    exported __sigaction
 *   bsd-deep-after-jump      the handler _longjmps back to main, which unblocks SIGTERM and calls
 *                    _exit from deeper than the handler ran
 *   raw-in-handler   _exit from inside a handler (SA_NODEFER) set by the raw system call, behind
 *                    every libc setter, with libc's own signal return (as libc would set it)
 *
 * Built twice: as GNU C, and with -DSTRICT as strict ISO C with XSI, optimised and fortified,
 * where the headers turn signal() into __sysv_signal and every jump into __longjmp_chk: the
 * names real programs reach glibc by (tests/safety_signals.rs checks which each build imports). */
#ifndef STRICT
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

/* glibc exports it; no header declares it. */
extern int __sigaction(int, const struct sigaction *, struct sigaction *);

static sigjmp_buf env, inner;
static jmp_buf bsd_env;
static void jump_bsd(int s) { (void)s; _longjmp(bsd_env, 1); }
static void exit_now(int s) { (void)s; _exit(0); }
static void jump_out(int s) { (void)s; siglongjmp(env, 1); }
static void jump_inner(int s) { (void)s; siglongjmp(inner, 1); }
static void on_usr1(int s) {
    (void)s;
    if (sigsetjmp(inner, 1) == 0) raise(SIGTERM);
    _exit(0);
}

static void install(int sig, void (*h)(int), int flags) {
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = h;
    a.sa_flags = flags;
    sigaction(sig, &a, NULL);
}

static char alt[1 << 16];
static void altstack(void) {
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    sigaltstack(&ss, NULL);
}

/* Calls _exit from n frames of 4 KiB below the caller. */
__attribute__((noinline)) static int deep(int n) {
    volatile char pad[4096];
    pad[0] = (char)n;
    if (n == 0) {
        void (*volatile end)(int) = _exit; /* not known to end the process: no recursion warning */
        end(0);
        return 0;
    }
    return deep(n - 1) + pad[0];
}

#ifndef STRICT /* syscall() is a GNU extension */
/* The kernel's view of a disposition. */
struct kact {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

/* Sets `h` for `sig` by the raw system call, with the restorer (and its flag) libc gives the
 * handlers it sets, read from a disposition set through libc first. */
static void install_raw(int sig, void (*h)(int), unsigned long flags) {
    struct kact k;
    install(sig, exit_now, 0);
    if (syscall(SYS_rt_sigaction, sig, NULL, &k, 8) != 0) _exit(5);
    k.handler = (void *)h;
    k.flags = (k.flags & 0x04000000UL) | flags; /* SA_RESTORER where libc uses one */
    k.mask = 0;
    if (syscall(SYS_rt_sigaction, sig, &k, NULL, 8) != 0) _exit(5);
}
#endif

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *p;
    if (cudaHostAlloc(&p, 8192, 0) != 0) return 3;
    const char *m = argv[1];
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    if (!strcmp(m, "blocked") || !strcmp(m, "blocked-signal")) {
        if (!strcmp(m, "blocked")) install(SIGTERM, exit_now, 0);
        else signal(SIGTERM, exit_now);
        sigprocmask(SIG_BLOCK, &term, NULL);
        _exit(0);
    }
    if (!strcmp(m, "in-handler")) {
        install(SIGTERM, exit_now, 0);
        raise(SIGTERM);
        return 4;
    }
    if (!strcmp(m, "longjmp") || !strcmp(m, "deep-after-jump")) {
        install(SIGTERM, jump_out, 0);
        if (sigsetjmp(env, 1) == 0) {
            raise(SIGTERM);
            return 4;
        }
        if (!strcmp(m, "deep-after-jump")) deep(16);
        _exit(0);
    }
    if (!strcmp(m, "alt-in-handler")) {
        altstack();
        install(SIGTERM, exit_now, SA_ONSTACK);
        raise(SIGTERM);
        return 4;
    }
    if (!strcmp(m, "alt-longjmp")) {
        altstack();
        install(SIGTERM, jump_out, SA_ONSTACK);
        if (sigsetjmp(env, 1) == 0) {
            raise(SIGTERM);
            return 4;
        }
        _exit(0);
    }
    if (!strcmp(m, "signal-in-handler")) {
        signal(SIGTERM, exit_now);
        raise(SIGTERM);
        return 4;
    }
    if (!strcmp(m, "sigaction-alias-in-handler")) {
        /* SA_NODEFER: SIGTERM is not blocked in the handler, so only the hook on this name can
         * tell that a handler runs. */
        struct sigaction a;
        memset(&a, 0, sizeof a);
        a.sa_handler = exit_now;
        a.sa_flags = SA_NODEFER;
        __sigaction(SIGTERM, &a, NULL);
        raise(SIGTERM);
        return 4;
    }
    if (!strcmp(m, "bsd-deep-after-jump")) {
        install(SIGTERM, jump_bsd, 0);
        if (_setjmp(bsd_env) == 0) {
            raise(SIGTERM);
            return 4;
        }
        /* _longjmp keeps the handler's mask: SIGTERM is still blocked until unblocked here. */
        sigprocmask(SIG_UNBLOCK, &term, NULL);
        deep(16);
    }
#ifndef STRICT
    if (!strcmp(m, "raw-in-handler")) {
        /* SA_NODEFER and no mask: nothing is blocked, and no libc setter saw the handler. */
        install_raw(SIGTERM, exit_now, SA_NODEFER);
        raise(SIGTERM);
        return 4;
    }
#endif
    if (!strcmp(m, "nested")) {
        install(SIGTERM, jump_inner, 0);
        install(SIGUSR1, on_usr1, 0);
        raise(SIGUSR1);
        return 4;
    }
    return 2;
}
