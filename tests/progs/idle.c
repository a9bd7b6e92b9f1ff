/* A program that never pins, doing what ordinary programs do (allocate, fork, handle a signal,
 * load a library), then printing what the kernel says it has: threads, descriptors and the
 * anonymous mappings. tests/idle.rs runs it with and without pinguard and compares. */
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_usr1(int sig) { (void)sig; }

int main(void) {
    char *p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    free(p);
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    pid_t c = fork();
    if (c == 0) _exit(0);
    int st;
    waitpid(c, &st, 0);
    void *h = dlopen("libm.so.6", RTLD_NOW);
    if (h) dlclose(h);
    char line[512];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) fputs(line, stdout);
    if (f) fclose(f);
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int fd_dir = d ? dirfd(d) : -1;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == fd_dir) continue;
        char path[64], target[256] = "";
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0) target[n] = 0;
        printf("fd %s %s\n", e->d_name, strncmp(target, "pipe:", 5) ? target : "pipe");
    }
    if (d) closedir(d);
    f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f)) printf("map %s", line);
    if (f) fclose(f);
    return 3;
}
