/* A program with its own SIGTERM handler, which pins (8192 + 65536 bytes left pinned), prints
 * "ready" and waits for SIGTERM:
 *   end_handler flag   the handler sets a flag and main returns
 *   end_handler exit   the handler calls exit(0) itself
 * The handler says "handler ran" (write(2), safe in a handler) either way. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

static volatile sig_atomic_t termed;
static int exit_in_handler;

static void on_term(int sig) {
    (void)sig;
    static const char msg[] = "handler ran\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(3);
    if (exit_in_handler) exit(0);
    termed = 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    exit_in_handler = !strcmp(argv[1], "exit");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0) return 3;
    void *a, *b;
    if (cudaHostAlloc(&a, 8192, 0) != 0 || cudaHostAlloc(&b, 65536, 0) != 0) return 3;
    /* Blocked around the check, so that a SIGTERM between the check and the wait is not lost. */
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    printf("ready\n");
    fflush(stdout);
    while (!termed) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    printf("main returns\n");
    return 0;
}
