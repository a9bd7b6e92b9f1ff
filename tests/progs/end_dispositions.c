/* What a program finds: every signal's disposition (sigaction(sig, NULL, &old)) and the blocked
 * set, one line per signal, first thing in main; then again after it pinned (pinguard may set
 * things up at the first pinning call). Then each of HUP, INT, QUIT, PIPE, TERM and USR1 that it
 * found ignored is raised, and it prints "survived": an inherited SIG_IGN (nohup, a shell's
 * background job) must still mean the signal is discarded. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>

int cudaHostAlloc(void **, size_t, unsigned);

static unsigned long long mask_bits(const sigset_t *set) {
    unsigned long long bits = 0;
    for (int s = 1; s <= 64 && s < NSIG; s++)
        if (sigismember(set, s) == 1) bits |= 1ull << (s - 1);
    return bits;
}

static struct sigaction found[NSIG];
static int ok[NSIG];

/* Queried before any output: printf must not be what changes them. */
static void dump(const char *when) {
    sigset_t blocked;
    for (int s = 1; s < NSIG; s++) ok[s] = sigaction(s, NULL, &found[s]) == 0;
    sigprocmask(SIG_BLOCK, NULL, &blocked);
    printf("%s blocked=%#llx\n", when, mask_bits(&blocked));
    for (int s = 1; s < NSIG; s++) {
        if (!ok[s]) {
            printf("%s %d: error\n", when, s);
            continue;
        }
        const struct sigaction *a = &found[s];
        int info = (a->sa_flags & SA_SIGINFO) != 0;
        void *h = info ? (void *)a->sa_sigaction : (void *)a->sa_handler;
        const char *what = h == (void *)SIG_DFL ? "DFL" : h == (void *)SIG_IGN ? "IGN" : "handler";
        printf("%s %d: %s flags=%#x mask=%#llx\n", when, s, what, (unsigned)a->sa_flags, mask_bits(&a->sa_mask));
    }
}

int main(void) {
    dump("start");
    void *p;
    if (cudaHostAlloc(&p, 4096, 0) != 0) return 3;
    dump("pinned");
    const int raised[] = {SIGHUP, SIGINT, SIGQUIT, SIGPIPE, SIGTERM, SIGUSR1};
    for (unsigned i = 0; i < sizeof raised / sizeof *raised; i++)
        if (ok[raised[i]] && found[raised[i]].sa_handler == SIG_IGN) {
            raise(raised[i]);
            printf("raised %d\n", raised[i]);
        }
    printf("survived\n");
    return 0;
}
