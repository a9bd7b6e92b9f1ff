/* Threads change a signal's disposition and raise it, over and over, while the main thread forks
 * children that change dispositions at once: no child may hang on pinguard's disposition lock
 * (held by a thread the child does not have), and every raise runs exactly one of the two
 * handlers installed. Linked with libsigatfork.so, whose fork child handler changes a disposition
 * before pinguard's own fork handler has run. argv[1]: forks. Prints STATS {...}. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

static atomic_long ran_a, ran_b, raised;
static atomic_int stop;
static void on_a(int s) { (void)s; atomic_fetch_add(&ran_a, 1); }
static void on_b(int s, siginfo_t *i, void *c) { (void)s; (void)i; (void)c; atomic_fetch_add(&ran_b, 1); }

static void *churn(void *arg) {
    long n = 0;
    (void)arg;
    while (!atomic_load(&stop)) {
        struct sigaction a;
        memset(&a, 0, sizeof a);
        if (n++ % 2) {
            a.sa_handler = on_a;
        } else {
            a.sa_sigaction = on_b;
            a.sa_flags = SA_SIGINFO;
        }
        sigaction(SIGUSR1, &a, NULL);
        raise(SIGUSR1);
        atomic_fetch_add(&raised, 1);
        raise(SIGUSR2); /* pinguard's report signal, with the application's handler on_a */
        atomic_fetch_add(&raised, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 100;
    void *p;
    cudaHostAlloc(&p, 4096, 0);
    signal(SIGUSR2, on_a);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, NULL);
    int bad = 0;
    for (int i = 0; i < forks; i++) {
        pid_t c = fork();
        if (c == 0) {
            struct sigaction a, o;
            memset(&a, 0, sizeof a);
            a.sa_handler = on_a;
            if (sigaction(SIGUSR1, &a, &o) != 0) _exit(3);
            raise(SIGUSR1);
            _exit(atomic_load(&ran_a) > 0 ? 0 : 4);
        }
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    long handled = atomic_load(&ran_a) + atomic_load(&ran_b);
    printf("STATS {\"bad\":%d,\"raised\":%ld,\"handled\":%ld}\n", bad, atomic_load(&raised), handled);
    return 0;
}
