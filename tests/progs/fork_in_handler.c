/* fork() from a signal handler (issue 44 item 3): SIGALRM every 500 us forks a child that
 * _exits at once, while the main thread locks and unlocks 64 KiB in a loop for argv[1] ms (the
 * handler interrupts pinguard's bookkeeping often). Every 64th child instead returns from the
 * handler, finishes what was interrupted, locks the buffer and exits normally. Every process ends
 * with the buffer locked. The parent prints whether it forked, then "done"; on stderr, the
 * number of forks and of children that returned. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_long forks, failed, returned;
static volatile sig_atomic_t in_child;

static void on_alarm(int s) {
    (void)s;
    int e = errno;
    pid_t c = fork();
    if (c == 0) {
        if (atomic_load(&forks) % 64 != 0) _exit(0);
        in_child = 1;
        errno = e;
        return;
    }
    if (c > 0) {
        if (atomic_fetch_add(&forks, 1) % 64 == 0) atomic_fetch_add(&returned, 1);
    } else {
        atomic_fetch_add(&failed, 1);
    }
    errno = e;
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 1000;
    static char buf[64 << 10] __attribute__((aligned(4096)));
    struct sigaction a = {0};
    a.sa_handler = on_alarm;
    a.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &a, NULL);
    struct itimerval it = {{0, 500}, {0, 500}};
    setitimer(ITIMER_REAL, &it, NULL);
    long end = now_ms() + ms, bad = 0;
    while (now_ms() < end && !in_child) {
        for (int i = 0; i < 100 && !in_child; i++) {
            if (mlock(buf, sizeof buf) != 0 && errno != EAGAIN && errno != EINTR) bad++;
            munlock(buf, sizeof buf);
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    if (in_child) exit(mlock(buf, sizeof buf) == 0 ? 0 : 1);
    while (wait(NULL) > 0 || errno == EINTR) {
    }
    if (mlock(buf, sizeof buf) != 0) bad++;
    printf("%s\n", atomic_load(&forks) > 0 ? "forks" : "no forks");
    printf("failed forks %ld, bad calls %ld\n", atomic_load(&failed), bad);
    printf("done\n");
    fflush(stdout);
    fprintf(stderr, "forks %ld\nreturned %ld\n", atomic_load(&forks), atomic_load(&returned));
    return bad != 0;
}
