/* Pins pages behind pinguard's back the way an io_uring user does: IORING_REGISTER_BUFFERS through
 * raw system calls (no liburing), which the kernel counts in VmPin. Each argument is one step:
 *   uring:KB      maps KB KiB and registers them as a new ring's fixed buffer:
 *                 "uring rc=R errno=E vmpin=KB" (rc -1: the ring or the registration failed)
 *   unuring       unregisters the last ring's buffers and closes it: "unuring rc=R vmpin=KB"
 *   mlock:KB      locks KB KiB of a new mapping (a call pinguard sees): "mlock rc=R errno=E"
 *   live          pinguard_live_bytes() (-1 without pinguard): "live=N vmpin=KB"
 *   sleep:MS      sleeps
 *   metrics:DIR   prints the lines of DIR/m.PID.prom naming kernel_pinned: "metric NAME VALUE"
 * Exits 0 when every step ran (a failed call is an answer, not an error). */
#define _GNU_SOURCE
#include "proc_status.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>

#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425
#endif
#ifndef SYS_io_uring_register
#define SYS_io_uring_register 427
#endif
#define IORING_REGISTER_BUFFERS 0
#define IORING_UNREGISTER_BUFFERS 1

/* struct io_uring_params: 120 bytes, all zero asks for the defaults. */
struct params { uint32_t words[30]; };

static int rings[64];
static int nrings;

static void *mapped(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void uring(size_t kb) {
    struct params par;
    memset(&par, 0, sizeof par);
    int rc = -1, err = 0;
    void *p = mapped(kb << 10);
    long fd = syscall(SYS_io_uring_setup, 1, &par);
    if (fd < 0 || !p) {
        err = errno;
    } else {
        struct iovec iov = { p, kb << 10 };
        rc = (int)syscall(SYS_io_uring_register, (int)fd, IORING_REGISTER_BUFFERS, &iov, 1);
        err = rc ? errno : 0;
        if (rc == 0 && nrings < 64) rings[nrings++] = (int)fd;
        else close((int)fd);
    }
    printf("uring rc=%d errno=%d vmpin=%ld\n", rc, err, status_kb("VmPin:"));
}

static void unuring(void) {
    int rc = -1;
    if (nrings > 0) {
        int fd = rings[--nrings];
        rc = (int)syscall(SYS_io_uring_register, fd, IORING_UNREGISTER_BUFFERS, NULL, 0);
        close(fd);
    }
    printf("unuring rc=%d vmpin=%ld\n", rc, status_kb("VmPin:"));
}

static void metrics(const char *dir) {
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/m.%d.prom", dir, (int)getpid());
    FILE *f = fopen(path, "r");
    if (!f) { printf("metric none errno=%d\n", errno); return; }
    while (fgets(line, sizeof line, f))
        if (line[0] != '#' && strstr(line, "kernel_pinned")) {
            char name[512];
            double v;
            if (sscanf(line, "%511[^{ ]%*[^ ] %lf", name, &v) == 2 || sscanf(line, "%511s %lf", name, &v) == 2)
                printf("metric %s %.0f\n", name, v);
        }
    fclose(f);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t (*live)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "uring:", 6)) {
            uring(strtoul(a + 6, NULL, 10));
        } else if (!strcmp(a, "unuring")) {
            unuring();
        } else if (!strncmp(a, "mlock:", 6)) {
            size_t len = strtoul(a + 6, NULL, 10) << 10;
            void *p = mapped(len);
            int rc = p ? mlock(p, len) : -1;
            printf("mlock rc=%d errno=%d\n", rc, rc ? errno : 0);
        } else if (!strcmp(a, "live")) {
            long n = live ? (long)live() : -1L;
            printf("live=%ld vmpin=%ld\n", n, status_kb("VmPin:"));
        } else if (!strncmp(a, "sleep:", 6)) {
            long ms = strtol(a + 6, NULL, 10);
            struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
            nanosleep(&ts, NULL);
        } else if (!strncmp(a, "metrics:", 8)) {
            metrics(a + 8);
        } else {
            fprintf(stderr, "unknown step %s\n", a);
            return 2;
        }
    }
    return 0;
}
