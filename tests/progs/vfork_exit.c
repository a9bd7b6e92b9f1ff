/* Pins 1 MiB, starts a child the way argv[1] says, waits for it, then tries to pin 1 MiB twice
 * more (a 2 MiB group budget takes the first and refuses the second):
 *   vfork-exit          vfork; the child calls _exit while sharing the parent's memory
 *   vfork-exec-missing  vfork; the child's execve fails (no such command), then _exit
 *   vfork-exec          vfork; the child execs /bin/true
 *   posix-spawn         posix_spawn of /bin/true */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
extern char **environ;

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *m = argv[1];
    void *p1, *p2, *p3;
    int a1 = cudaHostAlloc(&p1, 1 << 20, 0);
    char *true_argv[] = {"true", NULL};
    char *missing_argv[] = {"no-such-command", NULL};
    pid_t c = -1;
    if (!strcmp(m, "posix-spawn")) {
        if (posix_spawn(&c, "/bin/true", NULL, NULL, true_argv, environ) != 0) return 3;
    } else {
        c = vfork();
        if (c == 0) {
            if (!strcmp(m, "vfork-exec-missing")) execve("/nonexistent/no-such-command", missing_argv, environ);
            else if (!strcmp(m, "vfork-exec")) execve("/bin/true", true_argv, environ);
            _exit(7);
        }
    }
    int status = -1;
    if (c < 0 || waitpid(c, &status, 0) != c) return 4;
    int a2 = cudaHostAlloc(&p2, 1 << 20, 0);
    int a3 = cudaHostAlloc(&p3, 1 << 20, 0);
    printf("STATS {\"pid\":%d,\"child\":%d,\"child_status\":%d,\"alloc1\":%d,\"alloc2\":%d,\"alloc3\":%d}\n", (int)getpid(), (int)c,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, a1, a2, a3);
    return 0;
}
