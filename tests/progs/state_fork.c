/* The state file across fork and while running.
 *   state_fork fork  : pins 2 x 4 KiB, forks; the child pins 3 x 8 KiB and dies of SIGKILL; the
 *                      parent waits for it and exits normally with its 2 allocations live.
 *   state_fork hold  : pins 2 x 4 KiB, says "ready", and runs until its stdin closes.
 *   state_fork exec  : pins 2 x 4 KiB and replaces itself with `state_fork idle`, which pins
 *                      nothing and exits. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int cudaHostAlloc(void **p, size_t size, unsigned int flags);

static void pin(int n, size_t size) {
    for (int i = 0; i < n; i++) {
        void *p = 0;
        if (cudaHostAlloc(&p, size, 0) != 0) {
            fprintf(stderr, "cudaHostAlloc failed\n");
            _exit(3);
        }
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "idle")) return 0;
    pin(2, 4096);
    if (!strcmp(mode, "exec")) {
        execl("/proc/self/exe", "state_fork", "idle", (char *)0);
        return 5;
    }
    if (!strcmp(mode, "fork")) {
        pid_t c = fork();
        if (c == 0) {
            pin(3, 8192);
            raise(SIGKILL);
            _exit(4);
        }
        int st = 0;
        waitpid(c, &st, 0);
        printf("child=%d signalled=%d sig=%d\n", (int)c, WIFSIGNALED(st), WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        return 0;
    }
    if (!strcmp(mode, "hold")) {
        printf("ready\n");
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof buf) > 0) {
        }
        return 0;
    }
    return 2;
}
