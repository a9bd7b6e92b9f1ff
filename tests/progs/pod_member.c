/* A member of a pod-wide group (tests/pod_group.rs), run in a PID namespace of its own. Every
 * emulated runtime's pinned bytes feed a counter shared by the processes of the test (a file
 * named by EMU_SHARED_COUNTER holding [current, max]), so the test sees the pod's combined
 * maximum, counted by the runtimes themselves.
 *
 *   hold SIZE [HOW]   pins SIZE bytes with cudaHostAlloc, prints "ready rc=RC", then:
 *                       (none)      holds them until a line on stdin, frees them and exits
 *                       closeall    closes every descriptor it has (close_range, stdio too) and
 *                                   sleeps until killed
 *                       threadexit  starts a thread that sleeps until the process is killed, and
 *                                   ends the main thread (the one that joined) with pthread_exit
 *                       nosem       as (none), under a seccomp filter installed before the
 *                                   first pin that answers every System V semaphore call with
 *                                   EPERM, as a sandbox that denies them would
 *                       exec        pins SIZE bytes, then execs itself as "hold SIZE" (the new
 *                                   image pins SIZE bytes again and holds them)
 *   fill SIZE MS      tries cudaHostAlloc(SIZE) every 2 ms until it succeeds or MS milliseconds
 *                     pass; prints "got=G tries=N at_ms=T" (T: CLOCK_MONOTONIC milliseconds of
 *                     the success, or of giving up) and holds what it got until stdin closes (then frees it)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static int64_t *shared;
void emu_combined_add(int64_t bytes) {
    if (!shared) return;
    int64_t now = __atomic_add_fetch(&shared[0], bytes, __ATOMIC_SEQ_CST);
    int64_t max = __atomic_load_n(&shared[1], __ATOMIC_SEQ_CST);
    while (now > max && !__atomic_compare_exchange_n(&shared[1], &max, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *sleeper(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#endif

/* semget, semop, semtimedop and semctl answer EPERM from now on (kept across exec). */
static void deny_semaphores(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_semget, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_semop, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_semtimedop, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_semctl, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("pod_member: seccomp");
        exit(2);
    }
}

static int hold(size_t size, const char *how) {
    void *p = NULL;
    if (!strcmp(how, "nosem")) deny_semaphores();
    int rc = cudaHostAlloc(&p, size, 0);
    printf("ready rc=%d\n", rc);
    fflush(stdout);
    if (!strcmp(how, "closeall")) {
        /* Every descriptor, pinguard's included if it kept any: liveness must not hang on one. */
        syscall(SYS_close_range, 0u, ~0u, 0u);
        for (;;) pause();
    }
    if (!strcmp(how, "threadexit")) {
        pthread_t t;
        pthread_create(&t, NULL, sleeper, NULL);
        pthread_exit(NULL);
    }
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 3;
    if (rc == 0) cudaFreeHost(p); /* off the runtimes' count */
    return 0;
}

static int fill(size_t size, double ms) {
    double start = now_ms(), at;
    void *p = NULL;
    int got = 0, tries = 0;
    for (;;) {
        tries++;
        if (cudaHostAlloc(&p, size, 0) == 0) {
            got = 1;
            at = now_ms();
            break;
        }
        at = now_ms();
        if (at - start >= ms) break;
        usleep(2000);
    }
    printf("got=%d tries=%d at_ms=%.0f\n", got, tries, at);
    fflush(stdout);
    char line[16];
    while (fgets(line, sizeof line, stdin)) {
    }
    if (got) cudaFreeHost(p);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = getenv("EMU_SHARED_COUNTER");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd >= 0) {
        void *m = mmap(NULL, 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) shared = m;
        close(fd);
    }
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "hold") && argc > 2) {
        const char *how = argc > 3 ? argv[3] : "";
        if (!strcmp(how, "exec")) {
            void *p = NULL;
            size_t size = strtoul(argv[2], NULL, 0);
            if (cudaHostAlloc(&p, size, 0) == 0) emu_combined_add(-(int64_t)size); /* exec frees it: off the count */
            char *args[] = {argv[0], "hold", argv[2], NULL};
            execv(argv[0], args);
            perror("execv");
            return 2;
        }
        return hold(strtoul(argv[2], NULL, 0), how);
    }
    if (!strcmp(mode, "fill") && argc > 3) return fill(strtoul(argv[2], NULL, 0), atof(argv[3]));
    fprintf(stderr, "usage: pod_member hold SIZE [closeall|threadexit|nosem|exec] | fill SIZE MS\n");
    return 2;
}
