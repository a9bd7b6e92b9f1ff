/* A daemon-like program: closes every descriptor from 3 up (close_range), opens its own files,
 * asks for reports with SIGUSR2 (it has its own handler, so that it also runs without pinguard),
 * writes known bytes, then forks a child that uses the same descriptors.
 *
 * argv: DIR (its own files a.dat and b.dat go there), REPORT_DIR (watched with inotify: every
 * report renamed into it is counted), MODE ("wait": wait for a new report after each signal;
 * "nowait": a run without pinguard).
 * Prints STATS {...}; a.dat and b.dat are compared with a run without pinguard. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

#ifndef SYS_close_range
#define SYS_close_range 436
#endif

static volatile sig_atomic_t usr2;
static void on_usr2(int s) { (void)s; usr2++; }

static long reports, overflow;

/* Counts finished reports (renamed into the directory) among the queued events. */
static void drain(int in) {
    char buf[64 * 1024] __attribute__((aligned(8)));
    for (;;) {
        ssize_t len = read(in, buf, sizeof buf);
        if (len <= 0) return;
        for (char *p = buf; p < buf + len;) {
            struct inotify_event *e = (struct inotify_event *)p;
            if (e->mask & IN_Q_OVERFLOW) overflow = 1;
            if ((e->mask & IN_MOVED_TO) && e->len && e->name[0] != '.' && strstr(e->name, ".json")) reports++;
            p += sizeof *e + e->len;
        }
    }
}

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int put(int fd, const char *s) { return write(fd, s, strlen(s)) == (ssize_t)strlen(s); }

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int wait_reports = !strcmp(argv[3], "wait");
    signal(SIGUSR2, on_usr2);
    void *p;
    if (cudaHostAlloc(&p, 8192, 0) != 0) return 3;

    if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
        for (int fd = 3; fd < 1024; fd++) close(fd);

    char path[4096];
    snprintf(path, sizeof path, "%s/a.dat", argv[1]);
    int a = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    snprintf(path, sizeof path, "%s/b.dat", argv[1]);
    int b = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (a < 0 || b < 0 || in < 0 || inotify_add_watch(in, argv[2], IN_MOVED_TO) < 0) return 4;
    char pattern[4096];
    for (size_t i = 0; i < sizeof pattern; i++) pattern[i] = 'A' + i % 26;
    if (write(a, pattern, sizeof pattern) != (ssize_t)sizeof pattern || lseek(a, 0, SEEK_SET) != 0) return 5;
    struct stat sa, sb;
    fstat(a, &sa);
    fstat(b, &sb);

    long start = now_ms();
    int waited_all = 1;
    for (int i = 1; i <= 3; i++) {
        long before = reports;
        raise(SIGUSR2);
        if (wait_reports) {
            int k;
            for (k = 0; k < 2000 && reports == before && !overflow; k++) {
                usleep(5000);
                drain(in);
            }
            if (reports == before) waited_all = 0;
        }
        char line[64];
        snprintf(line, sizeof line, "after signal %d\n", i);
        put(b, line);
    }
    /* Time for a busy reporter to show itself: a few more interval-free moments. */
    for (int k = 0; k < 20; k++) {
        usleep(5000);
        drain(in);
    }
    long elapsed = now_ms() - start;

    off_t a_offset = lseek(a, 0, SEEK_CUR);
    char back[4096];
    int a_same = read(a, back, sizeof back) == (ssize_t)sizeof back && !memcmp(back, pattern, sizeof back);

    pid_t c = fork();
    if (c == 0) {
        struct stat s3, s4;
        int ok = fstat(3, &s3) == 0 && s3.st_ino == sa.st_ino && fstat(4, &s4) == 0 && s4.st_ino == sb.st_ino;
        ok = put(4, "child\n") && ok;
        _exit(ok ? 0 : 1);
    }
    int status = -1;
    waitpid(c, &status, 0);
    put(b, "parent after the child\n");
    printf("STATS {\"a_fd\":%d,\"b_fd\":%d,\"a_offset\":%ld,\"a_same\":%d,\"child_ok\":%d,\"usr2\":%d,"
           "\"reports\":%ld,\"overflow\":%ld,\"waited_all\":%d,\"elapsed_ms\":%ld}\n",
           a, b, (long)a_offset, a_same, WIFEXITED(status) && WEXITSTATUS(status) == 0, (int)usr2, reports, overflow,
           waited_all, elapsed);
    return 0;
}
