/* fork() from a signal handler (issue 44 item 3): SIGALRM every 500 us forks a child that
 * _exits at once, while the main thread locks and unlocks 64 KiB in a loop for argv[1] ms (the
 * handler interrupts pinguard's bookkeeping often). Ends with the buffer locked. Prints the
 * number of forks (above 0, or "no forks"), then "done". */
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

static atomic_long forks, failed;

static void on_alarm(int s) {
    (void)s;
    int e = errno;
    pid_t c = fork();
    if (c == 0) _exit(0);
    if (c > 0) atomic_fetch_add(&forks, 1);
    else atomic_fetch_add(&failed, 1);
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
    while (now_ms() < end) {
        for (int i = 0; i < 100; i++) {
            if (mlock(buf, sizeof buf) != 0 && errno != EAGAIN && errno != EINTR) bad++;
            munlock(buf, sizeof buf);
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    while (wait(NULL) > 0 || errno == EINTR) {
    }
    if (mlock(buf, sizeof buf) != 0) bad++;
    printf("%s\n", atomic_load(&forks) > 0 ? "forks" : "no forks");
    printf("failed forks %ld, bad calls %ld\n", atomic_load(&failed), bad);
    printf("done\n");
    fflush(stdout);
    fprintf(stderr, "forks %ld\n", atomic_load(&forks));
    return bad != 0;
}
