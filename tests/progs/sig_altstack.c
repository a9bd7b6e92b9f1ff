/* Handlers on alternate signal stacks, which the application's handler alone must find as they
 * are: nothing else may write to them, or need room on them.
 *
 *   flip SIG N     An empty SA_ONSTACK handler of SIG on a 40 KiB alternate stack, SIGSEGV's
 *                  handler empty too (on the ordinary stack), while another thread flips the
 *                  alternate stack between PROT_READ and PROT_READ|PROT_WRITE; the main thread
 *                  sends itself SIG N times, in 5 rounds, and checks that a floating-point value
 *                  held in a register survives every delivery. The kernel writes each frame
 *                  only while the stack is writable (or delivers SIGSEGV instead, to the empty
 *                  handler), and the empty handler writes nothing: every round ends.
 *   probe          Prints the smallest alternate stack (in 16-byte steps from 1,024 bytes) on
 *                  which `tight` runs, each size tried in a fork child.
 *   tight SIG SIZE A SA_ONSTACK handler of SIG, which counts its deliveries, on an alternate
 *                  stack of SIZE bytes whose low end touches an inaccessible page: 100
 *                  deliveries, then "handled=100".
 *
 *   direct         For every signal a handler may be set for, sets one (with sigaction, signal and
 *                  sysv_signal in turn) and prints whether the kernel's own action, read with the
 *                  raw system call, holds the application's function.
 *
 * SIG is a number. What it prints is the same with and without pinguard, exit status included. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

static void empty(int s) { (void)s; }

static volatile sig_atomic_t hits;
static void count(int s) { (void)s; hits++; }

static char flipped[4096 * 10] __attribute__((aligned(4096)));
static volatile int stop;

static void *flipper(void *arg) {
    (void)arg;
    while (!stop) {
        if (mprotect(flipped, sizeof flipped, PROT_READ) != 0) abort();
        if (mprotect(flipped, sizeof flipped, PROT_READ | PROT_WRITE) != 0) abort();
    }
    return NULL;
}

static void install(int sig, void (*h)(int), int flags) {
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = h;
    a.sa_flags = flags;
    if (sigaction(sig, &a, NULL) != 0) abort();
}

/* One round: N signals to this thread, the value in a floating-point register checked after
 * each. Returns how many were sent before the value changed (N if it never did). */
__attribute__((noinline)) static long round_of(int sig, long n) {
    pid_t pid = getpid(), tid = (pid_t)syscall(SYS_gettid);
    volatile double d = 123.456;
    long i = 0;
    while (d == 123.456 && i < n) {
        syscall(SYS_tgkill, pid, tid, sig);
        i++;
    }
    return i;
}

static int flip(int sig, long n) {
    stack_t ss = {.ss_sp = flipped, .ss_size = sizeof flipped, .ss_flags = 0};
    install(SIGSEGV, empty, 0);
    if (sigaltstack(&ss, NULL) != 0) abort();
    install(sig, empty, SA_ONSTACK);
    for (int r = 0; r < 5; r++) {
        pthread_t t;
        stop = 0;
        if (pthread_create(&t, NULL, flipper, NULL) != 0) abort();
        long got = round_of(sig, n);
        stop = 1;
        pthread_join(t, NULL);
        printf("round %d: %s\n", r, got == n ? "all sent, value kept" : "value changed");
    }
    return 0;
}

/* An alternate stack of exactly `size` bytes above an inaccessible page. */
static void tight_stack(size_t size) {
    long page = sysconf(_SC_PAGESIZE);
    size_t span = (size + (size_t)page - 1) / (size_t)page * (size_t)page;
    char *m = mmap(NULL, span + (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, (size_t)page, PROT_NONE) != 0) abort();
    stack_t ss = {.ss_sp = m + page, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) {
        printf("sigaltstack refused %zu bytes\n", size);
        exit(1);
    }
}

static int tight(int sig, size_t size) {
    tight_stack(size);
    install(sig, count, SA_ONSTACK);
    for (int i = 0; i < 100; i++) raise(sig);
    printf("handled=%d\n", (int)hits);
    return hits == 100 ? 0 : 1;
}

static int probe(int sig) {
    for (size_t size = 1024; size <= 65536; size += 16) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            int devnull = open("/dev/null", 1);
            dup2(devnull, 1);
            _exit(tight(sig, size));
        }
        int st;
        if (p < 0 || waitpid(p, &st, 0) != p) abort();
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("%zu\n", size);
            return 0;
        }
    }
    return 1;
}

/* The kernel's view of a disposition, bypassing libc (and pinguard's hooks). */
struct kact {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

static int direct(void) {
    int bad = 0;
    for (int sig = 1; sig < 32; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        for (int how = 0; how < 3; how++) {
            if (how == 0) install(sig, count, SA_ONSTACK);
            else if (how == 1) signal(sig, count);
            else sysv_signal(sig, count);
            struct kact k;
            if (syscall(SYS_rt_sigaction, sig, NULL, &k, 8) != 0) abort();
            if (k.handler != (void *)count) {
                printf("signal %d (setter %d): the kernel holds another handler\n", sig, how);
                bad++;
            }
            signal(sig, SIG_DFL);
        }
    }
    printf("handlers not the application's: %d\n", bad);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && !strcmp(argv[1], "flip")) return flip(atoi(argv[2]), atol(argv[3]));
    if (argc >= 3 && !strcmp(argv[1], "probe")) return probe(atoi(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "direct")) return direct();
    if (argc >= 4 && !strcmp(argv[1], "tight")) return tight(atoi(argv[2]), (size_t)atol(argv[3]));
    return 2;
}
