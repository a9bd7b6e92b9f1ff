/* The workload of the container suite (scripts/container-tests.sh): a service that pins host
 * memory through the (emulated) CUDA runtime and keeps it while it runs.
 *
 *   pin_hold STOP STEP...
 *   STEP: N      cudaHostAlloc of N MiB, kept; prints "alloc N MiB rc=RC"
 *         hold   prints "holding" and waits until the file STOP exists (looked for every 50 ms),
 *                or the process is killed
 *         ms:N   sleeps N milliseconds
 * First prints "pid=PID pidns=NS ipcns=NS" (this process's pid and namespaces, as the kernel names
 * them), last "exit"; then exits 0 without freeing, as a service that ends holding its memory. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

static const char *ns(const char *path, char *buf, size_t len) {
    ssize_t n = readlink(path, buf, len - 1);
    buf[n > 0 ? n : 0] = 0;
    return n > 0 ? buf : "?";
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pin_hold STOP STEP...\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char a[64], b[64];
    printf("pid=%d pidns=%s ipcns=%s\n", (int)getpid(), ns("/proc/self/ns/pid", a, sizeof a), ns("/proc/self/ns/ipc", b, sizeof b));
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "hold") == 0) {
            printf("holding\n");
            while (access(argv[1], F_OK) != 0) sleep_ms(50);
        } else if (strncmp(argv[i], "ms:", 3) == 0) {
            sleep_ms(atol(argv[i] + 3));
        } else {
            void *p = NULL;
            int rc = cudaHostAlloc(&p, (size_t)atol(argv[i]) << 20, 0);
            printf("alloc %s MiB rc=%d\n", argv[i], rc);
        }
    }
    printf("exit\n");
    return 0;
}
