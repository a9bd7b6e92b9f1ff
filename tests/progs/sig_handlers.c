/* The application changes its signal dispositions while pinguard's report signal (SIGUSR2) is
 * set; every answer the application gets is printed, to compare with what it gets without
 * pinguard (or, where that run would die of the signal, with what it must be).
 *
 * argv[1]: restore | chain | oneshot | raw | flags. */
#define _GNU_SOURCE
/* The old interfaces are what is tested here. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
/* glibc exports it; its header declares it only for some feature macros. */
extern __sighandler_t bsd_signal(int, __sighandler_t);

static volatile sig_atomic_t a, b, c;
static void on_a(int s) { (void)s; a++; }
static void on_b(int s) { (void)s; b++; }
static void on_c(int s, siginfo_t *i, void *ctx) { (void)i; (void)ctx; if (s == SIGUSR1) c++; }

/* The kernel's own view, bypassing libc (and pinguard's hooks). */
struct kact {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

static struct {
    int count, self_blocked, hup_blocked, on_alt, signo, code, ctx;
    unsigned long sp;
} probe;
static void on_probe(int s, siginfo_t *i, void *ctx) {
    sigset_t now;
    stack_t ss;
    volatile char here;
    sigprocmask(SIG_BLOCK, NULL, &now);
    sigaltstack(NULL, &ss);
    probe.count++;
    probe.self_blocked = sigismember(&now, s);
    probe.hup_blocked = sigismember(&now, SIGHUP);
    probe.on_alt = (ss.ss_flags & SS_ONSTACK) != 0;
    probe.signo = i->si_signo;
    probe.code = i->si_code;
    probe.ctx = ctx != NULL;
    probe.sp = (unsigned long)&here;
}

static const char *name(void (*h)(int)) {
    if (h == SIG_DFL) return "DFL";
    if (h == SIG_IGN) return "IGN";
    if (h == on_a) return "a";
    if (h == on_b) return "b";
    if ((void *)h == (void *)on_c) return "c";
    return "other";
}

static unsigned long mask_word(const sigset_t *s) {
    unsigned long m = 0;
    for (int i = 1; i <= 64 && i < (int)(8 * sizeof m); i++)
        if (sigismember(s, i) == 1) m |= 1UL << (i - 1);
    return m;
}

/* The disposition as the application sees it: handler, flags (without the restorer bit, which
 * glibc adds), mask. */
static void show(const char *tag, int sig) {
    struct sigaction q;
    sigaction(sig, NULL, &q);
    printf("%s handler=%s flags=%#x mask=%#lx\n", tag, name(q.sa_handler), (unsigned)q.sa_flags & ~0x04000000u, mask_word(&q.sa_mask));
}

/* Waits (bounded) until pinguard has written a report with reason "signal". */
static int signal_report(void) {
    const char *dir = getenv("REPORT_DIR");
    if (!dir) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/report.%d.json", dir, (int)getpid());
    for (int k = 0; k < 2000; k++) {
        FILE *f = fopen(path, "r");
        if (f) {
            static char buf[1 << 20];
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            if (strstr(buf, "\"reason\":\"signal\"")) return 1;
        }
        usleep(5000);
    }
    return 0;
}


int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *p;
    if (cudaHostAlloc(&p, 8192, 0) != 0) return 3;
    const char *m = argv[1];
    if (!strcmp(m, "restore")) {
        /* Installs its handler, later puts back what it replaced; the handler it removed must
         * never run again. */
        struct sigaction mine, old, got;
        memset(&mine, 0, sizeof mine);
        mine.sa_handler = on_a;
        sigaction(SIGUSR2, &mine, &old);
        printf("old handler=%s\n", name(old.sa_handler));
        /* Gives a periodic check by pinguard time to see the handler (bounded). */
        for (int i = 0; i < 300; i++) {
            struct kact now;
            syscall(SYS_rt_sigaction, SIGUSR2, NULL, &now, 8);
            if (now.handler != (void *)on_a) break;
            usleep(10000);
        }
        raise(SIGUSR2);
        sigaction(SIGUSR2, &old, &got);
        printf("replaced handler=%s\n", name(got.sa_handler));
        show("now", SIGUSR2);
        raise(SIGUSR2); /* without pinguard: the default action (that run is not made) */
        printf("a=%d\n", (int)a);
        printf("signal_report=%d\n", signal_report());
    } else if (!strcmp(m, "chain")) {
        printf("signal returned %s\n", name(signal(SIGUSR2, on_a)));
        show("after signal", SIGUSR2);
        struct sigaction sb, old, got;
        memset(&sb, 0, sizeof sb);
        sb.sa_handler = on_b;
        sb.sa_flags = SA_RESTART;
        sigaddset(&sb.sa_mask, SIGHUP);
        sigaction(SIGUSR2, &sb, &old);
        printf("old handler=%s flags=%#x mask=%#lx\n", name(old.sa_handler), (unsigned)old.sa_flags & ~0x04000000u, mask_word(&old.sa_mask));
        show("b installed", SIGUSR2);
        raise(SIGUSR2);
        printf("a=%d b=%d\n", (int)a, (int)b);
        sigaction(SIGUSR2, &old, &got);
        printf("replaced handler=%s\n", name(got.sa_handler));
        show("a restored", SIGUSR2);
        raise(SIGUSR2);
        printf("a=%d b=%d\n", (int)a, (int)b);
        printf("signal returned %s\n", name(signal(SIGUSR2, SIG_IGN)));
        raise(SIGUSR2);
        printf("a=%d b=%d\n", (int)a, (int)b);
        printf("sysv_signal returned %s\n", name(sysv_signal(SIGUSR2, on_b)));
        show("sysv", SIGUSR2);
        printf("bsd_signal returned %s\n", name(bsd_signal(SIGUSR2, on_a)));
        siginterrupt(SIGUSR2, 1);
        show("siginterrupt", SIGUSR2);
        printf("signal returned %s\n", name(signal(SIGUSR2, on_a)));
        show("signal after siginterrupt", SIGUSR2);
        siginterrupt(SIGUSR2, 0);
        printf("sigset returned %s\n", name(sigset(SIGUSR2, on_b)));
        show("sigset", SIGUSR2);
        sigignore(SIGUSR2);
        show("sigignore", SIGUSR2);
        /* Another signal than the report signal. */
        struct sigaction sc, o1;
        memset(&sc, 0, sizeof sc);
        sc.sa_sigaction = on_c;
        sc.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGUSR1, &sc, &o1);
        printf("usr1 old handler=%s\n", name(o1.sa_handler));
        show("usr1", SIGUSR1);
        raise(SIGUSR1);
        printf("c=%d\n", (int)c);
        printf("usr1 signal returned %s\n", name(signal(SIGUSR1, SIG_DFL)));
        show("usr1 default", SIGUSR1);
    } else if (!strcmp(m, "oneshot")) {
        /* SA_RESETHAND: the handler runs once, then the default action is back. */
        printf("sysv_signal returned %s\n", name(sysv_signal(SIGUSR2, on_a)));
        raise(SIGUSR2);
        show("after one", SIGUSR2);
        raise(SIGUSR2); /* without pinguard: the default action (that run is not made) */
        printf("a=%d\n", (int)a);
        printf("signal_report=%d\n", signal_report());
    } else if (!strcmp(m, "raw")) {
        /* A handler installed with the raw system call, behind every libc wrapper: pinguard's
         * periodic check finds it and chains to it. */
        struct sigaction w, q;
        memset(&w, 0, sizeof w);
        w.sa_handler = on_b;
        sigaction(SIGWINCH, &w, NULL);
        sigaction(SIGWINCH, NULL, &q); /* the restorer libc uses */
        struct kact k = {(void *)on_a, (unsigned long)(q.sa_flags & 0x04000000) | SA_RESTART, (void *)q.sa_restorer, 0};
        if (syscall(SYS_rt_sigaction, SIGUSR2, &k, NULL, 8) != 0) return 4;
        int retaken = 0;
        for (int i = 0; i < 1000 && !retaken; i++) {
            struct kact now;
            syscall(SYS_rt_sigaction, SIGUSR2, NULL, &now, 8);
            retaken = now.handler != (void *)on_a;
            if (!retaken) usleep(10000);
        }
        printf("retaken=%d\n", retaken);
        show("seen", SIGUSR2);
        raise(SIGUSR2);
        printf("a=%d\n", (int)a);
        printf("signal_report=%d\n", signal_report());
    } else if (!strcmp(m, "flags")) {
        /* What a handler sees of its own flags: the mask it asked for, SA_NODEFER, the alternate
         * stack, SA_RESETHAND, and its siginfo. */
        struct sigaction s;
        memset(&s, 0, sizeof s);
        s.sa_sigaction = on_probe;
        s.sa_flags = SA_SIGINFO;
        sigaddset(&s.sa_mask, SIGHUP);
        sigaction(SIGUSR1, &s, NULL);
        raise(SIGUSR1);
        printf("plain: self_blocked=%d hup_blocked=%d on_alt=%d signo=%d code=%d ctx=%d\n", probe.self_blocked, probe.hup_blocked, probe.on_alt, probe.signo, probe.code, probe.ctx);
        s.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&s.sa_mask);
        sigaction(SIGUSR1, &s, NULL);
        raise(SIGUSR1);
        printf("nodefer: self_blocked=%d hup_blocked=%d on_alt=%d\n", probe.self_blocked, probe.hup_blocked, probe.on_alt);
        static char alt[1 << 16];
        stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
        sigaltstack(&ss, NULL);
        s.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGUSR1, &s, NULL);
        raise(SIGUSR1);
        printf("onstack: self_blocked=%d on_alt=%d sp_in_alt=%d\n", probe.self_blocked, probe.on_alt, probe.sp >= (unsigned long)alt && probe.sp < (unsigned long)alt + sizeof alt);
        s.sa_flags = SA_SIGINFO | SA_RESETHAND;
        sigaction(SIGUSR1, &s, NULL);
        raise(SIGUSR1);
        show("resethand after one", SIGUSR1);
        printf("probes=%d\n", probe.count);
    } else {
        return 2;
    }
    return 0;
}
