/* A library whose constructor (run before pinguard's, as the program's libraries' are) registers
 * a fork child handler that changes a signal disposition: in the child it runs before pinguard's
 * own fork handler, while pinguard's disposition lock may still look held by a thread of the
 * parent. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>

static void in_child(void) {
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = SIG_IGN;
    sigaction(SIGWINCH, &a, NULL);
}

__attribute__((constructor)) static void setup(void) { pthread_atfork(NULL, NULL, in_child); }
