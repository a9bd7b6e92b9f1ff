/* What a set-user-ID root program does with the caller's environment, for tests/secure_mode.rs,
 * which makes a copy of it setuid root and runs it as a throw-away user:
 *
 *   lock:KB            mlock KB KiB (a secret): "lock rc=R errno=E vmlck_kb=K" (K from VmLck)
 *   env                "env NAME=VALUE" per PINGUARD_* variable, then "env_count=N"
 *   root_child:OPS     becomes root in full (setresuid 0), then runs this program again with OPS
 *                      (comma-separated) and waits: the child a setuid program starts as root
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static long vmlck_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static int lock(long kb) {
    size_t len = (size_t)kb * 1024;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    memset(p, 0x5a, len);
    errno = 0;
    int rc = mlock(p, len);
    printf("lock rc=%d errno=%d vmlck_kb=%ld\n", rc, rc ? errno : 0, vmlck_kb());
    return 0;
}

static void env(void) {
    int n = 0;
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "PINGUARD_", 9)) {
            printf("env %s\n", *e);
            n++;
        }
    printf("env_count=%d\n", n);
}

static int root_child(char *ops) {
    if (setresuid(0, 0, 0) || setresgid(0, 0, 0)) {
        printf("root_child setresuid failed errno=%d\n", errno);
        return 1;
    }
    char *args[64] = {"secure_prog"};
    int n = 1;
    for (char *op = strtok(ops, ","); op && n < 63; op = strtok(NULL, ",")) args[n++] = op;
    args[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("root_child status=%d\n", st);
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        char op[64] = {0}, arg[1024] = {0};
        sscanf(argv[i], "%63[^:]:%1023s", op, arg);
        int bad = 0;
        if (!strcmp(op, "lock")) bad = lock(strtol(arg, NULL, 0));
        else if (!strcmp(op, "env")) env();
        else if (!strcmp(op, "root_child")) bad = root_child(arg);
        else {
            fprintf(stderr, "secure_prog: unknown op %s\n", op);
            return 2;
        }
        fflush(stdout);
        if (bad) return 1;
    }
    return 0;
}
