/* peak_rss [-p LIB] PROGRAM ARGS..: runs PROGRAM (with LIB as its LD_PRELOAD) and prints, on
 * stderr after it ends, "peak_rss_kib=N wall_us=M"; exits with its status (128 + the signal).
 * A process forked from a large one (a test binary) starts with that one's peak memory as its
 * own, and keeps it across exec; forked from this small one instead, PROGRAM's peak is its own. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *preload = NULL;
    int i = 1;
    if (argc > 2 && strcmp(argv[1], "-p") == 0) {
        preload = argv[2];
        i = 3;
    }
    if (i >= argc) {
        fprintf(stderr, "usage: peak_rss [-p LIB] PROGRAM ARGS..\n");
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        if (preload) setenv("LD_PRELOAD", preload, 1);
        execv(argv[i], argv + i);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &status, 0, &ru) != pid) {
        perror("peak_rss");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long wall_us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    fprintf(stderr, "peak_rss_kib=%ld wall_us=%ld\n", ru.ru_maxrss, wall_us);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
