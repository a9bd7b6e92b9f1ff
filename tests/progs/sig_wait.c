/* Signals the application waits for, and what it reads back after a one-shot handler.
 *   sig_wait sigwait    blocks SIGTERM, sends it to the process and waits for it with sigwait:
 *                       a thread of pinguard's that left it unblocked would be killed by it.
 *   sig_wait oneshot    a one-shot (SA_RESETHAND) handler of SIGUSR1 runs; then the flags the
 *                       application reads back are those it set (SA_SIGINFO not among them). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int hits;
static void on_usr1(int sig) { (void)sig; hits++; }

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "sigwait")) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        usleep(100 * 1000); /* a report interval or two */
        kill(getpid(), SIGTERM);
        int got = 0;
        sigwait(&set, &got);
        printf("got %d\n", got);
        return 0;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    sigaction(SIGUSR1, NULL, &old);
    printf("hits=%d dfl=%d siginfo=%d resethand=%d\n", hits, old.sa_handler == SIG_DFL, !!(old.sa_flags & SA_SIGINFO),
           !!(old.sa_flags & SA_RESETHAND));
    return 0;
}
