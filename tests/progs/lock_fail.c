/* Locking calls that fail, many times over, in a process with many mappings.
 *
 *   lock_fail MAPS N
 *
 * Drops CAP_IPC_LOCK (so that RLIMIT_MEMLOCK applies, to root too), sets RLIMIT_MEMLOCK to 64 KiB
 * (Docker's old default), maps MAPS one-page mappings that cannot merge, locks one page, then
 * makes each of these failing calls N times and prints one line per kind with what the calls
 * answered ("calls=N rc=-1 errno=E", or "mixed" if they did not all answer the same):
 *   over     mlock of 1 MiB, over the limit: ENOMEM, nothing locked
 *   onfault  mlock2(MLOCK_ONFAULT) of the same
 *   hole     mlock of a range that starts in a hole: ENOMEM, nothing locked
 *   unlock   munlock of a range that starts in a hole and holds the locked page: ENOMEM, nothing
 *            unlocked
 *   all      mlockall(MCL_CURRENT), the address space over the limit: ENOMEM, nothing locked
 *   mapped   mmap(MAP_LOCKED) of 1 MiB, over the limit: EAGAIN, nothing mapped
 * and last, once each, calls that fail after changing something:
 *   partial  mlock of two pages and the hole after them: ENOMEM, the two pages locked
 *   unpart   munlock of the same: ENOMEM, the two pages unlocked
 * each followed by "vmlck=BYTES live=BYTES" (pinguard_live_bytes(), -1 without pinguard). */
#define _GNU_SOURCE
#define PINGUARD_WEAK
#include "pinguard.h"
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "proc_status.h"

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

static long vmlck(void) {
    long kb = status_kb("VmLck:");
    return kb < 0 ? -1 : kb * 1024;
}

static void state(void) {
    printf("vmlck=%ld live=%ld\n", vmlck(), pinguard_live_bytes ? (long)pinguard_live_bytes() : -1L);
}

/* CAP_IPC_LOCK out of the effective and permitted sets (capset, version 3: two words). */
static void drop_ipc_lock(void) {
    struct { uint32_t version; int pid; } h = {0x20080522, 0};
    struct { uint32_t effective, permitted, inheritable; } d[2];
    if (syscall(SYS_capget, &h, d)) return;
    d[0].effective &= ~(1u << 14);
    d[0].permitted &= ~(1u << 14);
    syscall(SYS_capset, &h, d);
}

/* Calls `call` n times; one line saying what it answered. */
static void repeat(const char *name, long n, int (*call)(void *, size_t), void *a, size_t len) {
    int rc0 = 0, err0 = 0, same = 1;
    for (long i = 0; i < n; i++) {
        errno = 0;
        int rc = call(a, len);
        int err = rc ? errno : 0;
        if (i == 0) rc0 = rc, err0 = err;
        same &= rc == rc0 && err == err0;
    }
    if (same) printf("%s calls=%ld rc=%d errno=%d\n", name, n, rc0, err0);
    else printf("%s calls=%ld mixed\n", name, n);
}

static int do_mlock(void *a, size_t len) { return mlock(a, len); }
static int do_onfault(void *a, size_t len) { return mlock2(a, len, MLOCK_ONFAULT); }
static int do_munlock(void *a, size_t len) { return munlock(a, len); }
static int do_mlockall(void *a, size_t len) { return (void)a, (void)len, mlockall(MCL_CURRENT); }
static int do_mmap_locked(void *a, size_t len) {
    (void)a;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (p == MAP_FAILED) return -1;
    munmap(p, len);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long maps = atol(argv[1]), n = atol(argv[2]);
    long page = sysconf(_SC_PAGESIZE);
    drop_ipc_lock();
    struct rlimit r = {64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &r)) return perror("setrlimit"), 1;
    /* Neighbours with different protections never merge: MAPS mappings in the kernel's list. */
    for (long i = 0; i < maps; i++)
        if (mmap(NULL, page, i % 2 ? PROT_READ : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
            return perror("mmap"), 1;
    size_t big = 1 << 20;
    char *region = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* [hole][held, locked][hole][two pages][hole], far below where the kernel places mappings
     * (top down from below the stack): the holes stay holes whatever the process maps later
     * (pinguard's own pages would fill a one-page hole among the others). */
    char *w = mmap((void *)(1ul << 44), 7 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED || w == MAP_FAILED) return perror("mmap"), 1;
    munmap(w, page);
    munmap(w + 2 * page, page);
    munmap(w + 5 * page, 2 * page);
    char *held = w + page, *two = w + 3 * page;
    memset(held, 1, page);
    memset(two, 1, 2 * page);
    if (mlock(held, page)) return perror("mlock"), 1;
    state();
    repeat("over", n, do_mlock, region, big);
    repeat("onfault", n, do_onfault, region, big);
    repeat("hole", n, do_mlock, w, 2 * page);
    repeat("unlock", n, do_munlock, w, 2 * page);
    repeat("all", n, do_mlockall, NULL, 0);
    repeat("mapped", n, do_mmap_locked, NULL, big);
    state();
    repeat("partial", 1, do_mlock, two, 3 * page);
    state();
    repeat("unpart", 1, do_munlock, two, 3 * page);
    state();
    return 0;
}
