/* A program that runs in little memory, for pinguard's own allocations failing around it.
 *
 * mem_limits plain: prints lines (buffered: lost if the process aborts), locks and unlocks
 *   64 KiB, exits 0. Its VmSize goes to stderr, for the test to size a `ulimit -v` from.
 * mem_limits squeeze MARGIN_KB: prints lines, maps 256 pages, then lowers its own RLIMIT_AS to
 *   its VmSize plus MARGIN_KB and locks and unlocks one page from 4,096 different stacks (each a
 *   new callsite for pinguard, which needs memory to record it). Prints how many calls worked.
 * mem_limits squeeze MARGIN_KB relax: the same, then puts the limit back, waits 200 ms and locks
 *   and unlocks one page 64 times more, from one stack.
 * mem_limits starved: first thing, lowers its RLIMIT_AS to its VmSize and uses up what malloc
 *   has left, then runs 50 ms without a system call (a thread created before main gets its first
 *   turn then, on one CPU), puts the limit back and prints one line. */
#include <time.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include "proc_status.h"

/* VmSize in KiB, read without malloc (fopen would allocate). */
static long vm_size_kb(void) { return status_kb("VmSize:"); }

static char *page_base;
static long page;
static volatile int sink;
static int locked, tried;

static void lock_one(int i) {
    char *p = page_base + (long)(i % 128) * 2 * page;
    tried++;
    if (mlock(p, page) == 0 && munlock(p, page) == 0) locked++;
}

/* Six levels, four call sites each: 4,096 different stacks (every call statement is a return
 * address of its own; the additions after them keep the calls from becoming jumps). */
__attribute__((noinline)) static void descend(int level, int i) {
    if (level == 0) {
        lock_one(i);
        return;
    }
    switch ((i >> (2 * level - 2)) & 3) {
    case 0: descend(level - 1, i); sink += 1; break;
    case 1: descend(level - 1, i); sink += 2; break;
    case 2: descend(level - 1, i); sink += 3; break;
    default: descend(level - 1, i); sink += 4; break;
    }
}

static int starved(void) {
    struct rlimit old, r;
    if (getrlimit(RLIMIT_AS, &old) != 0) return 4;
    r = old;
    /* Read through stdio, as a program would: the C library's heap is in use before the limit. */
    char line[256];
    long kb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) kb = atol(line + 7);
    if (f) fclose(f);
    r.rlim_cur = kb * 1024;
    if (setrlimit(RLIMIT_AS, &r) != 0) return 4;
    while (malloc(256))
        ;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000000L + b.tv_nsec - a.tv_nsec < 50000000L);
    if (setrlimit(RLIMIT_AS, &old) != 0) return 4;
    printf("starved, then fed\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (strcmp(argv[1], "starved") == 0) return starved();
    for (int i = 0; i < 5; i++) printf("line %d\n", i);
    page = sysconf(_SC_PAGESIZE);
    if (strcmp(argv[1], "plain") == 0) {
        static char buf[64 << 10] __attribute__((aligned(65536)));
        memset(buf, 1, sizeof buf);
        int a = mlock(buf, sizeof buf);
        int b = munlock(buf, sizeof buf);
        printf("mlock %d munlock %d\n", a, b);
        fprintf(stderr, "VmSize %ld\n", vm_size_kb());
        return 0;
    }
    if (strcmp(argv[1], "squeeze") == 0 && argc > 2) {
        page_base = mmap(NULL, 256 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page_base == MAP_FAILED) return 3;
        memset(page_base, 1, 256 * page);
        long limit = (vm_size_kb() + atol(argv[2])) * 1024;
        struct rlimit old, r;
        if (getrlimit(RLIMIT_AS, &old) != 0) return 4;
        r = old;
        r.rlim_cur = limit;
        if (setrlimit(RLIMIT_AS, &r) != 0) return 4;
        for (int i = 0; i < 4096; i++) descend(6, i);
        if (argc > 3 && strcmp(argv[3], "relax") == 0) {
            if (setrlimit(RLIMIT_AS, &old) != 0) return 4;
            usleep(200 * 1000);
            for (int i = 0; i < 64; i++) lock_one(i);
        }
        printf("locked %d of %d\n", locked, tried);
        return 0;
    }
    return 2;
}
