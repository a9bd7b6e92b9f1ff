/* A parent that pins 8 KiB, a forked child that pins 4 KiB more and exits, and an exec'd child
 * (argv[1] and the rest) started from another fork. Every process writes its own report. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

int main(int argc, char **argv) {
    void *p;
    cudaHostAlloc(&p, 8192, 0);
    pid_t child = fork();
    if (child == 0) {
        void *q;
        int rc = cudaHostAlloc(&q, 4096, 0);
        printf("forked pid=%d rc=%d\n", (int)getpid(), rc);
        fflush(stdout);
        exit(0);
    }
    waitpid(child, NULL, 0);
    if (argc > 1) {
        pid_t e = fork();
        if (e == 0) {
            execv(argv[1], argv + 1);
            _exit(127);
        }
        int st;
        waitpid(e, &st, 0);
        printf("exec pid=%d status=%d\n", (int)e, WEXITSTATUS(st));
    }
    printf("parent pid=%d\n", (int)getpid());
    return 0;
}
